"""An fp32 gradient buffer beside a bf16 model (TrainConfig.fp32_grads): Megatron-LM's bf16 keeps its gradients in fp32
main_grad buffers, 2 + 4 + 12 = 18 bytes per parameter with Adam (costmodel.price.memory), which benchmarks.published
prices its Megatron-LM rows with. Gradients in the parameters' dtype stay the default."""
import pytest

from partita.costmodel.price.memory import state_bytes
from partita.planner.api import plan_search
from partita.planner.enumerate.space import TrainConfig

LLAMA3_8B = 8_030_261_248


def test_state_bytes_per_parameter():
    mixed, megatron = state_bytes("bf16"), state_bytes("bf16", fp32_grads=True)
    assert (megatron.param, megatron.grad, megatron.optimizer, megatron.total) == (2, 4, 12, 18)
    assert megatron.step_traffic == mixed.step_traffic + 2  # the step reads 4 bytes of gradient, not 2
    assert megatron.grad_comm == mixed.grad_comm == 4       # reduced in fp32 either way
    # fp32 parameters already have fp32 gradients; pure bf16 keeps bf16 ones
    assert state_bytes("bf16", autocast=True, fp32_grads=True) == state_bytes("bf16", autocast=True)
    assert state_bytes("bf16", master_weights="none", fp32_grads=True) == state_bytes("bf16", master_weights="none")


def test_a_distributed_optimizer_holds_2_more_bytes_of_gradient_per_parameter():
    """ZeRO-1 on a bf16 model (autocast off, as a published Megatron run is priced): every rank keeps its stage's
    whole gradient buffer, so the stages' model states grow by exactly 2 bytes per parameter."""
    plans = {}
    for fp32 in (False, True):
        _, plans[fp32] = plan_search("llama3-8b", cluster="8xH200-141GB", train=TrainConfig(
            global_batch=8, seq_len=2048, dtype="bf16", autocast=False, fp32_grads=fp32), dp=4, pp=2, tp=1, zero=1,
            recompute="full", offload=False, micro_batch=1)
    states = {k: sum(m["model_states"] for m in p.predicted["memory_per_stage"]) for k, p in plans.items()}
    assert states[True] - states[False] == pytest.approx(2 * LLAMA3_8B, rel=1e-9)
    assert plans[True].predicted["breakdown"]["optimizer_s"] > plans[False].predicted["breakdown"]["optimizer_s"]

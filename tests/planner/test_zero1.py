"""ZeRO-1 (optimizer state sharded over the data-parallel ranks) is priced, searched where partita's runtime
runs it (torch's ZeroRedundancyOptimizer, runtime/parallel/zero1.py), and exported as Megatron's distributed
optimizer. The runs themselves: tests/e2e/test_zero1_runs.py."""
import pytest
import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.testing._internal.distributed.fake_pg import FakeStore

from partita.costmodel import resolve_model
from partita.costmodel.errors import InfeasibleError
from partita.planner.api import plan
from partita.cli import main
from partita.export import to_megatron
from partita.planner.enumerate.space import SearchSpace, TrainConfig

GPT_1B = "gpt:layers=24,hidden=2048,heads=16,seq=1024,vocab=51200"
GPT_3B = "gpt:layers=32,hidden=2560,heads=32,seq=1024,vocab=51200"
ONE_STAGE = dict(tp=1, pp=1, micro_batch=1, offload=False, recompute=("full",))


def _busiest_rank_elements(model: str, ranks: int) -> int:
    """Parameters the busiest of `ranks` ranks steps under torch's own ZeroRedundancyOptimizer partition
    (a fake process group: no communication; the model on the meta device)."""
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ranks)
    try:
        with torch.device("meta"):
            params = list(resolve_model(model).build().parameters())
        opt = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=1e-3)
        return max(sum(p.numel() for g in rank for p in g["params"]) for rank in opt._partition_parameters())
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("stack,autocast", [("pytorch", True), ("te-2024", False)])
def test_zero1_model_states_match_the_zero_paper_and_its_step_shares_the_parameters(stack, autocast):
    """REFERENCE.md (Rajbhandari et al. SC'20): mixed-precision Adam under ZeRO-1 holds 4 Psi + 12 Psi / N_d
    bytes per GPU -- exactly under Megatron's distributed optimizer (a bf16 model, TrainConfig.autocast
    False), which shards a flat buffer. partita's runtime trains bf16 under torch.autocast over fp32
    parameters, which are the master weights: 4 Psi of parameters and 4 Psi of fp32 gradients stay on every
    rank, and only Adam's two moments (8 bytes) are sharded -- by torch's ZeroRedundancyOptimizer, which
    hands out whole tensors, so its busiest rank steps more than Psi / N_d. After the step each rank's
    updated parameters reach the others: torch broadcasts them (exposed ZeRO traffic); Megatron all-gathers
    them in place of the all-reduce's second half."""
    p = plan(GPT_1B, cluster="8xA100-40GB", train=TrainConfig(global_batch=256, autocast=autocast),
             space=SearchSpace(zero=1, stack=stack, **ONE_STAGE))
    psi, n_d = p.model["parameters"], p.mesh.dp
    assert p.zero_stage == 1 and n_d == 8
    torch_zero = stack == "pytorch"
    stepped = _busiest_rank_elements(GPT_1B, n_d) if torch_zero else psi / n_d
    assert stepped >= psi / n_d
    states = 8 * psi + 8 * stepped if autocast else 4 * psi + 12 * stepped
    assert p.predicted["memory_per_stage"][0]["model_states"] == pytest.approx(states, rel=1e-9)
    assert (p.predicted["breakdown"]["zero_comm_s"] > 0) == torch_zero


def test_the_default_search_chooses_zero1_where_it_runs_and_megatron_gets_the_distributed_optimizer(tmp_path):
    """A 2.7B GPT on 8 x A100-40GB: Adam's states do not fit replicated (16 Psi = 43 GB); ZeRO-1 fits and,
    with 32 micro-batches per step, beats ZeRO-2 and 3, which gather and reduce-scatter every micro-batch.
    Before ZeRO-1 was searched, the search returned ZeRO-2."""
    with pytest.raises(InfeasibleError, match=r"shard the optimizer state \(--zero 1\)"):
        plan(GPT_3B, cluster="8xA100-40GB", train=TrainConfig(global_batch=256), space=SearchSpace(zero=0, **ONE_STAGE))
    p = plan(GPT_3B, cluster="8xA100-40GB", train=TrainConfig(global_batch=256), space=SearchSpace(**ONE_STAGE))
    assert p.zero_stage == 1 and "not_executed" not in p.solver
    fsdp = plan(GPT_3B, cluster="8xA100-40GB", train=TrainConfig(global_batch=256),
                space=SearchSpace(zero=(2, 3), **ONE_STAGE))
    assert p.predicted["step_time_s"] < fsdp.predicted["step_time_s"]
    assert "--use-distributed-optimizer" in to_megatron(p).splitlines()
    # the CLI takes --zero 1
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "tiny-gpt", "--cluster", "2xcpu", "--global-batch", "4", "--zero", "1",
                 "--out", str(out), "--json"]) == 0
    assert '"zero_stage": 1' in out.read_text()

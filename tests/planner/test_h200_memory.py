"""The planner's peak memory for the plans first run on a GPU, against what the GPU measured.

One H200 (torch 2.11, CUDA 13, one rank), a 1.5B Llama (`M1`), bf16, Adam, global batch 8: the peak of
torch.cuda.max_memory_allocated over a run of the plan (GPU-MEASUREMENTS.md in the project's shared notes,
"Whole training steps"). These plans run under autocast (ZeRO-0), which the bf16 model's pricing had 10-11%
low for the eager plans that keep their activations; priced as autocast runs them they are within 2%.
Captured on fake tensors at full size (about 2 s), so the exact configuration is priced.
"""
import pytest

from partita.costmodel.hardware import GiB, parse_cluster
from partita.costmodel.models import resolve_model
from partita.costmodel.capture import capture
from partita.planner.estimate.build import predicted
from partita.planner.search import SearchSpace, TrainConfig, search

M1 = "llama:layers=16,hidden=2048,heads=32,kv_heads=8,ffn=8192,vocab=128256,seq=4096"
MEASURED_GIB = {  # plan (micro-batch, recompute, kernels) -> measured peak allocated, GiB
    (8, "none", "eager"): 129.78,     # the planner's own choice, run with expandable segments
    (2, "none", "eager"): 52.36,
    (8, "full", "eager"): 68.89,
    (8, "none", "compiled"): 105.77,
}


@pytest.fixture(scope="module")
def m1():
    return capture(resolve_model(M1), dtype="bf16", autocast="cuda")


@pytest.mark.parametrize("plan", list(MEASURED_GIB), ids=lambda p: f"mb{p[0]}-{p[1]}-{p[2]}")
def test_predicted_peak_is_the_gpus_within_two_percent(m1, plan):
    micro_batch, recompute, kernels = plan
    space = SearchSpace(pp=(1,), tp=(1,), zero=(0,), recompute=(recompute,), offload=False,
                        micro_batch=(micro_batch,), kernels=kernels)
    result = search(m1, parse_cluster("1xH200-141GB"), TrainConfig(global_batch=8, dtype="bf16"), space=space)
    peak = predicted(result, result.best)["peak_memory_bytes"] / GiB
    assert abs(peak / MEASURED_GIB[plan] - 1) <= 0.02, f"predicted {peak:.2f} GiB, measured {MEASURED_GIB[plan]}"


def test_priced_as_a_bf16_model_the_eager_plans_were_ten_percent_low(m1):
    """What the GPU run showed before the pricing followed autocast (TrainConfig.autocast=False prices the
    bf16 model; at commit 9dda210 it predicted 115.95 GiB for the 129.78 measured)."""
    space = SearchSpace(pp=(1,), tp=(1,), zero=(0,), recompute=("none",), offload=False, micro_batch=(8,))
    result = search(m1, parse_cluster("1xH200-141GB"), TrainConfig(global_batch=8, dtype="bf16", autocast=False),
                    space=space)
    peak = predicted(result, result.best)["peak_memory_bytes"] / GiB
    assert peak / MEASURED_GIB[(8, "none", "eager")] - 1 < -0.09

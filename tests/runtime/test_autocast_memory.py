"""A bf16 plan without FSDP is priced as the runtime's autocast runs it: fp32 master weights, gradients and
moments as model states, and one bf16 copy of every matmul weight among the activations (costmodel.price.memory,
costmodel.capture.trace). Checked against the CPU allocator (runtime.loop.memory.trace_training_step) on one rank, by
category, so that pricing the copies as model states (or the masters as bf16) fails even where the total
happens to agree: before any gradient exists the bf16 model's 2 + 12 bytes per parameter equal the fp32
masters' 4 + 8 plus the 2-byte copy.
"""
import gc

import pytest
import torch.distributed as dist
import torch.nn as nn

from partita.costmodel import model_fingerprint
from partita.costmodel.hardware import parse_cluster
from partita.costmodel.models import resolve_model
from partita.costmodel.capture import capture
from partita.planner.estimate.build import build_plan
from partita.planner.search import SearchSpace, TrainConfig, search
from partita.runtime.launcher.checks import build_meta
from partita.runtime.loop.recipe import build_model
from partita.runtime.loop.session import RunOptions, execute, prepare

MODEL = "tiny-llama"
CASES = {"one micro-batch": (4, 1), "two micro-batches": (2, 2)}  # (micro-batch, micro-batches)


def planned(micro_batch: int, micro_batches: int):
    spec = resolve_model(MODEL)
    graph = capture(spec, dtype="bf16", autocast="cpu")
    space = SearchSpace(pp=(1,), tp=(1,), zero=(0,), recompute=("none",), offload=False, micro_batch=(micro_batch,))
    train = TrainConfig(global_batch=micro_batch * micro_batches, dtype="bf16", schedule="1F1B")
    result = search(graph, parse_cluster("1xcpu"), train, space=space)
    return spec, build_plan(result, spec.name, model_fingerprint(build_meta(spec)), spec.config)


def measured(spec, plan):
    options = RunOptions(steps=2, print_report=False)
    try:
        result, _ = execute(plan, spec, options, prepare(plan, spec, options, 1))
    finally:
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()
    return result.memory_detail


@pytest.fixture(scope="module", params=list(CASES))
def run(request):
    spec, plan = planned(*CASES[request.param])
    return request.param, spec, plan, measured(spec, plan)


def test_model_states_are_fp32_masters_gradients_and_moments(run):
    case, spec, plan, detail = run
    model = build_model(spec, seed=0)
    numel = sum(p.numel() for p in model.parameters())
    row = plan.predicted["memory_per_stage"][0]
    grads = detail["at_peak"].get("gradients", 0)
    # resident before the step: fp32 parameters and Adam's two fp32 moments (and a 4-byte step count each),
    # and the model's buffers
    buffers = sum(b.nbytes for b in model.buffers())
    assert detail["resident_bytes"] == 12 * numel + 4 * len(list(model.parameters())) + buffers
    if case == "one micro-batch":  # the peak comes before any gradient: 4 + 8 bytes per parameter
        assert grads == 0 and row["model_states"] == 12 * numel
    else:  # the second micro-batch peaks with the first's fp32 gradients held: 4 + 4 + 8
        assert grads == 4 * numel and row["model_states"] == 16 * numel
    assert abs(row["model_states"] - (detail["resident_bytes"] + grads)) <= 0.01 * row["model_states"]


def test_activations_include_one_bf16_copy_of_each_matmul_weight(run):
    case, spec, plan, detail = run
    model = build_model(spec, seed=0)
    copies = sum(2 * m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    row = plan.predicted["memory_per_stage"][0]
    forward = detail["at_peak"]["forward"]  # what the forward allocated and the peak still holds
    assert abs(row["activations"] - forward) <= 0.02 * forward
    assert copies > 0.04 * forward  # leaving the copies out would miss by more than the tolerance
    assert abs(plan.predicted["peak_memory_bytes"] / detail["peak_bytes"] - 1) <= 0.05


def test_autocasts_cache_holds_every_weight_cast_to_the_forwards_end():
    """Under full recompute no cast is saved, but autocast caches one per weight for the whole forward of a
    micro-batch (planner.estimate.phases): with weights far larger than the activations, the step peaks at the end of
    the second micro-batch's forward, the first's gradients held, every cast live."""
    spec = resolve_model("gpt:layers=4,hidden=512,heads=8,vocab=64,seq=16")
    graph = capture(spec, dtype="bf16", autocast="cpu")
    space = SearchSpace(pp=(1,), tp=(1,), zero=(0,), recompute=("full",), offload=False, micro_batch=(1,))
    result = search(graph, parse_cluster("1xcpu"), TrainConfig(global_batch=2, dtype="bf16"), space=space)
    plan = build_plan(result, spec.name, model_fingerprint(build_meta(spec)), spec.config)
    row = plan.predicted["memory_per_stage"][0]
    detail = measured(spec, plan)
    model = build_model(spec, seed=0)
    casts = sum(2 * m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    assert row["phase"] == "forward end (autocast's weight casts)" and row["activations"] >= casts
    assert detail["peak_grad_fn"] == "" and detail["at_peak"]["gradients"] > 0  # in a forward, gradients held
    assert abs(plan.predicted["peak_memory_bytes"] / detail["peak_bytes"] - 1) <= 0.02
    assert casts > 0.05 * detail["peak_bytes"]  # leaving the cache out would miss by more than the tolerance

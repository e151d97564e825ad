"""The CPU allocator trace (runtime.loop.memory.AllocatorTrace) is exact, and the runtime reports its peak.

Exactness is checked against allocations whose size is known: `torch.empty` of N bytes is N bytes (no
rounding, whatever N), nothing is counted for an empty tensor, frees are matched to their allocations
by address, blocks that existed before the trace are never counted (their frees neither), and the order
of events is the allocator's own. The session's figure (one extra traced step after the run) is checked
for what it is made of, and for what it must not change: the timed steps never run under the profiler,
the losses and trained parameters are those of a run without it, and the tracked figure stays available.
"""
import gc

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from partita.costmodel import resolve_model
from partita.planner.plan import Plan
from partita.runtime.parallel import apply as runtime_apply
from partita.runtime.loop.memory import (ALLOCATOR_METHOD, CPU_METHOD, AllocatorTrace, MemoryEvent, _ordered,
                            measure_live_bytes)
from partita.runtime.loop.recipe import build_model
from partita.runtime.loop.session import RunOptions, execute, prepare
from tests.conftest import captured
from tests.costmodel.test_saved_bytes_by_recompute import predicted_saved_bytes
from tests.e2e.test_plans_match_single_process import make_plan

SIZES = [1, 3, 63, 64, 65, 1000, 4097, 1 << 20, 10_000_019]


@pytest.mark.parametrize("nbytes", SIZES)
def test_an_allocation_of_n_bytes_counts_n_bytes(nbytes):
    live = measure_live_bytes(lambda: torch.empty(nbytes, dtype=torch.uint8))
    assert live.after == live.peak == nbytes == live.result.untyped_storage().nbytes()
    (event,) = live.trace.events
    assert event.nbytes == nbytes and event.ptr == live.result.data_ptr() and event.op == "aten::empty"


def test_dtypes_and_shapes_count_their_storage_bytes():
    def make():
        return [torch.zeros(3, 5, dtype=torch.float64), torch.ones(7, dtype=torch.bfloat16),
                torch.arange(11), torch.empty(0), torch.empty(4, 0, 2)]
    live = measure_live_bytes(make)
    assert live.after == 3 * 5 * 8 + 7 * 2 + 11 * 8  # empty tensors allocate nothing
    assert len(live.trace.events) == 3


def test_frees_are_matched_by_address_and_the_peak_is_the_most_live_at_once():
    x = torch.randn(50, 50)

    def work():
        a = torch.empty(1000, dtype=torch.uint8)
        b = x @ x                           # 10,000 bytes, kept
        del a                               # 1,000 freed: 11,000 was the peak so far
        c = torch.empty(9000, dtype=torch.uint8)
        del c                               # 19,000 at once
        return b
    live = measure_live_bytes(work)
    assert live.after == 10_000 and live.peak == 19_000
    assert [e.nbytes for e in live.trace.events] == [1000, 10_000, -1000, 9000, -9000]
    assert live.trace.peak_event.nbytes == 9000 and live.trace.in_order
    assert [e.ptr for e in live.trace.live_at()] == [live.result.data_ptr()]


def test_blocks_allocated_before_the_trace_are_not_counted():
    before = torch.empty(5000, dtype=torch.uint8)

    def work():
        nonlocal before
        before = None  # freed inside the window: not a negative count
        return torch.empty(10, dtype=torch.uint8)
    live = measure_live_bytes(work)
    assert live.after == live.peak == 10
    # a block allocated in one trace and freed in the next is reported, and kept apart
    with AllocatorTrace():
        first = torch.empty(300, dtype=torch.uint8)
    with AllocatorTrace() as second:
        del first
    assert second.end_bytes == second.peak_bytes == 0 and second.foreign_free_bytes == 300


def test_phases_and_the_autograd_node_of_each_allocation():
    w = nn.Parameter(torch.randn(16, 16))
    with AllocatorTrace() as trace:
        with trace.phase("forward"):
            loss = (torch.randn(4, 16) @ w).relu().sum()
        with trace.phase("backward"):
            loss.backward()
    forward = [e for e in trace.events if e.phase == "forward" and e.nbytes > 0]
    backward = [e for e in trace.events if e.phase == "backward" and e.nbytes > 0]
    assert forward and all(not e.grad_fn for e in forward)
    assert {"ReluBackward0", "MmBackward0"} <= {e.grad_fn for e in backward}
    grad = [e for e in trace.live_at() if e.ptr == w.grad.data_ptr()]
    assert len(grad) == 1 and grad[0].nbytes == 16 * 16 * 4 and grad[0].grad_fn == "MmBackward0"
    assert trace.peak_by_phase()["backward"] >= trace.peak_by_phase()["forward"] > 0


def test_a_block_freed_without_a_report_stops_counting_when_its_address_is_reused():
    """Frees on threads the profiler does not watch are not reported; an allocation at a live block's
    address proves that block was freed."""
    def ev(ptr, nbytes, total):
        return MemoryEvent(ptr=ptr, nbytes=nbytes, op="", phase="", grad_fn="", total=total)
    trace = AllocatorTrace()
    trace.events = [ev(1, 100, 100), ev(2, 30, 130), ev(1, 50, 180), ev(2, -30, 150)]
    trace._replay()
    assert trace.unreported_free_bytes == 100 and trace.end_bytes == 50 and trace.peak_bytes == 130
    assert sum(e.nbytes for e in trace.live_at()) == trace.end_bytes


def test_events_are_put_in_the_allocators_order_when_timestamps_tie():
    def ev(ptr, nbytes, total):
        return MemoryEvent(ptr=ptr, nbytes=nbytes, op="", phase="", grad_fn="", total=total)
    true = [ev(1, 100, 100), ev(2, 50, 150), ev(1, -100, 50), ev(3, 70, 120)]
    timed = [(0, true[0]), (5, true[2]), (5, true[1]), (9, true[3])]  # a free seen before the allocation
    events, certain = _ordered(timed)
    assert events == true and certain
    _, certain = _ordered([(0, true[0]), (1, true[3])])  # a gap: the order cannot be certain
    assert not certain


# -- the session -----------------------------------------------------------------------------------------

GPT = resolve_model("tiny-gpt")
MICRO_BATCH = 8


def session(plan: dict, steps: int, **options):
    prep = prepare(Plan.from_dict(plan), GPT, RunOptions(steps=steps, print_report=False, **options), 1)
    try:
        result, _ = execute(Plan.from_dict(plan), GPT, RunOptions(steps=steps, print_report=False, **options), prep)
    finally:
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()
    return result


@pytest.fixture(scope="module")
def runs():
    """tiny-gpt, 3 steps on one rank, with and without the allocator trace; records, for every call of the
    executor's step, whether the profiler was on."""
    plan = make_plan("tiny-gpt", mb=MICRO_BATCH)
    calls = []
    real = runtime_apply.LocalExecutor.step

    def step(self, batch):
        calls.append(torch.autograd._profiler_enabled())
        return real(self, batch)
    runtime_apply.LocalExecutor.step = step
    try:
        traced = session(plan, 3)
        traced_calls = list(calls)
        plain = session(plan, 3, memory_trace=False)
    finally:
        runtime_apply.LocalExecutor.step = real
    return traced, plain, traced_calls


def test_timed_steps_never_run_under_the_profiler_and_results_do_not_change(runs):
    traced, plain, calls = runs
    assert calls == [False, False, False, True]  # the three timed steps, then the traced extra one
    assert len(traced.step_times) == 3
    assert traced.losses == plain.losses
    assert traced.param_checksum == plain.param_checksum


def test_the_session_reports_the_allocator_peak_and_keeps_the_tracked_figure(runs):
    traced, plain, _ = runs
    assert traced.memory_method == ALLOCATOR_METHOD and plain.memory_method == CPU_METHOD
    assert traced.tracked_memory_bytes == plain.peak_memory_bytes == plain.tracked_memory_bytes
    assert plain.memory_detail is None
    d = traced.memory_detail
    assert traced.peak_memory_bytes == d["peak_bytes"] == d["resident_bytes"] + d["step_peak_bytes"]
    loss_bytes = torch.zeros(()).nbytes
    assert d["in_order"] and d["unreported_free_bytes"] in (0, loss_bytes)  # see step_end_bytes below
    assert sum(d["at_peak"].values()) == d["step_peak_bytes"]
    model = build_model(GPT, 0)
    params = [p for p in model.parameters()]
    param_bytes = sum(p.nbytes for p in params)
    # before the step: parameters and AdamW's two moments (each step count a 4-byte tensor)
    assert d["resident_bytes"] == 3 * param_bytes + 4 * len(params)
    # what the step leaves: the gradients -- and at times the 4-byte loss, when gloo's worker thread drops
    # the last reference to the all-reduced loss (a free the profiler does not see: runtime/loop/memory.py)
    assert d["step_end_bytes"] in (param_bytes, param_bytes + loss_bytes)
    assert d["by_phase"]["optimizer"] > param_bytes  # gradients + the optimizer's temporaries
    # the peak is in the backward pass, with every saved activation of the forward still live: the
    # planner's activation bytes for this micro-batch (the batch itself is made in phase "data")
    assert d["peak_phase"] == "step" and d["peak_grad_fn"]
    activations = predicted_saved_bytes(captured("tiny-gpt"), "none", MICRO_BATCH)
    assert abs(d["at_peak"]["forward"] - activations) <= 0.02 * activations


def test_the_planners_peak_is_the_allocators_within_five_percent(runs):
    """The planner's predicted peak (planner.search.memory_phases: model states less the gradients not
    yet made, the activations, the logits and their gradient) against the allocator's, for the same
    one-process plan."""
    from partita.costmodel.hardware import parse_cluster
    from partita.planner.estimate.build import predicted
    from partita.planner.search import SearchSpace, TrainConfig, search
    traced, _, _ = runs
    space = SearchSpace(pp=(1,), tp=(1,), zero=(0,), recompute=("none",), offload=False)
    result = search(captured("tiny-gpt"), parse_cluster("1xcpu"),
                    TrainConfig(global_batch=MICRO_BATCH, dtype="fp32", max_micro_batch=MICRO_BATCH), space=space)
    assert result.best.micro_batch == MICRO_BATCH
    pred = predicted(result, result.best)
    # both peak in the forward/backward (not the optimizer step)
    assert pred["memory_per_stage"][0]["phase"] == "forward/backward" and traced.memory_detail["peak_phase"] == "step"
    assert abs(pred["peak_memory_bytes"] / traced.peak_memory_bytes - 1) <= 0.05

"""Memory a rank holds during training, as far as it can be measured.

On GPU: `torch.cuda.max_memory_allocated`. On CPU there is no allocator counter; two figures exist:

- *allocator* (`AllocatorTrace`, `measure_live_bytes`, `trace_training_step`): every allocation and free of
  PyTorch's CPU allocator, with its address and size, as `torch.profiler.profile(profile_memory=True)`
  records them (the allocator reports each block it hands out to the profiler: c10's
  ProfiledCPUMemoryReporter). Replayed in order, they give the bytes live at every moment. Exact at
  the allocator's level: a block's size is the bytes requested (a storage's `nbytes()`; `torch.empty`
  of N bytes is N bytes, no rounding: c10's CPU allocator aligns blocks to 64 bytes but reports the
  request), checked by tests/runtime/test_allocator_memory.py. What malloc itself adds (headers,
  alignment padding, fragmentation) and memory outside PyTorch's allocator (the Python heap, gloo's
  own buffers, the torch runtime) are not counted; `peak_rss_bytes` sees those. Blocks allocated
  before the trace started are invisible to it: their frees are not reported (the allocator does not
  know their size), so a trace counts what is allocated *inside* its window. The profiler watches the
  thread that started it (and the threads autograd runs the backward on): a block freed on another
  thread -- gloo's worker threads at times drop the last reference to a collective's buffers (tensor
  parallelism, FSDP, gradients averaged by hand, the loss all-reduce) -- is freed without a report; it counts as live until its address is handed out again
  (`unreported_free_bytes`), so with such frees the figure is an upper bound.
  The runtime's figure on CPU (`trace_training_step`, run by runtime/loop/session.py as one extra step after
  the timed ones) is the bytes resident before a step -- parameters, buffers and optimizer state,
  counted from their storages, and DDP's gradient buckets -- plus the traced peak of the step (forward,
  backward, loss all-reduce, optimizer step), with a breakdown of what is live at that peak.
- *tracked* (`SavedActivations` + `state_bytes`, the figure before the allocator trace existed): bytes of
  this rank's parameters + gradients + optimizer state (local shards) plus the peak of live
  saved-for-backward tensors seen by `saved_tensors_hooks` (deduplicated by storage; parameters, and
  FSDP's gathered parameters and their views, excluded). It leaves out temporaries that autograd does
  not save, communication buffers, and what a block hands to its own hooks instead (checkpointed blocks
  keep their tensors out of sight; offloaded ones keep them in host memory).
"""
from __future__ import annotations

import contextlib
import os
import resource
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
import torch.nn as nn

CPU_METHOD = "tracked: parameters + gradients + optimizer state + peak live saved activations"
GPU_METHOD = "torch.cuda.max_memory_allocated"
ALLOCATOR_METHOD = ("allocator: bytes of PyTorch's CPU allocator (torch.profiler memory events) over one "
                    "extra traced training step, plus the parameters, buffers and optimizer state live "
                    "before it")
PHASE = "partita.phase:"


def local(t: torch.Tensor) -> torch.Tensor:
    """`t`, or the local shard of a DTensor. torch.distributed.tensor is not imported here (a second of
    start-up for the launcher, which imports this module through runtime.loop.progress): before it is
    imported, no DTensor exists."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return t._local_tensor if dtensor is not None and isinstance(t, dtensor.DTensor) else t


def _storage(t: torch.Tensor) -> tuple[int, int]:
    s = local(t).untyped_storage()
    return s.data_ptr(), s.nbytes()


def state_bytes(params: Iterable[torch.Tensor], optimizer: torch.optim.Optimizer) -> int:
    """Bytes of parameters, their gradients and the optimizer state held by this rank."""
    total = 0
    for p in params:
        total += local(p).nbytes + (local(p.grad).nbytes if p.grad is not None else 0)
    for state in optimizer.state.values():
        total += sum(local(v).nbytes for v in state.values() if isinstance(v, torch.Tensor))
    return total


class SavedActivations:
    """Context manager counting live bytes of tensors autograd saves for backward; keeps the peak."""

    def __init__(self, params: Iterable[torch.Tensor]):
        self.exclude = {_storage(p)[0] for p in params}
        self.refs: dict[int, int] = defaultdict(int)
        self.live = 0
        self.peak = 0
        self._hooks = None

    def _pack(self, t):
        if isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter):
            return t, None
        try:
            ptr, nbytes = _storage(t)
        except (RuntimeError, NotImplementedError):  # a tensor without storage: not counted
            return t, None
        if ptr in self.exclude or ptr == 0:
            return t, None
        if self.refs[ptr] == 0:
            self.live += nbytes
            self.peak = max(self.peak, self.live)
        self.refs[ptr] += 1
        return t, (ptr, nbytes)

    def _unpack(self, packed):
        t, key = packed
        if key is not None and self.refs.get(key[0], 0) > 0:
            self.refs[key[0]] -= 1
            if self.refs[key[0]] == 0:
                self.live -= key[1]
                del self.refs[key[0]]
        return t

    def __enter__(self):
        self.refs.clear()
        self.live = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)


@dataclass(frozen=True)
class MemoryEvent:
    """One allocation (`nbytes` > 0) or free (`nbytes` < 0) of the CPU allocator, in the order they happened."""

    ptr: int
    nbytes: int
    op: str
    """The innermost operator (or profiler range) it happened in; "" outside every one."""
    phase: str
    """The innermost `AllocatorTrace.phase` it happened in; "" outside every phase."""
    grad_fn: str
    """In the backward pass: the autograd node being evaluated ("MmBackward0"); "" elsewhere."""
    total: int
    """The allocator's running count of profiled bytes after this event (orders events; see `_ordered`)."""


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 to /dev/null for the block (C++ writes that Python's sys.stderr cannot catch)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class AllocatorTrace:
    """Context manager recording every CPU allocation and free while it is active (module docstring).

    After the `with` block: `events` in order, and of the blocks allocated inside the window: `peak_bytes`
    (the most live at once), `peak_index` (the event that reached it), `end_bytes` (still live at the end),
    `foreign_free_bytes` (frees the profiler reported for blocks allocated before the window: not
    counted in the live bytes; blocks the allocator had never seen are freed without any report at all),
    `unreported_free_bytes` (blocks of the window freed on a thread the profiler does not watch, found
    when their address is allocated again: each counts as live until then).
    `phase(name)` marks a range (forward, backward, ...) that events are attributed to.
    """

    def __init__(self):
        self.events: list[MemoryEvent] = []
        self.peak_bytes = self.end_bytes = self.foreign_free_bytes = self.unreported_free_bytes = 0
        self.peak_index = -1
        self.in_order = True
        self._profiler = None

    @staticmethod
    def phase(name: str):
        return torch.profiler.record_function(PHASE + name)

    def __enter__(self) -> "AllocatorTrace":
        from torch.profiler import ProfilerActivity, profile
        self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        with _quiet_stderr():  # Kineto prints a "profiler_start" line to the process's stderr
            self._profiler.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        with _quiet_stderr():
            self._profiler.__exit__(*exc)
        tree = self._profiler.profiler.kineto_results.experimental_event_tree()
        self._profiler = None
        self.events, self.in_order = _ordered(_allocations(tree))
        self._replay()

    def _replay(self) -> None:
        live: dict[int, int] = {}
        now = 0
        for i, e in enumerate(self.events):
            if e.nbytes > 0:
                if e.ptr in live:  # its block was freed without a report (module docstring)
                    self.unreported_free_bytes += live[e.ptr]
                    now -= live[e.ptr]
                live[e.ptr] = e.nbytes
                now += e.nbytes
            elif e.ptr in live:
                now -= live.pop(e.ptr)
            else:
                self.foreign_free_bytes -= e.nbytes
                continue
            if now > self.peak_bytes:
                self.peak_bytes, self.peak_index = now, i
        self.end_bytes = now

    def live_at(self, index: int | None = None) -> list[MemoryEvent]:
        """The allocations of the window still live after event `index` (default: at the end), oldest first."""
        stop = len(self.events) if index is None else index + 1
        live: dict[int, MemoryEvent] = {}
        for e in self.events[:stop]:
            if e.nbytes > 0:
                live[e.ptr] = e
            else:
                live.pop(e.ptr, None)
        return list(live.values())

    def peak_by_phase(self) -> dict[str, int]:
        """The most bytes (allocated in the window) live at once during each phase (events outside every
        phase are left out)."""
        live: dict[int, int] = {}
        now, out = 0, {}
        for e in self.events:
            if e.nbytes > 0:
                live[e.ptr] = e.nbytes
                now += e.nbytes
            elif e.ptr in live:
                now -= live.pop(e.ptr)
            if e.phase:
                out[e.phase] = max(out.get(e.phase, 0), now)
        return out

    @property
    def peak_event(self) -> MemoryEvent | None:
        return self.events[self.peak_index] if self.peak_index >= 0 else None


def _allocations(roots) -> list[tuple[int, MemoryEvent]]:
    """(time, event) of every CPU allocation event under the profiler's event tree."""
    from torch._C._profiler import _EventType
    out = []
    stack = [(r, "", "", "") for r in roots]
    while stack:
        e, op, phase, grad_fn = stack.pop()
        if e.tag == _EventType.Allocation:
            f = e.extra_fields
            if f.device.type == "cpu" and f.alloc_size:
                out.append((e.start_time_ns, MemoryEvent(ptr=f.ptr, nbytes=f.alloc_size, op=op, phase=phase,
                                                         grad_fn=grad_fn, total=f.total_allocated)))
            continue
        name = e.name
        if name.startswith(PHASE):
            phase = name[len(PHASE):]
        elif name.startswith(_AUTOGRAD_NODE):
            grad_fn = name[len(_AUTOGRAD_NODE):]
        stack.extend((c, name, phase, grad_fn) for c in e.children)
    return out


_AUTOGRAD_NODE = "autograd::engine::evaluate_function: "


def _ordered(timed: list[tuple[int, MemoryEvent]]) -> tuple[list[MemoryEvent], bool]:
    """The events in the order the allocator saw them, and whether that order is certain.

    Timestamps can tie, or disagree by a little with the order in which threads took the allocator's
    lock; the running total the allocator reports with each event cannot: the event after one ending at
    total T is the one with `total - nbytes == T`. Events are sorted by time and then each one is
    chosen, among the next few, as the one continuing the running total.
    """
    events = [e for _, e in sorted(timed, key=lambda te: te[0])]
    ok = True
    for i in range(1, len(events)):
        want = events[i - 1].total
        if events[i].total - events[i].nbytes == want:
            continue
        j = next((j for j in range(i + 1, min(len(events), i + 64))
                  if events[j].total - events[j].nbytes == want), None)
        if j is None:
            ok = False
            continue
        events.insert(i, events.pop(j))
    return events, ok


@dataclass
class LiveBytes:
    """What `measure_live_bytes` saw: bytes allocated while `fn` ran that are still live when it returned
    (`after`), the most live at once (`peak`), and the trace itself."""

    result: Any
    after: int
    peak: int
    trace: AllocatorTrace = field(repr=False)


def measure_live_bytes(fn: Callable[[], Any]) -> LiveBytes:
    """Run `fn()` under an `AllocatorTrace`. Live bytes before it are 0 by construction: only blocks
    allocated inside the window are counted (module docstring)."""
    with AllocatorTrace() as trace:
        result = fn()
    return LiveBytes(result=result, after=trace.end_bytes, peak=trace.peak_bytes, trace=trace)


STEP_PHASES = ("data", "step", "loss", "optimizer")
"""The phases of a traced training step (`trace_training_step`): the batch is made, forward and backward
(the executor's step), the loss is reduced over ranks, the optimizer steps."""


@dataclass
class StepMemory:
    """Allocator-measured memory of one training step on this rank (`trace_training_step`)."""

    resident_bytes: int
    """Live before the step: parameters, buffers and optimizer state (each storage once; local shards) and
    DDP's gradient buckets. Gradients were released (zero_grad(set_to_none=True)) just before it."""
    step_peak_bytes: int
    """The most bytes allocated during the step live at once (`AllocatorTrace.peak_bytes`)."""
    step_end_bytes: int
    """Allocated during the step and still live after it (gradients, the loss, lazily made state)."""
    peak_phase: str
    peak_grad_fn: str
    """The autograd node running when the peak was reached ("" outside the backward pass)."""
    peak_op: str
    at_peak: dict[str, int]
    """The bytes allocated during the step and live at the peak, by kind: "forward" (allocated in the
    forward pass: saved activations, a checkpoint's inputs, activations in flight), "gradients" (of the
    parameters), "backward" (anything else the backward pass allocated: gradients of activations,
    recomputed activations, communication buffers), "optimizer", "other"."""
    by_phase: dict[str, int]
    """The most bytes allocated during the step live at once within each phase."""
    in_order: bool
    unreported_free_bytes: int = 0
    """`AllocatorTrace.unreported_free_bytes`: when positive, frees happened on unwatched threads and the
    step's figures are upper bounds."""
    tracked_bytes: int = 0
    """The tracked figure (CPU_METHOD) of the same run, for comparison."""

    @property
    def peak_bytes(self) -> int:
        return self.resident_bytes + self.step_peak_bytes

    def as_dict(self) -> dict:
        return {"peak_bytes": self.peak_bytes, "resident_bytes": self.resident_bytes,
                "step_peak_bytes": self.step_peak_bytes, "step_end_bytes": self.step_end_bytes,
                "peak_phase": self.peak_phase, "peak_grad_fn": self.peak_grad_fn, "peak_op": self.peak_op,
                "at_peak": dict(self.at_peak), "by_phase": dict(self.by_phase), "in_order": self.in_order,
                "unreported_free_bytes": self.unreported_free_bytes, "tracked_bytes": self.tracked_bytes}


def _kind(e: MemoryEvent) -> str:
    """"forward", "backward", "optimizer" or "other" (StepMemory.at_peak; gradients are told apart by address)."""
    if e.phase == "optimizer":
        return "optimizer"
    if e.phase != "step":
        return "other"
    return "backward" if e.grad_fn else "forward"


def trace_training_step(run_step: Callable[["AllocatorTrace"], None], params: list[torch.Tensor],
                        optimizer: torch.optim.Optimizer, modules: Iterable[nn.Module] = (),
                        extra_resident: int = 0) -> StepMemory:
    """Release the gradients, count what is resident, and run `run_step(trace)` under an AllocatorTrace;
    `run_step` marks its phases with `trace.phase(name)` (STEP_PHASES)."""
    optimizer.zero_grad(set_to_none=True)
    state = [v for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    buffers = [b for m in modules for b in m.buffers()]
    resident = resident_bytes([*params, *buffers, *state]) + extra_resident
    with AllocatorTrace() as trace:
        run_step(trace)
    end = trace.live_at()
    grad_ptrs = {local(p.grad).untyped_storage().data_ptr() for p in params if p.grad is not None}
    grads = {id(e) for e in end if e.ptr in grad_ptrs}
    at_peak: dict[str, int] = defaultdict(int)
    for e in trace.live_at(trace.peak_index) if trace.peak_index >= 0 else []:
        at_peak["gradients" if id(e) in grads else _kind(e)] += e.nbytes
    peak = trace.peak_event
    return StepMemory(resident_bytes=resident, step_peak_bytes=trace.peak_bytes, step_end_bytes=trace.end_bytes,
                      peak_phase=peak.phase if peak else "", peak_grad_fn=peak.grad_fn if peak else "",
                      peak_op=peak.op if peak else "", at_peak=dict(at_peak), by_phase=trace.peak_by_phase(),
                      in_order=trace.in_order, unreported_free_bytes=trace.unreported_free_bytes)


def resident_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (local shards of DTensors; each storage once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            s = local(t).untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    seen.pop(0, None)
    return sum(seen.values())


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (Linux reports KiB); includes the torch runtime itself."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

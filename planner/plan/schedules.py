"""Pipeline schedules: one record per schedule, the only place a schedule's facts are stated.

A record (`PipelineSchedule`) holds what every layer reads of a schedule:
- its plan-file name and torch.distributed.pipelining's class for it (a string: the runtime resolves it,
  runtime/parallel/pp/; torchtitan takes the same names, partita/export);
- whether it runs several model chunks per pipeline rank (`virtual`: the plan's virtual_stages > 1);
- `in_flight(m, pp, v)`: per pipeline rank, the micro-batches whose activations it holds at its peak (the k_s
  of the MILP's memory constraint, planner/solve/milp.py), in whole micro-batches (a chunk is 1/v of one);
- the step-time terms the candidate cost uses: `bubble_s`, the fill and drain of one step, and
  `lower_bound_factor`, what bounds the step from below (planner/enumerate/candidates.py);
- `refusal(m, pp, v, layers)`: one line saying why the schedule cannot run m micro-batches over pp stages
  with v chunks each, or None -- what plan validation, the search space and the runtime all say;
- `order(pp, m, rank, v)`: the passes rank `rank` runs, in order, as (kind "F" | "B", micro-batch, chunk):
  what partita/report/viz.py replays for the Gantt plot, the order torch's class runs;
- `searched(m, pp)`: whether --schedule auto tries it for m micro-batches over pp stages (within its refusal).
`SCHEDULES` is the registry every other place reads (the CLI's --schedule choices, the search space's
"auto" set, the runtime's class map); `schedule(name)` looks one up. Adding a schedule is adding a record.

Fewer micro-batches than stages (m < pp, e.g. a 2-stage pipeline fed one micro-batch per step) is legal and
pays its bubble: under "auto" such a step runs GPipe, the one-chunk schedule torch runs with m < pp
(`_only_where_1f1b_cannot`); an explicit 1F1B keeps its refusal (torch's Schedule1F1B raises).

Step time (Narayanan et al. SC'21): with per-micro-batch stage times tau_s the slowest stage paces the
m - 1 steady micro-batches and every stage's time is paid once in fill and drain; running v chunks per rank
shrinks fill and drain v-fold: step = m max tau + (sum tau - max tau) / v. Every schedule here has that
critical path (partita/report/viz.py's simulator checks it, tests/planner/test_schedules.py), for any m >= 1:
with m < pp too the last micro-batch's forward crosses every stage after the first m - 1 have left stage 0,
and its backward crosses them again, so equal stages tau take (m + pp - 1) tau, a bubble of (pp - 1) tau.
"""
from __future__ import annotations

import functools

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from partita.planner.plan.errors import PlanError

Pass = tuple[str, int, int]
"""One pass of a rank's order: ("F" or "B", micro-batch, chunk)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineSchedule:
    """A pipeline schedule's facts (module docstring)."""

    name: str
    """The name in a plan file, the CLI and torchtitan's --parallelism.pipeline_parallel_schedule."""
    torch_class: str
    """torch.distributed.pipelining's class running it (resolved by runtime/parallel/pp/)."""
    virtual: bool
    """Runs several model chunks per pipeline rank (virtual_stages > 1); False: exactly one."""
    searched_fn: Callable[[int, int], bool]
    """(m, pp) -> whether the search tries it under --schedule auto (`searched`)."""
    megatron_gap: str | None
    """Why Megatron-LM has no equivalent (a note in `partita export --to megatron`); None: it runs it."""
    in_flight_fn: Callable[[int, int, int], np.ndarray]
    refusal_fn: Callable[[int, int, int], str | None]
    order_fn: Callable[[int, int, int, int], list[Pass]]
    warmup_fn: Callable[[int, int, int], int] | None
    """(pp, rank, v) -> the forwards rank runs before its first backward while micro-batches last (the order's
    warm-up, `_steady`); None: every micro-batch is forwarded first (GPipe)."""

    def in_flight(self, m: int, pp: int, v: int = 1) -> np.ndarray:
        """Per pipeline rank, the micro-batches whose activations it holds at its peak (floats: a chunk is 1/v)."""
        return np.asarray(self.in_flight_fn(m, pp, v), dtype=float)

    def edge_in_flight(self, m: int, pp: int, v: int = 1) -> tuple[float, float]:
        """Micro-batches held, at its rank's peak, by the one chunk at each end of the pipeline: rank 0's first
        chunk (the embeddings) and rank pp - 1's last (the head, its logits and the loss), read from the
        order each rank runs (`_chunk_at_peak`). With one chunk per rank these are in_flight's first and last
        entries. Interleaved, in_flight averages a rank's chunks, (warm-up + 1) / v, where the ends differ:
        rank pp - 1 runs its last chunk's forward and backward back to back (one micro-batch of the head
        held, not the average), and rank 0 has forwarded its first chunk the most."""
        return _edge_in_flight(self.name, m, pp, v)

    def bubble_s(self, stage_times: Sequence[float], v: int = 1) -> float:
        """Fill and drain of one step given each stage's seconds per micro-batch (module docstring)."""
        tau = np.asarray(stage_times, dtype=float)
        return float(tau.sum() - tau.max()) / v

    def pipeline_s(self, m: int, stage_times: Sequence[float], v: int = 1) -> float:
        """The pipeline part of a step (no flush): m max tau + the bubble; the MILP's objective less d_max."""
        return m * float(np.max(stage_times)) + self.bubble_s(stage_times, v)

    def lower_bound_factor(self, m: int, pp: int, v: int = 1) -> float:
        """x with pipeline_s >= x sum tau for any stage times (max tau >= the mean): (m - 1/v) / pp + 1/v.
        It holds for every m >= 1, m < pp included: pipeline_s = (m - 1/v) max tau + sum tau / v, and
        m - 1/v >= 0 lets max tau >= sum tau / pp bound it (with m = v = 1 it is sum tau, exactly)."""
        return (m - 1 / v) / pp + 1 / v

    def searched(self, m: int, pp: int) -> bool:
        """Whether --schedule auto tries this schedule for m micro-batches over pp stages; the search then
        also asks its `refusal` (and tries it with each number of chunks it allows)."""
        return self.searched_fn(m, pp)

    def refusal(self, m: int, pp: int, v: int = 1, layers: int | None = None) -> str | None:
        """None when the schedule runs m micro-batches over pp stages with v chunks each (and, given the
        model's repeated `layers`, a layer for every chunk); else one line saying why not."""
        if why := self.refusal_fn(m, pp, v):
            return why
        if self.virtual and layers is not None and layers < pp * v:
            return (f"interleaving {v} model chunks per device over pp={pp} stages needs at least {pp * v} "
                    f"layers; the model has {layers}")
        return None

    def order(self, pp: int, m: int, rank: int, v: int = 1) -> list[Pass]:
        """The passes pipeline rank `rank` runs, in order (module docstring)."""
        if not 0 <= rank < pp:
            raise ValueError(f"rank {rank} outside 0..{pp - 1}")
        return self.order_fn(pp, m, rank, v)


# ---- orders ---------------------------------------------------------------------------------------

def _steady(fwd: list[tuple[int, int]], bwd: list[tuple[int, int]], warmup: int) -> list[Pass]:
    """`warmup` forwards, then one forward and one backward at a time, then the remaining backwards."""
    order = [("F", *fwd[k]) for k in range(warmup)]
    for k in range(len(fwd) - warmup):
        order += [("F", *fwd[warmup + k]), ("B", *bwd[k])]
    return order + [("B", *bwd[k]) for k in range(len(bwd) - warmup, len(bwd))]


def _gpipe_order(p: int, m: int, rank: int, v: int) -> list[Pass]:
    return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]


def _1f1b_warmup(p: int, rank: int, v: int) -> int:
    return p - rank - 1


def _1f1b_order(p: int, m: int, rank: int, v: int) -> list[Pass]:
    return _steady([(i, 0) for i in range(m)], [(i, 0) for i in range(m)], min(_1f1b_warmup(p, rank, v), m))


def _interleaved_warmup(p: int, rank: int, v: int) -> int:
    return (p - rank - 1) * 2 + (v - 1) * p


def _interleaved_order(p: int, m: int, rank: int, v: int) -> list[Pass]:
    """Megatron's order (torch's ScheduleInterleaved1F1B with m a multiple of p): chunks in rounds of p
    micro-batches, 2 (p - rank - 1) + (v - 1) p warm-up forwards."""
    if m % p:
        raise ValueError(f"interleaved 1F1B needs the micro-batches ({m}) divisible by the stages ({p})")
    mb = lambda k: (k // (p * v)) * p + k % p
    fwd = [(mb(k), (k // p) % v) for k in range(m * v)]
    bwd = [(mb(k), v - 1 - (k // p) % v) for k in range(m * v)]
    return _steady(fwd, bwd, min(_interleaved_warmup(p, rank, v), m * v))


# ---- memory -----------------------------------------------------------------------------------------

def _all_in_flight(m: int, p: int, v: int) -> np.ndarray:
    """Every micro-batch forwarded before the first backward: m on every rank."""
    return np.full(p, float(m))


def _1f1b_in_flight(m: int, p: int, v: int) -> np.ndarray:
    """Rank s warms up p - s - 1 forwards and runs one more before its first backward: p - s (at most m)."""
    return np.array([min(p - s, m) for s in range(p)], dtype=float)


def _interleaved_in_flight(m: int, p: int, v: int) -> np.ndarray:
    """Rank s warms up 2 (p - s - 1) + (v - 1) p chunk forwards before its first backward, so it holds that
    many + 1 chunks, each 1/v of the stage's activations; on rank 0 this is p (1 + (p - 1) / (p v)),
    Korthikanti et al.'s factor (their m is the chunk count v)."""
    return np.array([min(m, (2 * (p - s - 1) + (v - 1) * p + 1) / v) for s in range(p)])


@functools.lru_cache(maxsize=4096)
def _edge_in_flight(name: str, m: int, pp: int, v: int) -> tuple[float, float]:
    schedule = SCHEDULES[name]
    m = _same_peak_microbatches(schedule, m, pp, v)
    return (_chunk_at_peak(schedule.order(pp, m, 0, v), 0),
            _chunk_at_peak(schedule.order(pp, m, pp - 1, v), v - 1 if schedule.virtual else 0))


def _same_peak_microbatches(schedule: PipelineSchedule, m: int, pp: int, v: int) -> int:
    """The fewest micro-batches whose order on ranks 0 and pp - 1 is m's up to each rank's peak. 1F1B and interleaved
    1F1B run w warm-up forwards, then a forward and a backward at a time (`_steady`): a rank holds the most after
    forward w + 1, and which chunks those w + 1 are does not depend on m once m v > w. The search asks for every m
    of every mesh (gpt3-175b on 64 GPUs: 228 of them, up to 1,536 micro-batches), and the whole order of each cost
    half a second in all; the shortened one is the same for the peak (tests/planner/test_schedules.py replays
    both). GPipe forwards every micro-batch first (no `warmup_fn`), so its peak depends on m."""
    if schedule.warmup_fn is None:
        return m
    fewest = schedule.warmup_fn(pp, 0, v) // v + 1  # m v > rank 0's warm-up, the longest
    if schedule.virtual:
        fewest = -(-fewest // pp) * pp  # interleaving needs m a multiple of pp
    return min(m, fewest)


def _chunk_at_peak(order: list[Pass], chunk: int) -> float:
    """How many micro-batches of `chunk` have run forward and not yet backward when the rank holds the most
    forwarded chunks (the first such moment) in `order`."""
    held: dict[int, int] = {}
    total = most = 0
    at_peak = 0
    for kind, _, c in order:
        step = 1 if kind == "F" else -1
        held[c] = held.get(c, 0) + step
        total += step
        if total > most:
            most, at_peak = total, held.get(chunk, 0)
    return float(at_peak)


# ---- limits -----------------------------------------------------------------------------------------

def _gpipe_refusal(m: int, pp: int, v: int) -> str | None:
    return None


def _1f1b_refusal(m: int, pp: int, v: int) -> str | None:
    if m < pp:  # torch's Schedule1F1B raises otherwise
        return f"1F1B needs at least as many microbatches as stages ({m} < pp={pp})"
    return None


def _needs_pipeline(name: str, pp: int, v: int) -> str | None:
    if pp < 2:
        return f"{name} (virtual_stages {v}) needs pp >= 2; with pp=1 use a plain 1F1B plan"
    return None


def _interleaved_refusal(m: int, pp: int, v: int) -> str | None:
    """torch's ScheduleInterleaved1F1B also runs some m that are not multiples of pp (rounds of m // pp
    micro-batches), but then in another order, with other warm-ups and in-flight counts than Megatron's,
    which the cost is for (`_interleaved_in_flight`): partita plans and runs multiples of pp only."""
    if why := _needs_pipeline("Interleaved1F1B", pp, v):
        return why
    if m % pp:
        return (f"Interleaved1F1B needs the number of micro-batches divisible by pp: {m} micro-batches over "
                f"pp={pp} stages (it runs them in rounds of pp: num_microbatches {m} must be a multiple of {pp})")
    return None


# ---- what --schedule auto tries -------------------------------------------------------------------

def _always(m: int, pp: int) -> bool:
    return True


def _only_where_1f1b_cannot(m: int, pp: int) -> bool:
    """GPipe under auto: only with fewer micro-batches than stages (m < pp), where torch's Schedule1F1B
    refuses to run (`_1f1b_refusal`). With m >= pp 1F1B has GPipe's step (the same critical path, module
    docstring) and holds min(pp - s, m) <= m micro-batches on rank s where GPipe holds m: GPipe never beats
    it, and trying both would only double the search. With m < pp GPipe is the one-chunk schedule torch
    runs; it holds m on every rank, which is what 1F1B's own order (warm-up min(pp - s - 1, m) forwards)
    would hold on rank 0, so the plan gives up no memory the pipeline could have saved there; its step is
    m max tau + the full bubble (equal stages: (m + pp - 1) tau for m tau of work)."""
    return m < pp


# ---- the registry ----------------------------------------------------------------------------------

SCHEDULES: dict[str, PipelineSchedule] = {s.name: s for s in (
    PipelineSchedule(name="1F1B", torch_class="Schedule1F1B", virtual=False, searched_fn=_always,
                     megatron_gap=None, in_flight_fn=_1f1b_in_flight, refusal_fn=_1f1b_refusal,
                     order_fn=_1f1b_order, warmup_fn=_1f1b_warmup),
    PipelineSchedule(name="GPipe", torch_class="ScheduleGPipe", virtual=False, searched_fn=_only_where_1f1b_cannot,
                     megatron_gap="Megatron-LM runs 1F1B (same bubble, fewer activations in flight); the plan's "
                                  "memory prediction is for GPipe",
                     in_flight_fn=_all_in_flight, refusal_fn=_gpipe_refusal, order_fn=_gpipe_order,
                     warmup_fn=None),
    PipelineSchedule(name="Interleaved1F1B", torch_class="ScheduleInterleaved1F1B", virtual=True, searched_fn=_always,
                     megatron_gap=None, in_flight_fn=_interleaved_in_flight, refusal_fn=_interleaved_refusal,
                     order_fn=_interleaved_order, warmup_fn=_interleaved_warmup),
)}
"""Every schedule partita plans and runs, by plan-file name, in the order listings show them."""
AUTO = "auto"
"""--schedule's default: the search tries every schedule `searched` for the step's m and pp."""


def schedule(name: str) -> PipelineSchedule:
    """The record of schedule `name`; PlanError naming the accepted ones otherwise."""
    try:
        return SCHEDULES[name]
    except (KeyError, TypeError):
        raise PlanError(f"schedule {name!r} is not one partita runs; accepted: {', '.join(SCHEDULES)}") from None


def virtual_schedules() -> list[str]:
    """The schedules that run several model chunks per rank (virtual_stages > 1)."""
    return [n for n, s in SCHEDULES.items() if s.virtual]

"""Candidates built only when the search may need them: in order of a bound that costs nothing to compute.

Building a candidate (planner.enumerate.candidates.build_candidate) prices every layer variant and its memory
phases, about 2 ms; the search then solves a handful and proves the rest no better by their lower bound LB.
megatron-530b on 2,520 A100s built 6,256 candidates (12 s) to solve 6. Before any is built, each choice has a
bound on LB from the layers' sharding options alone:

    PB = ((m - 1/v) / p + 1/v) * (L * min_o [ (f_o + b_o) * b + k_o + x_o ] + (p v - 1) s)

with f_o, b_o the option's forward and backward seconds per sample, k_o its fixed and launch seconds per
micro-batch, x_o its tensor-parallel collectives (0 when TP overlap is chosen), and s a chunk's pipeline sends
per micro-batch (candidates.send_seconds; 0 without a pipeline or with send overlap), which the stages' extras
charge p v - 1 times. Every variant of the option costs at least that: recompute, offload, the data-parallel
lanes and the other stage extras only add (costmodel.price.streams: a window lasts at least its compute), and
the flush term of LB is >= 0. So PB <= LB for every candidate.

PB is inf where the stages cannot hold the layers' model states at all (`_states_fit`): a stage of n layers holds
at least n x the least state any variant of the layers has (options.least_state) in its optimizer-step phase, below
the device's usable memory, so if the pp stages cannot split the L layers so, no program of the choice fits.
Such choices are built only when nothing else fits (to explain why); gpt3-175b on 64 A100s built 2,102 of 3,556
choices before this, 1,283 of them out of memory, and its first solves (before any plan bounded them) were two of
those.

`best_first` hands out the built candidates in the search's own order (LB, then the simplest plan), building the
next choice by PB whenever it could come before the best one built: a built candidate is handed out only once
its LB is below the PB of every choice not yet built, hence below their LB. The search therefore solves the
same candidates in the same order and finds the same plan as if all were built, less those proved out of memory
(tests/planner/test_lazy.py).
It stops once both the next PB and the next LB are no better than the best plan: the choices never built
are pruned with the same proof as the built ones.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Callable, Iterator

from partita.costmodel.capture.graph import OpGraph
from partita.costmodel.hardware import Cluster
from partita.planner.enumerate.base import Candidate, _Bases, model_state_bytes, split_model
from partita.planner.enumerate.candidates import (build_candidate, candidate_choices, executable_space,
                                                  send_seconds, use_block_program)
from partita.planner.enumerate.options import least_state
from partita.planner.enumerate.space import SearchSpace, TrainConfig
from partita.planner.plan.schedules import SCHEDULES


def lazy_candidates(graph: OpGraph, cluster: Cluster, train: TrainConfig, space: SearchSpace) -> "Lazy | None":
    """The lazy enumeration of a uniform-layer model's candidates; None where enumerate_candidates builds
    another kind (irregular graphs' block programs, heterogeneous clusters), which are built whole."""
    space = executable_space(graph, space)
    prefix, layers, suffix = split_model(graph)
    if use_block_program(graph, prefix, layers, suffix) or (cluster.groups and cluster.heterogeneous):
        return None
    return Lazy.of(_Bases(graph, cluster, prefix, layers, suffix), train, space)


def order_key(c: Candidate) -> tuple:
    """The search's order: the bound first, then the simplest plan (deterministic)."""
    return (c.lower_bound, c.pp, c.tp, c.zero, c.virtual_stages, -c.micro_batch, c.sequence_parallel)


def pre_bound(bases: _Bases, train: TrainConfig, space: SearchSpace, choice: tuple) -> float:
    """PB of the module docstring for one choice of `candidate_choices`."""
    pp, dp, tp, zero, b, schedule, v, sp, cp, ep, tpo, p2po = choice
    layer_bases = bases.running(train, zero).get(tp, sp)[0]
    if not layer_bases or not bases.layers:
        return 0.0
    rank_b = b / cp if cp > 1 else b
    cluster = bases.cluster
    seconds = len(bases.layers) * min((o.fwd_s + o.bwd_s) * rank_b + o.fixed_s + o.launch_s
                                      + (0.0 if tpo else o.tp_comm_s(cluster, rank_b)) for o in layer_bases)
    if pp > 1 and not p2po:
        seconds += (pp * v - 1) * send_seconds(bases, space, dp * cp, tp, rank_b, sp)
    m = train.global_batch // (dp * b)
    if not _states_fit(bases, layer_bases, train, space, pp, dp * cp, tp, sp, zero, ep, v):
        return float("inf")
    return SCHEDULES[schedule].lower_bound_factor(m, pp, v) * seconds


STATE_RTOL = 1e-6
"""The state check admits layers whose states exceed a stage's memory by this fraction (planner.solve.milp's
FEASIBILITY_RTOL: no assignment the program accepts is called out of memory)."""


def _states_fit(bases: _Bases, layer_bases: list, train: TrainConfig, space: SearchSpace, pp: int, dp: int, tp: int,
                sp: bool, zero: int, ep: int, v: int) -> bool:
    """Whether the stages can hold the layers' model states at all (module docstring): every stage's optimizer-step
    phase (planner.estimate.phases) holds its layers' states below the device's usable memory, which bounds its
    capacity (the allocator's cache only lowers it), and each layer holds at least `options.least_state`."""
    key = ("least state", tp, sp, zero, dp, ep, pp > 1, space.offload)
    if key not in bases._cache:
        bases._cache[key] = least_state(layer_bases, model_state_bytes(train, zero), zero, dp, ep, pp > 1,
                                        bool(space.offload) and bases.cluster.device.host_memory_bytes > 0)
    least = bases._cache[key]
    if least <= 0:
        return True
    per_stage = math.floor(bases.cluster.device.usable_memory() * (1 + STATE_RTOL) / least)
    return per_stage >= v and pp * per_stage >= len(bases.layers)


@dataclass
class Lazy:
    """The uniform-layer candidates of one search, built on demand (module docstring)."""

    bases: _Bases
    train: TrainConfig
    space: SearchSpace
    pending: list[tuple[float, int, tuple]] = field(default_factory=list)
    """(PB, enumeration index, choice) of every choice not yet built, sorted."""
    built: list[Candidate] = field(default_factory=list)

    @classmethod
    def of(cls, bases: _Bases, train: TrainConfig, space: SearchSpace) -> "Lazy":
        choices = candidate_choices(bases, train, space)
        pending = sorted((pre_bound(bases, train, space, c), i, c) for i, c in enumerate(choices))
        return cls(bases, train, space, pending)

    @property
    def total(self) -> int:
        return len(self.pending) + len(self.built)

    def _build(self, choice: tuple) -> Candidate | None:
        c = build_candidate(self.bases, self.train, self.space, *choice)
        if c is not None:
            self.built.append(c)
        return c

    def best_first(self, incumbent: Callable[[], float | None], counted: Callable[[], None]) -> Iterator[Candidate]:
        """The candidates in the search's order (module docstring), until `incumbent()` (the best step time so
        far, or None) proves every one left no better; `counted()` once per choice, built or not."""
        heap: list[tuple[tuple, int, Candidate]] = []
        pending, at = self.pending, 0
        while at < len(pending) or heap:
            best = incumbent()
            next_pb = pending[at][0] if at < len(pending) else float("inf")
            if best is not None and next_pb >= best * (1 - 1e-9) and (not heap or heap[0][0][0] >= best * (1 - 1e-9)):
                break  # nothing left, built or not, can beat the incumbent
            if heap and heap[0][0][0] < next_pb:
                yield heapq.heappop(heap)[2]
                continue
            _, index, choice = pending[at]
            at += 1
            c = self._build(choice)
            if c is None:
                counted()
            else:  # ties in order_key: the enumeration's order, as the search's stable sort keeps it
                heapq.heappush(heap, (order_key(c), index, c))
        for _, _, c in sorted(heap, key=lambda x: x[:2]):  # built, then proved no better: pruned
            c.pruned = True
            counted()
        self.pending = pending[at:]
        for _ in self.pending:
            counted()

    def build_rest(self) -> list[Candidate]:
        """Build the choices the search never built (for a picture of every mesh), marked pruned; they join
        `built`."""
        rest = [c for c in (self._build(choice) for _, _, choice in self.pending) if c is not None]
        self.pending = []
        for c in rest:
            c.pruned = True
        return rest

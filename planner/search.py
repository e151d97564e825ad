"""The outer search: every candidate of the space (planner.enumerate.space, planner.enumerate.candidates), solved by the
stage program in order of its lower bound.

Candidates are solved in order of their lower bound (planner.enumerate.candidates), skipping every one whose
bound is no better than the best plan found. The bound is valid, so pruning never loses the optimum. A model of
uniform layers has its candidates built lazily, in that same order (planner.enumerate.lazy): a choice whose
cheaper bound already proves it no better is never priced.

A `SearchSpace` restricts the choices; the baselines (planner.estimate.baselines) are searches over restricted
spaces with the same cost model and solver, so "the plan beats the baselines" is like for like.
"""
from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from partita.costmodel.errors import InfeasibleError, PartitaError
from partita.costmodel.price.fusion import with_kernels
from partita.costmodel.capture.graph import OpGraph
from partita.costmodel.hardware import Cluster, GiB
from partita.planner.enumerate.candidates import Candidate, enumerate_candidates
from partita.planner.enumerate.lazy import Lazy, lazy_candidates, order_key
from partita.planner.plan.executable import COMPILED_OFFLOAD_RECOMPUTE, offload_refusal
from partita.planner.solve.milp import TIME_LIMIT_NO_INCUMBENT, min_memory, phase_memory, polish, solve_stages
from partita.planner.solve.bounds import stage_bound
from partita.planner.solve.milp_blocks import solve_blocks, stage_p2p
from partita.planner.estimate.phases import stage_memory
from partita.planner.enumerate.space import SearchSpace, TrainConfig, no_candidates_reason, resolve_stack


@dataclass
class SearchResult:
    graph: OpGraph
    cluster: Cluster
    train: TrainConfig
    layers: list[str]
    prefix: list[str]
    suffix: list[str]
    candidates: list[Candidate]
    best: Candidate | None
    wall_time_s: float
    space: SearchSpace = field(default_factory=SearchSpace)
    unbuilt: Lazy | None = None
    """The choices the search proved no better without building them (planner.enumerate.lazy), if any."""

    @property
    def considered(self) -> int:
        """Candidates the search considered: built, or proved no better before they were built."""
        return len(self.candidates) + (len(self.unbuilt.pending) if self.unbuilt is not None else 0)

    def every_candidate(self) -> list[Candidate]:
        """`candidates` and the unbuilt ones, built now (once) and marked pruned: every mesh, for a picture.
        `candidates` stays what the search built."""
        if self.unbuilt is not None and self.unbuilt.pending:
            self.unbuilt.build_rest()
        if self.unbuilt is None or len(self.unbuilt.built) == len(self.candidates):
            return self.candidates
        return sorted(self.unbuilt.built, key=order_key)


def search(graph: OpGraph, cluster: Cluster, train: TrainConfig, progress=None,
           space: SearchSpace = SearchSpace(), raise_infeasible: bool = True) -> SearchResult:
    t0 = time.perf_counter()
    cluster, space = resolve_stack(cluster, space)  # the stack's kernel constants and overlaps
    # a compiled run prices fused kernels, an eager run on a fused stack their saves (costmodel.price.fusion)
    graph = with_kernels(graph, space.kernels, space.stack)
    lazy = None if space.min_pp else lazy_candidates(graph, cluster, train, space)
    if lazy is not None:  # uniform layers: built in order of a cheap bound (planner.enumerate.lazy)
        prefix, layers, suffix = lazy.bases.prefix, lazy.bases.layers, lazy.bases.suffix
        step, found = _Progress(progress, lazy.total), _Incumbent()
        best = _fastest(lazy.best_first(found.step_time, step), step, found)
        cands = sorted(lazy.built, key=order_key)
    else:
        prefix, layers, suffix, cands = enumerate_candidates(graph, cluster, train, space)
        cands.sort(key=order_key)  # deterministic order: bound first, then the simplest plan
    if not cands and raise_infeasible:
        kinds = {graph.g.nodes[n]["kind"] for group in layers for n in graph.nodes_of(group)}
        raise PartitaError(no_candidates_reason(cluster, train, space, kinds))
    if lazy is None:
        step = _Progress(progress, len(cands))
        best = _shallowest_that_fits(cands, step) if space.min_pp else _fastest(cands, step)
    if best is not None and best.formulation == "counts":
        best.solution = polish(best.problem, best.solution)
    result = SearchResult(graph=graph, cluster=cluster, train=train, layers=layers, prefix=prefix,
                          suffix=suffix, candidates=cands, best=best, wall_time_s=time.perf_counter() - t0,
                          space=space, unbuilt=lazy)
    if best is None and raise_infeasible:
        raise InfeasibleError(_timed_out(result) + explain_infeasible(result))
    return result


class _Progress:
    """Calls progress(i, n) once per candidate, in the order they are considered."""

    def __init__(self, progress, total: int):
        self.progress, self.total, self.done = progress, total, 0

    def __call__(self) -> None:
        if self.progress:
            self.progress(self.done, self.total)
        self.done += 1


class _Incumbent:
    """The best candidate found so far, for a lazy enumeration to compare its bounds with."""

    def __init__(self):
        self.best: Candidate | None = None

    def step_time(self) -> float | None:
        return None if self.best is None else self.best.step_time


SEARCH_RTOL = 1e-3
"""A candidate is solved only if a bound leaves it room to beat the best plan so far by more than this fraction of its
step time. The stage programs themselves stop within their mip_rel_gap (0.5%), so a plan was never promised closer
than that to the optimum; this tolerance skips the solves that could gain at most 0.1%, a fifth of that gap
(megatron-530b on 2,520 A100s: a 21-stage program whose bound was 0.0003% below the incumbent took 0.5 s of HiGHS to
end "cutoff"; gpt3-175b on 128 A100s: a 32-stage one 0.03% below, 0.7 s of a 2.0 s plan, at 0.01% until 11-30)."""


def _fastest(cands: Iterable[Candidate], step: _Progress, found: _Incumbent | None = None) -> Candidate | None:
    """The fastest candidate that fits: solve in order of lower bound (cands is sorted), each with the best
    step time so far as its cutoff, and skip (prune) every candidate whose bound is no better. `found`, when
    given, holds the best so far as it changes."""
    best: Candidate | None = None
    for c in cands:
        step()
        if best is not None and _no_better(c, best.step_time * (1 - SEARCH_RTOL)):
            c.pruned = True
            continue
        cutoff = best.step_time if best is not None else None
        if c.formulation == "blocks":
            c.solution = solve_blocks(c.problem, cutoff=cutoff)
            if c.solution.feasible:
                c.parts["e_p2p"] = stage_p2p(c.problem, c.solution.counts)
        else:
            c.solution = solve_stages(c.problem, cutoff=cutoff)
        if c.solution.feasible and (best is None or c.step_time < best.step_time * (1 - 1e-9)):
            best = c
            if found is not None:
                found.best = c
    return best


def _no_better(c: Candidate, incumbent: float) -> bool:
    """Whether a bound proves `c` no faster than `incumbent`: its cheap bound (the order of the search), then,
    for a stage program, the bound that keeps each stage's memory and whole layers (planner.solve.bounds), and
    where that does not prune, the same with each few-layer stage's layers taking whole options. All are valid,
    so a candidate skipped here could not have replaced the incumbent by more than SEARCH_RTOL (the caller's
    `incumbent` is the best step less that fraction): the plan is the one a search without them finds, or one within
    that fraction of it (tests/planner/test_bounds.py)."""
    if c.lower_bound >= incumbent:
        return True
    if c.formulation != "counts":
        return False
    return stage_bound(c.problem) >= incumbent or stage_bound(c.problem, whole=True) >= incumbent


def _shallowest_that_fits(cands: list[Candidate], step: _Progress) -> Candidate | None:
    """SearchSpace.min_pp: the fastest candidate at the smallest pipeline depth that fits.

    Depths are tried in increasing order, each searched like the full space (`_fastest`, bound pruning
    only among candidates of that depth), and the first depth with a feasible candidate ends the search;
    deeper candidates are not solved (marked pruned). Pruning across depths would be wrong here: a
    deeper pipeline's lower bound can beat every shallower candidate's, so shallower ones that fit would
    never be solved (megatron-76b on 128 x 8 A100s at global batch 1792 came out pp=4 while pp=2 fits).
    """
    depths = sorted({c.pp for c in cands})
    for k, pp in enumerate(depths):
        best = _fastest([c for c in cands if c.pp == pp], step)
        if best is not None:
            for c in cands:
                if c.pp in depths[k + 1:]:
                    c.pruned = True
                    step()
            return best
    return None


def _timed_out(result: SearchResult) -> str:
    """What to say when some candidates were stopped by the solver's time limit with no assignment."""
    solved = [c for c in result.candidates if c.solution is not None]
    stopped = [c for c in solved if c.solution.status == TIME_LIMIT_NO_INCUMBENT]
    if not stopped:
        return ""
    limit = max(c.problem.time_limit_s for c in stopped)
    nodes = max(getattr(c.problem, "node_limit", 0) for c in stopped)
    return (f"{len(stopped)} of {len(solved)} solved candidates hit the solver's limit ({nodes:,} branch-and-bound "
            f"nodes or {limit:g} s per candidate: StageProblem.node_limit, time_limit_s) before finding any "
            f"assignment, so they may fit: rerun with a higher limit. ")


_FOOTPRINT_PROGRAMS = 96
"""At most this many least-memory programs (milp.min_memory) explain an infeasible search."""


def explain_infeasible(result: SearchResult) -> str:
    """The least memory per device any candidate needs, what dominates it, and what would make it fit."""
    best = (float("inf"), None, None)
    counted = [c for c in result.candidates if c.formulation == "counts"]
    # a mesh's smallest micro-batch needs the least memory; every mesh is tried up to a bound (about 0.02 s
    # a program), most sharded first
    def mesh(c: Candidate) -> tuple:
        return c.pp, c.dp, c.tp, c.cp, c.ep, c.zero
    least_b = {}
    for c in counted:
        least_b[mesh(c)] = min(least_b.get(mesh(c), c.micro_batch), c.micro_batch)
    pool = sorted((c for c in counted if c.micro_batch == least_b[mesh(c)]),
                  key=lambda c: (-c.pp * c.tp * c.cp, -c.zero))[:_FOOTPRINT_PROGRAMS]
    for c in pool:
        need, counts = min_memory(c.problem)
        if need < best[0]:
            best = (need, c, counts)
    need, c, counts = best
    dev = result.cluster.device.name
    if c is None:
        return f"no plan fits on {result.cluster.num_devices} x {dev}"
    prob = c.problem
    s = int(np.argmax(phase_memory(prob, counts).max(axis=0)))
    cap = float(np.broadcast_to(prob.capacity, (c.pp,))[s])
    usable = f"{cap / GiB:.1f} GiB usable"
    if result.cluster.device.charges_allocator_cache:
        usable += (f" (after {(result.cluster.device.usable_memory() - cap) / GiB:.1f} GiB for the caching "
                   "allocator's predicted cache)")
    row = stage_memory(c, s, counts)
    act, states, workspace = row["activations"], row["model_states"], row["workspace"]
    binding = "activations" if act > states else "model states (parameters, gradients, optimizer)"
    advice = _fit_advice(result.space, act > states)
    return (f"no plan fits on {result.cluster.num_devices} x {dev}: the smallest footprint needs "
            f"{need / GiB:.1f} GiB per device ({binding} bind: model states {states / GiB:.1f} GiB, activations "
            f"{act / GiB:.1f} GiB for {int(prob.in_flight[s])} micro-batch(es) in flight, workspace "
            f"{workspace / GiB:.1f} GiB (at the {row['phase']}), at pp={c.pp}, dp={c.dp}, tp={c.tp}"
            f"{f', cp={c.cp}' if c.cp > 1 else ''}, ZeRO-{c.zero}, micro-batch "
            f"{c.micro_batch}, with {_considered(result.space)}) but each {dev} has {usable}; "
            f"{advice}")


def _fit_advice(space: SearchSpace, activations_bind: bool) -> str:
    """What could make it fit, starting with the choices the user fixed (what-if flags) that rule out the
    usual remedies: recompute and offload for activations, ZeRO-3 and offload for model states."""
    freed = []
    kept = [r for r in space.recompute if not offload_refusal(r, True, "eager")]  # what could offload activations
    if space.offload and kept and all(offload_refusal(r, True, space.kernels) for r in kept):
        freed.append(f"compiled layers offload activations only with recompute "
                     f"{'|'.join(COMPILED_OFFLOAD_RECOMPUTE)} (--recompute none, or --kernels eager)")
    if activations_bind:
        if "full" not in space.recompute:
            freed.append("allow activation recompute (--recompute full, or leave it to the search)")
        if space.micro_batch and min(space.micro_batch) > 1:
            freed.append("a smaller micro-batch (--micro-batch 1)")
        if not space.offload:
            freed.append("allow activation offload (--offload on)")
        return "activations dominate: " + "; ".join(
            freed + ["a shorter sequence (--seq), or more context parallelism (--cp N: each sequence split over N "
                     "ranks), tensor (--tp) or pipeline (--pp) parallelism, on more devices where these run out"])
    if 3 not in space.zero:
        freed.append("shard the optimizer state (--zero 1) or everything (--zero 3)" if 1 not in space.zero
                     else "shard parameters too (--zero 3)")
    elif not space.offload:
        freed.append("allow offloading ZeRO-3 states to host memory (--offload on)")
    return "model states dominate: " + "; ".join(freed + ["more devices, or devices with more memory"])


def _considered(space: SearchSpace) -> str:
    if len(space.recompute) > 1 and space.offload:
        return "recompute and offload considered"
    rec = "recompute considered" if len(space.recompute) > 1 else f"recompute={space.recompute[0]}"
    return f"{rec}, " + ("offload considered" if space.offload else "no offload")

"""The outer search: every candidate of the space (planner.space, planner.candidates), solved by the
stage program in order of its lower bound.

Candidates are solved in order of their lower bound (planner.candidates), skipping every one whose
bound is no better than the best plan found. The bound is valid, so pruning never loses the optimum.

A `SearchSpace` restricts the choices; the baselines (planner.baselines) are searches over restricted
spaces with the same cost model and solver, so "the plan beats the baselines" is like for like.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from costmodel.errors import InfeasibleError, PartitaError
from costmodel.graph import OpGraph
from costmodel.hardware import Cluster, GiB
from planner.candidates import Candidate, enumerate_candidates
from planner.milp import min_memory, phase_memory, polish, solve_stages
from planner.milp_blocks import solve_blocks, stage_p2p
from planner.phases import stage_memory
from planner.space import SearchSpace, TrainConfig


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


def search(graph: OpGraph, cluster: Cluster, train: TrainConfig, progress=None,
           space: SearchSpace = SearchSpace(), raise_infeasible: bool = True) -> SearchResult:
    t0 = time.perf_counter()
    prefix, layers, suffix, cands = enumerate_candidates(graph, cluster, train, space)
    if not cands and raise_infeasible:
        raise PartitaError(f"no mesh of {cluster.num_devices} devices divides global batch {train.global_batch}: "
                           f"choose a global batch divisible by the data-parallel degree (e.g. a multiple of "
                           f"{cluster.num_devices})")
    # deterministic order: bound first, then the simplest plan
    cands.sort(key=lambda c: (c.lower_bound, c.pp, c.tp, c.zero, c.virtual_stages, -c.micro_batch,
                              c.sequence_parallel))
    best: Candidate | None = None
    for i, c in enumerate(cands):
        if progress:
            progress(i, len(cands))
        if best is not None and c.lower_bound >= best.step_time * (1 - 1e-9):
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
    if space.min_pp and best is not None:
        fitting = [c for c in cands if c.solution is not None and c.solution.feasible]
        shallow = min(c.pp for c in fitting)
        best = min((c for c in fitting if c.pp == shallow), key=lambda c: c.step_time)
    if best is not None and best.formulation == "counts":
        best.solution = polish(best.problem, best.solution)
    result = SearchResult(graph=graph, cluster=cluster, train=train, layers=layers, prefix=prefix,
                          suffix=suffix, candidates=cands, best=best, wall_time_s=time.perf_counter() - t0,
                          space=space)
    if best is None and raise_infeasible:
        raise InfeasibleError(explain_infeasible(result))
    return result


def explain_infeasible(result: SearchResult) -> str:
    """The least memory per device any candidate needs, what dominates it, and what would make it fit."""
    best = (float("inf"), None, None)
    pool = sorted((c for c in result.candidates if c.formulation == "counts"),
                  key=lambda c: (-c.pp * c.tp, -c.zero, c.micro_batch))[:16]
    for c in pool:
        need, counts = min_memory(c.problem)
        if need < best[0]:
            best = (need, c, counts)
    need, c, counts = best
    cap = result.cluster.device.usable_memory()
    dev = result.cluster.device.name
    if c is None:
        return f"no plan fits on {result.cluster.num_devices} x {dev}"
    prob = c.problem
    s = int(np.argmax(phase_memory(prob, counts).max(axis=0)))
    row = stage_memory(c, s, counts)
    act, states, workspace = row["activations"], row["model_states"], row["workspace"]
    binding = "activations" if act > states else "model states (parameters, gradients, optimizer)"
    advice = ("activations dominate: a shorter sequence or more tensor parallelism"
              if act > states else "model states dominate: more devices, or devices with more memory")
    return (f"no plan fits on {result.cluster.num_devices} x {dev}: the smallest footprint needs "
            f"{need / GiB:.1f} GiB per device ({binding} bind: model states {states / GiB:.1f} GiB, activations "
            f"{act / GiB:.1f} GiB for {int(prob.in_flight[s])} micro-batch(es) in flight, workspace "
            f"{workspace / GiB:.1f} GiB (at the {row['phase']}), at pp={c.pp}, dp={c.dp}, tp={c.tp}, ZeRO-{c.zero}, micro-batch "
            f"{c.micro_batch}, with recompute and offload considered) but a {dev} has {cap / GiB:.1f} GiB usable; "
            f"{advice}")

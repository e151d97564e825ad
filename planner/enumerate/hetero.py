"""Candidates on a heterogeneous cluster (a resource list of groups of different devices): stage s runs on the
devices of one group, every stage offers the same layer variants costed on its own group's devices and links,
capacities are per stage, and a boundary between two groups is sent over the inter-group link. The lower
bound is planner.enumerate.candidates' (base._lower_bound)."""
from __future__ import annotations

import math

import numpy as np

from partita.costmodel.hardware import Cluster
from partita.costmodel.price import comm
from partita.planner.enumerate.base import (Candidate, _add_extra_costs, _Bases, _lower_bound, _plain_schedule, _prune,
                                            _zero_runs_or_fixed, capacity_less_cache, counted_full_recompute,
                                            model_state_bytes, pinned_layers, step_sync, zero1_broadcast,
                                            zero1_state_excess)
from partita.planner.enumerate.options import Variant, pareto_indices, pipelined_fsdp, variants
from partita.planner.enumerate.space import SearchSpace, TrainConfig, _micro_batch_allowed, divisors, micro_batch_cap
from partita.planner.estimate.phases import widest_product
from partita.planner.plan import SPLIT
from partita.planner.plan.schedules import SCHEDULES
from partita.planner.solve.milp import StageProblem


def build_hetero_candidate(bases: _Bases, train: TrainConfig, space: SearchSpace, pp: int, dp: int, tp: int,
                           zero: int, b: int, stage_groups: list[Cluster], schedule: str = "1F1B") -> Candidate | None:
    """A candidate on a heterogeneous cluster: stage s runs on the devices of stage_groups[s].

    Every stage offers the same variants (the union of each group's Pareto-optimal ones), each costed on
    its own group's devices and links; capacities are per stage; a boundary between two groups is sent
    over the inter-group link.
    """
    bases = bases.running(train, zero)
    m = train.global_batch // (dp * b)
    sb = model_state_bytes(train, zero)
    offered = _hetero_variants(bases, space, stage_groups, sb, zero, dp, tp, b, pp)
    if offered is None:
        return None
    by_stage, extras = offered
    opts = by_stage[0]
    if tp > 1 and not any(o.sharding in SPLIT for o in opts):
        return None
    e = _hetero_extras(bases, space, stage_groups, extras, sb, zero, dp, tp, b, pp)
    problem, workspace = _hetero_problem(bases, space, stage_groups, by_stage, e, sb, zero, dp, tp, b, m,
                                         schedule)
    return Candidate(pp=pp, dp=dp, tp=tp, zero=zero, micro_batch=b, num_microbatches=m,
                     schedule=schedule, virtual_stages=1,
                     lower_bound=_lower_bound(problem, schedule), problem=problem, options=opts,
                     parts={**{f"e_{k}": v for k, v in e.items()}, "workspace": workspace, "stage_options": by_stage,
                            "stage_groups": [gc.spec for gc in stage_groups],
                            "extra_options": dict(zip((*bases.prefix, *bases.suffix),
                                                      (*extras[id(stage_groups[0])][0],
                                                       *extras[id(stage_groups[-1])][1])))})


def _hetero_variants(bases: _Bases, space: SearchSpace, stage_groups: list[Cluster], sb, zero: int, dp: int,
                     tp: int, b: int, pp: int) -> tuple[list[list[Variant]], dict] | None:
    """(per stage, the layer variants every stage offers, costed on its group's devices; per group id, its
    (prefix, suffix) options); None when the layers cannot be split over tp ranks."""
    distinct = list({id(gc): gc for gc in stage_groups}.values())  # Clusters hold dicts: not hashable
    full, extras = {}, {}
    for gc in distinct:
        layer_bases, pre, suf, _ = bases.for_cluster(gc).get(tp)
        if tp > 1 and not any(o.name in SPLIT for o in layer_bases):
            return None
        full[id(gc)] = variants(layer_bases, gc, sb, zero, dp, tp, b, space.recompute, space.offload, prune=False,
                                pipelined=pp > 1, keep_gathered=space.keep_gathered, kernels=space.kernels,
                                zero1_broadcast=zero1_broadcast(space))
        extras[id(gc)] = (pre, suf)
    keep = (sorted(set().union(*(pareto_indices(full[id(gc)]) for gc in distinct))) if _prune(space)
            else list(range(len(full[id(distinct[0])]))))
    return [[full[id(gc)][i] for i in keep] for gc in stage_groups], extras


def _hetero_extras(bases: _Bases, space: SearchSpace, stage_groups: list[Cluster], extras: dict, sb, zero: int,
                   dp: int, tp: int, b: int, pp: int) -> dict:
    """Per-stage arrays (e) of what the layers' variants leave out, each on its stage's group: the prefix and
    suffix groups, ZeRO-1's excess, the step's all-reduce latencies and the pipeline's sends."""
    e = {k: np.zeros(pp) for k in ("compute", "tp", "p2p", "state", "grad", "act", "flush", "dp", "zero",
                                   "zero_flush")}
    for s, which in ((0, 0), (pp - 1, 1)):
        _add_extra_costs(e, s, extras[id(stage_groups[s])][which], stage_groups[s], sb, zero, dp, tp, b,
                         pipelined=pp > 1, zero1_bcast=zero1_broadcast(space))
    if zero == 1 and zero1_broadcast(space):  # (options.zero1_excess)
        e["state"] += sb.optimizer * zero1_state_excess(bases, pp, dp, tp)
    for s, gc in enumerate(stage_groups):
        latency = comm.affine(comm.all_reduce, gc, comm.group_for(gc, dp, tp))[0] if zero <= 1 else 0.0
        latency += step_sync(bases.cluster)
        e["flush"][s] += latency
        e["dp"][s] += latency
    boundary = bases.graph.boundary_bytes(bases.layers[0]) * b
    cl = bases.cluster
    for s in range(pp - 1):
        if stage_groups[s] is stage_groups[s + 1]:
            gc = stage_groups[s]
            e["p2p"][s] = 2 * comm.p2p(gc, boundary, dp * tp >= gc.devices_per_node)
        else:
            bw = cl.inter_group_bw or min(stage_groups[s].device.inter_node_bw, stage_groups[s + 1].device.inter_node_bw)
            lat = cl.inter_group_latency or max(stage_groups[s].device.inter_node_latency,
                                                stage_groups[s + 1].device.inter_node_latency)
            e["p2p"][s] = 2 * (lat + boundary / bw)
    return e


def _hetero_problem(bases: _Bases, space: SearchSpace, stage_groups: list[Cluster], by_stage: list[list[Variant]],
                    e: dict, sb, zero: int, dp: int, tp: int, b: int, m: int,
                    schedule: str) -> tuple[StageProblem, float]:
    """The stage program of a heterogeneous candidate (option costs and capacities per stage), and its workspace."""
    graph, pp, opts = bases.graph, len(stage_groups), by_stage[0]
    mat = lambda attr: np.array([[getattr(o, attr) for o in row] for row in by_stage])
    in_flight = SCHEDULES[schedule].in_flight(m, pp)
    transient = widest_product(graph) * b / tp
    max_out = max([graph.g.nodes[n]["out_bytes"] for n in graph.g.nodes] or [0])
    workspace = 2.0 * max_out * b + max(o.base.saved_bytes for o in opts) * b
    if zero == 3 and not pipelined_fsdp(pp > 1, zero, dp):  # (a pipeline's states count every layer gathered)
        workspace += 2 * min(o.base.param_numel for o in opts) * sb.param
    problem = StageProblem(
        num_stages=pp, num_layers=len(bases.layers), num_microbatches=m, option_time=mat("time"),
        option_state=mat("state"), option_act=mat("act"), option_flush=mat("flush"),
        extra_time=e["compute"] + e["tp"] + e["zero"] + e["p2p"],
        extra_mem=e["state"] + in_flight * e["act"] + workspace, extra_flush=e["flush"], in_flight=in_flight,
        capacity=np.array([capacity_less_cache(gc.device, gc.device.allocator_cache_bytes(transient))
                           for gc in stage_groups]),
        must_use=np.array([tp > 1 and o.sharding in SPLIT for o in opts]),
        count_use=counted_full_recompute(opts, space), stage_layers=pinned_layers(space, pp),
        option_host_state=mat("host_state"), option_host_act=mat("host_act"),
        host_capacity=np.array([gc.device.host_memory_bytes for gc in stage_groups]),
        option_rank=np.array([o.complexity for o in opts], dtype=float))
    return problem, workspace


def _enumerate_hetero(bases: _Bases, cluster: Cluster, train: TrainConfig, space: SearchSpace) -> list[Candidate]:
    """Meshes whose dp x tp block divides every group: group g hosts n_g / (dp tp) consecutive stages,
    in the resource list's order or reversed (which group takes the first, memory-hungriest stage)."""
    groups = list(cluster.groups)
    sizes = [g.num_devices for g in groups]
    node = math.gcd(*(g.devices_per_node for g in groups))
    out = []
    for d in divisors(math.gcd(*sizes)):
        for tp in divisors(min(d, node)):
            if d % tp or (space.tp is not None and tp not in space.tp):
                continue
            dp = d // tp
            pp = sum(n // d for n in sizes)
            if pp > max(1, len(bases.layers)) or (space.pp is not None and pp not in space.pp):
                continue
            if train.global_batch % dp or (space.dp is not None and dp not in space.dp):
                continue
            local = train.global_batch // dp
            for order in (groups, groups[::-1]):
                stage_groups = [g for g in order for _ in range(g.num_devices // d)]
                for zero in (space.zero if dp > 1 else (0,) if 0 in space.zero else ()):
                    if not _zero_runs_or_fixed(space, zero, tp, 1, 1):
                        continue
                    for b in divisors(local, micro_batch_cap(train, space)):
                        m = local // b
                        schedule = _plain_schedule(train, pp, m)
                        if not _micro_batch_allowed(b, train, space) or schedule is None:
                            continue
                        c = build_hetero_candidate(bases, train, space, pp, dp, tp, zero, b, stage_groups, schedule)
                        if c is not None:
                            out.append(c)
    return out

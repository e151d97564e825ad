"""Candidates: one mesh, ZeRO stage, micro-batch size and schedule, turned into a stage program.

`build_candidate` costs every layer variant for the candidate (planner.enumerate.options), charges the blocks
outside the repeated layers (embeddings, head) to the first and last stage, adds pipeline sends and
resharding, builds the memory phases (planner.estimate.phases) and a lower bound on the step time,

    LB = ((m - 1/v) / p + 1/v) * (L * min_o T_o + E) + (L * min_o D_o + F) / p

(the bottleneck is at least the average stage; the flush at least its average), which the search
(planner.search) uses to prune. Heterogeneous clusters (planner.enumerate.hetero) and irregular graphs
(`build_block_candidate`, planner.solve.milp_blocks) have their own builders; what the builders share (the
Candidate, the options per tp degree, the charges outside the layers) is planner.enumerate.base, tied
weights planner.enumerate.tied.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import numpy as np

from partita.costmodel.capture.graph import OpGraph
from partita.costmodel.errors import PartitaError
from partita.costmodel.hardware import Cluster
from partita.costmodel.price import comm, streams
from partita.planner.enumerate.base import (DDP_BUCKET_BYTES, Candidate, _add_extra_costs, _Bases, _lower_bound,
                                            _plain_schedule, _prune, _runs_or_fixed, _zero_runs_or_fixed,
                                            capacity_less_cache, counted_full_recompute, model_state_bytes,
                                            pinned_layers, split_model, step_sync, zero1_broadcast, zero1_state_excess)
from partita.planner.enumerate.base import plan_key  # noqa: F401 (re-exported: the builders' shared pieces moved there)
from partita.planner.enumerate.cp_ep import cp_refusal, default_cp, default_ep, ep_refusal, experts_of
from partita.planner.enumerate.hetero import _enumerate_hetero, build_hetero_candidate  # noqa: F401 (re-exported)
from partita.planner.enumerate.options import Variant, pipelined_fsdp, variants
from partita.planner.enumerate.space import SearchSpace, TrainConfig, _meshes, _schedules, overlap_choices
from partita.planner.enumerate.strategies import BlockOption, replicate_option, tensor_option
from partita.planner.enumerate.tied import _charge_tied, _charge_tied_blocks, tied_across_stages
from partita.planner.estimate.phases import grads_absent, memory_phases, widest_product
from partita.planner.plan import SPLIT
from partita.planner.plan.executable import cp_refusal_for, pipeline_refusal_for
from partita.planner.plan.schedules import AUTO, SCHEDULES
from partita.planner.solve.milp import StageProblem
from partita.planner.solve.milp_blocks import BlockProblem


@dataclass(frozen=True)
class _Shape:
    """One candidate's choices as its layers are priced. Under context parallelism (planner.enumerate.cp_ep) a
    rank runs b / cp samples' worth of every sequence, and the dp x cp ranks holding the same parameters shard
    and reduce them as data-parallel ranks do: `dp` and `b` here are those (the Candidate keeps the mesh's)."""

    pp: int
    dp: int
    tp: int
    zero: int
    b: float
    m: int
    schedule: str
    v: int
    sp: bool
    cp: int
    ep: int
    tp_overlap: bool
    p2p_overlap: bool
    sb: object
    """Model-state bytes per parameter (model_state_bytes)."""
    ddp: bool
    """The runtime's DDP (one stage, no tensor parallelism) reduces gradient buckets during the backward."""
    bcast: bool
    """ZeRO-1 as partita's runtime runs it (zero1_broadcast)."""


def build_candidate(bases: _Bases, train: TrainConfig, space: SearchSpace, pp: int, dp: int, tp: int,
                    zero: int, b: int, schedule: str = "1F1B", v: int = 1, sp: bool = False, cp: int = 1,
                    ep: int = 1, tp_overlap: bool = False, p2p_overlap: bool = False) -> Candidate | None:
    """The candidate of repeated layers on this mesh, ZeRO stage, micro-batch and schedule (the module's
    docstring: its stage program and lower bound); None when its tp ranks would have nothing to split."""
    bases = bases.running(train, zero)
    layers = bases.layers
    m = train.global_batch // (dp * b)
    layer_bases, pre, suf, _ = bases.get(tp, sp)
    if tp > 1 and layers and not any(o.name in SPLIT for o in layer_bases):
        return None  # the layers cannot be split over tp ranks
    s = _Shape(pp=pp, dp=dp * cp, tp=tp, zero=zero, b=(b / cp if cp > 1 else b), m=m, schedule=schedule, v=v,
               sp=sp, cp=cp, ep=ep, tp_overlap=tp_overlap, p2p_overlap=p2p_overlap,
               sb=model_state_bytes(train, zero), ddp=zero <= 1 and dp * cp > 1 and tp == 1 and pp == 1,
               bcast=zero1_broadcast(space))
    opts = _layer_variants(bases, train, space, s, layer_bases)
    if opts is None:
        return None  # splitting the layers never pays on this mesh: a smaller tp does better
    if tp > 1 and not layers and not any(o.name in SPLIT for o in (*pre, *suf)):
        return None  # nothing to split: the tp ranks would duplicate all work
    e, tied = _stage_extras(bases, space, s, opts, layer_bases, pre, suf)
    problem, workspace, cache = _stage_problem(bases, space, s, opts, layer_bases, suf, e)
    return Candidate(pp=pp, dp=dp, tp=tp, zero=zero, micro_batch=b, num_microbatches=m,
                     schedule=schedule, virtual_stages=v, lower_bound=_lower_bound(problem, schedule, v),
                     sequence_parallel=sp, cp=cp, ep=ep,
                     tp_overlap=tp_overlap, p2p_overlap=p2p_overlap, problem=problem, options=opts,
                     parts={**{f"e_{k}": x for k, x in e.items()}, "workspace": workspace, "tied": tied,
                            "allocator_cache": cache,
                            "extra_options": dict(zip((*bases.prefix, *bases.suffix), (*pre, *suf)))})


def _layer_variants(bases: _Bases, train: TrainConfig, space: SearchSpace, s: _Shape,
                    layer_bases: list[BlockOption]) -> list[Variant] | None:
    """The layers' variants (planner.enumerate.options). The same variants serve every pipeline depth and
    schedule of this (tp, dp, ZeRO, b): costed once (a pipeline stage syncs its ZeRO gradients once per step).
    None when no variant splits the layers over tp > 1 ranks and the search chose tp; a tp the user fixed is
    priced as asked (what-if) from its split options, even where a smaller one would do better."""
    key = ("variants", s.tp, s.sp, s.zero, s.dp, s.b, space.recompute, space.offload, s.ddp, train.dtype,
           train.optimizer, train.master_weights,
           s.cp, s.ep, s.pp > 1, space.keep_gathered, _prune(space), space.kernels, s.tp_overlap, s.bcast)
    costed = lambda options: variants(
        options, bases.cluster, s.sb, s.zero, s.dp, s.tp, s.b, space.recompute, space.offload, ddp_overlap=s.ddp,
        cp=s.cp, ep=s.ep, pipelined=s.pp > 1, keep_gathered=space.keep_gathered, kernels=space.kernels,
        prune=_prune(space), tp_overlap=s.tp_overlap, zero1_broadcast=s.bcast)
    if key not in bases._cache:
        bases._cache[key] = costed(layer_bases)
    opts = bases._cache[key]
    if s.tp > 1 and bases.layers and not any(o.sharding in SPLIT for o in opts):
        if space.tp is None:
            return None
        opts = costed([o for o in layer_bases if o.name in SPLIT])
    return opts


def _stage_extras(bases: _Bases, space: SearchSpace, s: _Shape, opts: list[Variant], layer_bases: list[BlockOption],
                  pre: list[BlockOption], suf: list[BlockOption]) -> tuple[dict, list[dict]]:
    """Per-stage arrays (e) of what the layers' variants leave out: the prefix and suffix groups on the first
    and last stage, tied weights, ZeRO-1's excess, the step's all-reduce latencies, DDP's last bucket, ZeRO's
    edge collectives, sequence parallelism's reshards and the pipeline's sends; and the tied weights charged."""
    cluster, pp = bases.cluster, s.pp
    dp_group = comm.group_for(cluster, s.dp, s.tp)
    dp_latency = comm.affine(comm.all_reduce, cluster, dp_group)[0] if s.zero <= 1 else 0.0
    e = {k: np.zeros(pp) for k in ("compute", "tp", "p2p", "p2p_contention", "p2p_hidden", "p2p_fill", "state",
                                   "grad", "act", "flush", "dp", "zero", "zero_flush")}
    for stage, group_opts in ((0, pre), (pp - 1, suf)):
        _add_extra_costs(e, stage, group_opts, cluster, s.sb, s.zero, s.dp, s.tp, s.b, s.ddp, pp > 1, s.bcast,
                         memo=bases._cache)
    if "tied" not in bases._cache:
        bases._cache["tied"] = tied_across_stages(bases.graph, bases.prefix, bases.suffix)
    tied = _charge_tied(e, bases._cache["tied"], bases.suffix, cluster, s.sb, s.zero, s.dp, s.tp, pp)
    if s.zero == 1 and s.bcast:  # whole tensors per rank: the busiest holds and steps more than 1/dp of them
        excess = zero1_state_excess(bases, pp, s.dp, s.tp)
        e["state"] += s.sb.optimizer * excess
        e["flush"] += excess * s.sb.step_traffic / (cluster.device.mem_bandwidth * cluster.device.mem_efficiency)
    e["flush"] += dp_latency + step_sync(cluster)
    e["dp"] += dp_latency + step_sync(cluster)
    if s.ddp:
        # the last bucket (DDP's default: 25 MiB) has no backward left to hide behind: the layers' windows
        # charged it only kappa t (their contention), so exposing it adds (1 - kappa) t
        layers = bases.layers
        grads = sum(o.param_numel for o in (*pre, *suf)) + len(layers) * layer_bases[0].param_numel if layers else 0
        last = comm.all_reduce(cluster, dp_group, min(DDP_BUCKET_BYTES, grads * s.sb.grad_comm / pp)) \
            * (1 - cluster.device.overlap_slowdown)
        e["flush"] += last
        e["dp"] += last
    if s.zero >= 2 and s.dp > 1 and opts:
        # each stage's first gathers and last reduce-scatter, per micro-batch
        e["zero"] += max(streams.edge_exposed(o.timing.lanes) for o in opts)
    if s.sp and bases.layers:
        e["tp"] += _edge_reshards(bases, pre, suf, s.b, pp)
    if pp > 1 and bases.layers:
        _charge_sends(e, bases, space, s, opts)
    return e, tied


def send_seconds(bases: _Bases, space: SearchSpace, dp: int, tp: int, b: float, sp: bool) -> float:
    """Seconds of one chunk's sends per micro-batch, its activation and its gradient (sequence-sharded
    activations go as each rank's 1/t shard), on ranks of dp x tp (`_Shape`'s dp and b)."""
    cluster = bases.cluster
    across = dp * tp >= cluster.devices_per_node
    if "boundary" not in bases._cache:
        bases._cache["boundary"] = bases.graph.boundary_bytes(bases.layers[0])
    sent = bases._cache["boundary"] * b / (tp if sp else 1)
    if space.p2p_scatter_gather and tp > 1 and not sp:  # 1/t each, then an all-gather inside the tp group
        return 2 * (comm.p2p(cluster, sent / tp, across) + comm.all_gather(cluster, comm.group_for(cluster, tp, 1), sent))
    return 2 * comm.p2p(cluster, sent, across)


def _charge_sends(e: dict, bases: _Bases, space: SearchSpace, s: _Shape, opts: list[Variant]) -> None:
    """Charge the pipeline's sends to `e`: each stage's activation and its gradient per micro-batch and chunk
    (sequence-sharded activations go as each rank's 1/t shard), exposed or beside another chunk's compute."""
    cluster, pp = bases.cluster, s.pp
    send = send_seconds(bases, space, s.dp, s.tp, s.b, s.sp)
    chunks = np.full(pp, float(s.v))  # each of a device's v chunks sends on (interleaved: the last wraps round)
    chunks[-1] = s.v - 1
    if s.p2p_overlap and opts:  # beside another chunk's compute, at least one layer's (costmodel.price.streams)
        lanes = [o.timing.lanes for o in opts]
        sends = streams.overlapped_sends(send / 2, min(x.compute_fwd for x in lanes),
                                         min(x.compute_bwd for x in lanes), cluster.device.overlap_slowdown)
        e["p2p"][:], e["p2p_contention"][:], e["p2p_hidden"][:] = (
            chunks * sends.exposed, chunks * sends.contention, chunks * sends.hidden)
        # the fill's and flush's p - 1 sends each way stay exposed: the bubble priced them overlapped
        e["p2p_fill"][:] = (pp - 1) * max(0.0, send - sends.exposed - sends.contention)
        e["flush"] += e["p2p_fill"]
    else:
        e["p2p"][:] = chunks * send


def _stage_problem(bases: _Bases, space: SearchSpace, s: _Shape, opts: list[Variant], layer_bases: list[BlockOption],
                   suf: list[BlockOption], e: dict) -> tuple[StageProblem, float, dict]:
    """The stage program (planner.solve.milp) of the layers' variants and the per-stage extras, with its
    memory phases (planner.estimate.phases); and the workspace and allocator cache those predicted."""
    cluster, pp, tp, zero, dp, m = bases.cluster, s.pp, s.tp, s.zero, s.dp, s.m
    in_flight = SCHEDULES[s.schedule].in_flight(m, pp, s.v)  # micro-batches held per rank (planner.plan.schedules)
    # ZeRO-3's two layers gathered at a time (in a pipeline the states already count them all gathered)
    gathered = 2 * min(o.param_numel for o in layer_bases) * s.sb.param \
        if zero == 3 and layer_bases and not pipelined_fsdp(pp > 1, zero, dp) else 0.0
    main_mem, phases, workspace, cache = memory_phases(bases, opts, e, in_flight, m, s.b, pp, tp, zero, dp, s.sb,
                                                       s.sp, suf, gathered, cluster.device,
                                                       SCHEDULES[s.schedule].edge_in_flight(m, pp, s.v), s.v)
    column = lambda attr, empty=0.0: np.array([getattr(o, attr) for o in opts] or [empty])
    problem = StageProblem(
        num_stages=pp, num_layers=len(bases.layers), num_microbatches=m,
        option_time=column("time"), option_state=column("state"), option_act=column("act"),
        option_flush=column("flush"),
        extra_time=e["compute"] + e["tp"] + e["zero"] + e["p2p"] + e["p2p_contention"], extra_mem=main_mem,
        extra_flush=e["flush"], in_flight=in_flight,
        capacity=capacity_less_cache(cluster.device, cluster.device.allocator_cache_bytes(cache["stages"])),
        virtual_stages=s.v, phases=phases, option_grad=column("grad"),
        grads_absent=grads_absent(m, in_flight, zero, dp, tp),
        must_use=np.array([tp > 1 and o.sharding in SPLIT for o in opts] or [False]),
        count_use=counted_full_recompute(opts, space), stage_layers=pinned_layers(space, pp),
        option_host_state=column("host_state"), option_host_act=column("host_act"),
        host_capacity=cluster.device.host_memory_bytes,
        option_rank=np.array([o.complexity for o in opts] or [0], dtype=float))
    return problem, workspace, cache


def _edge_reshards(bases: _Bases, pre: list[BlockOption], suf: list[BlockOption], b: int, pp: int) -> np.ndarray:
    """Per-stage seconds, per micro-batch, of resharding where a group left replicated (layout "R": an
    embedding or head that cannot be split) exchanges activations with a sequence-sharded one ("S").
    By costmodel.price.reshard's rules R -> S is a local slice whose backward all-gathers the gradient, and
    S -> R an all-gather in forward whose backward is a slice: one all-gather over the tp group of each
    activation crossing such an edge of the graph, charged to the stage holding the embedding or head."""
    tp = next(iter((*pre, *suf))).tp if (pre or suf) else 1
    key = ("edges", tp)
    if key not in bases._cache:  # bytes per sample crossing R/S edges, at the first and at the last stage
        layout = {grp: o.layout for grp, o in zip((*bases.prefix, *bases.suffix), (*pre, *suf))}
        g = bases.graph.g
        first, last = [], []
        for n, d in g.nodes(data=True):
            if d["op"] in ("placeholder", "get_attr") or d["via_user"] or not d["out_bytes"]:
                continue
            src = d["group"]
            for dst in {g.nodes[x]["group"] for x in g.successors(n)} - {src}:
                if layout.get(src, "S") != layout.get(dst, "S"):
                    (first if src in bases.prefix or dst in bases.prefix else last).append(d["out_bytes"])
        bases._cache[key] = (first, last)
    first, last = bases._cache[key]
    group = comm.group_for(bases.cluster, tp, 1)
    out = np.zeros(pp)
    out[0] += sum(comm.all_gather(bases.cluster, group, x * b) for x in first)
    out[-1] += sum(comm.all_gather(bases.cluster, group, x * b) for x in last)
    return out


HEAVY_EXTRAS = 1 / 3
"""Use the general per-block program when the groups outside the repeated run hold more than this share of
the forward FLOPs (an encoder beside a decoder, a CNN's stages): pinning them to the first and last
stage would unbalance the pipeline."""


def use_block_program(graph: OpGraph, prefix, layers, suffix) -> bool:
    if not layers:
        return len(graph.groups) > 1
    total = graph.totals()["fwd_flops"] or 1
    extra = sum(graph.group_cost(g).fwd_flops for g in (*prefix, *suffix))
    return extra > HEAVY_EXTRAS * total


def build_block_candidate(bases: _Bases, train: TrainConfig, space: SearchSpace, pp: int, dp: int, tp: int,
                          zero: int, b: int, schedule: str = "1F1B") -> Candidate | None:
    """A candidate for the general program: every group is a block with its own variants."""
    bases = bases.running(train, zero)
    graph, cluster = bases.graph, bases.cluster
    m = train.global_batch // (dp * b)
    sb = model_state_bytes(train, zero)
    opts: list[Variant] = []
    block_of: list[int] = []
    for i, grp in enumerate(graph.groups):
        mine = [replicate_option(graph, grp, cluster, tp)]
        if tp > 1:
            t = tensor_option(graph, grp, cluster, tp)
            mine += [t] if t is not None else []
        vs = variants(mine, cluster, sb, zero, dp, tp, b, space.recompute, space.offload, pipelined=pp > 1,
                      zero1_broadcast=zero1_broadcast(space),
                      keep_gathered=space.keep_gathered, kernels=space.kernels, prune=_prune(space))
        opts += vs
        block_of += [i] * len(vs)
    must = np.array([tp > 1 and o.sharding in SPLIT for o in opts])
    if tp > 1 and not must.any():
        return None
    dp_group = comm.group_for(cluster, dp, tp)
    latency = comm.affine(comm.all_reduce, cluster, dp_group)[0] if zero <= 1 else 0.0
    latency += step_sync(cluster)
    across = dp * tp >= cluster.devices_per_node
    boundary = np.array([2 * comm.p2p(cluster, graph.boundary_bytes(g) * b, across) for g in graph.groups[:-1]])
    in_flight = SCHEDULES[schedule].in_flight(m, pp)
    max_out = max([graph.g.nodes[n]["out_bytes"] for n in graph.g.nodes] or [0])
    workspace = 2.0 * max_out * b + max(o.base.saved_bytes for o in opts) * b
    if zero == 3 and not pipelined_fsdp(pp > 1, zero, dp):  # (a pipeline's states count every layer gathered)
        workspace += 2 * max(o.base.param_numel for o in opts) * sb.param
    if zero == 1 and zero1_broadcast(space):  # (options.zero1_excess)
        workspace += sb.optimizer * zero1_state_excess(bases, pp, dp, tp, anywhere=True).max()
    col = lambda attr: np.array([getattr(o, attr) for o in opts], dtype=float)
    problem = BlockProblem(
        num_stages=pp, num_microbatches=m, block_of=np.array(block_of), time=col("time"), state=col("state"),
        act=col("act"), flush=col("flush"), boundary_time=boundary, in_flight=in_flight,
        capacity=capacity_less_cache(cluster.device, cluster.device.allocator_cache_bytes(widest_product(graph) * b / tp)),
        workspace=workspace, flush_latency=latency,
        host_state=col("host_state"), host_act=col("host_act"), host_capacity=cluster.device.host_memory_bytes,
        must_use=must, count_use=counted_full_recompute(opts, space), rank=col("complexity"))
    if "tied_blocks" not in bases._cache:
        bases._cache["tied_blocks"] = tied_across_stages(graph, graph.groups[:1], graph.groups[-1:])
    tied = _charge_tied_blocks(problem, bases._cache["tied_blocks"], graph.groups, cluster, sb, zero, dp, tp, pp)
    per_block_min = [problem.time[problem.block_of == i].min() for i in range(problem.num_blocks)]
    per_block_flush = [problem.flush[problem.block_of == i].min() for i in range(problem.num_blocks)]
    lb = (m + pp - 1) / pp * sum(per_block_min) + (sum(per_block_flush) + pp * latency) / pp
    zeros = np.zeros(pp)
    parts = {"e_compute": zeros, "e_tp": zeros, "e_zero": zeros, "e_zero_flush": zeros, "e_p2p": zeros.copy(),
             "e_state": zeros,
             "e_act": zeros, "e_flush": zeros + latency, "e_dp": zeros + latency, "workspace": workspace,
             "tied": tied}
    parts["e_dp"][-1] += sum(t["allreduce_s"] for t in tied)  # the breakdown's share of the last stage's flush
    return Candidate(pp=pp, dp=dp, tp=tp, zero=zero, micro_batch=b, num_microbatches=m, schedule=schedule,
                     virtual_stages=1, lower_bound=lb, problem=problem, options=opts, parts=parts,
                     formulation="blocks")


def enumerate_candidates(graph: OpGraph, cluster: Cluster, train: TrainConfig, space: SearchSpace):
    """(prefix, layers, suffix, every candidate of the space), each built (`build_candidate`). The search
    builds the uniform-layer ones lazily instead, in order of a cheap bound (planner.enumerate.lazy)."""
    space = executable_space(graph, space)
    prefix, layers, suffix = split_model(graph)
    bases = _Bases(graph, cluster, prefix, layers, suffix)
    if use_block_program(graph, prefix, layers, suffix):
        # (a heterogeneous cluster is planned on its conservative device view here)
        return [], [], [], _enumerate_blocks(bases, cluster, train, space)
    if cluster.groups and cluster.heterogeneous:
        return prefix, layers, suffix, _enumerate_hetero(bases, cluster, train, space)
    built = (build_candidate(bases, train, space, *choice) for choice in candidate_choices(bases, train, space))
    return prefix, layers, suffix, [c for c in built if c is not None]


def candidate_choices(bases: _Bases, train: TrainConfig, space: SearchSpace):
    """Every (pp, dp, tp, zero, b, schedule, v, sp, cp, ep, tp_overlap, p2p_overlap) of a uniform-layer model
    that `build_candidate` is asked to build (it may still answer None)."""
    graph, layers = bases.graph, bases.layers
    experts = experts_of(graph, layers[0]) if layers else None
    cps = space.cp or default_cp(graph.seq_len, cp_refusal(graph, layers, 2) is None and
                                 cp_refusal_for(graph.name) is None)
    for pp, dp, tp, zero, b, m, cp in _meshes(bases.cluster, train, space, max(1, len(layers)), cps):
        eps = [e for e in (space.ep or default_ep(experts, dp)) if ep_refusal(experts, dp, e) is None
               and (cp == 1 or e == 1)]  # cp with ep: expert groups would span dp x cp ranks (not priced)
        eps = [e for e in eps if _runs_or_fixed(space, pp, tp, cp, e)]
        eps = [e for e in eps if _zero_runs_or_fixed(space, zero, tp, cp, e)]
        tp_overlaps, p2p_overlaps = overlap_choices(space)
        sps = space.sequence_parallel if tp > 1 else (False,)
        for schedule, v in _schedules(train.schedule, pp, m, len(layers), space.virtual_stages):
            for sp, ep, tpo, p2po in itertools.product(sps, eps, tp_overlaps, p2p_overlaps):
                if (tpo and not sp) or (p2po and v == 1):
                    continue  # TP overlap pipelines sequence parallelism's collectives; send overlap, chunks' sends
                yield pp, dp, tp, zero, b, schedule, v, sp, cp, ep, tpo, p2po


def _enumerate_blocks(bases: _Bases, cluster: Cluster, train: TrainConfig, space: SearchSpace) -> list[Candidate]:
    out = []
    for pp, dp, tp, zero, b, m, _ in _meshes(cluster, train, space, len(bases.graph.groups)):
        if train.schedule != AUTO and SCHEDULES[train.schedule].virtual and pp > 1:
            continue  # interleaving is planned for repeated layers only
        schedule = _plain_schedule(train, pp, m)
        if not _zero_runs_or_fixed(space, zero, tp, 1, 1) or schedule is None:
            continue
        c = build_block_candidate(bases, train, space, pp, dp, tp, zero, b, schedule)
        if c is not None:
            out.append(c)
    return out


def executable_space(graph: OpGraph, space: SearchSpace) -> SearchSpace:
    """`space` within what the runtime executes (planner.plan.executable): pp=1 only for a model a pipeline
    cannot run; PartitaError, one line, when the user fixed pp > 1 for such a model, or a cp or ep the
    model cannot run (planner.enumerate.cp_ep)."""
    _, layers, _ = split_model(graph)
    for cp in sorted(space.cp or ()):
        if (why := cp_refusal(graph, layers, cp)) is not None:
            raise PartitaError(f"cp={cp} cannot run: {why}")
    if space.ep and max(space.ep) > 1 and (layers and experts_of(graph, layers[0])) is None:
        raise PartitaError(f"ep={max(space.ep)} cannot run: expert parallelism shards mixture-of-experts "
                           "layers, and this model has none")
    why = pipeline_refusal_for(graph.name)
    if why is None or space.pp == (1,):
        return space
    if space.pp is not None and 1 not in space.pp:
        raise PartitaError(f"pp={'|'.join(map(str, space.pp))} cannot run: {why}")
    return dataclasses.replace(space, pp=(1,))

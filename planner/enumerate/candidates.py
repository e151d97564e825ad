"""Candidates: one mesh, ZeRO stage, micro-batch size and schedule, turned into a stage program.

`build_candidate` costs every layer variant for the candidate (planner.enumerate.options), charges the blocks
outside the repeated layers (embeddings, head) to the first and last stage, adds pipeline sends and
resharding, builds the memory phases (planner.estimate.phases) and a lower bound on the step time,

    LB = ((m - 1/v) / p + 1/v) * (L * min_o T_o + E) + (L * min_o D_o + F) / p

(the bottleneck is at least the average stage; the flush at least its average), which the search
(planner.search) uses to prune. Heterogeneous clusters (`build_hetero_candidate`) and irregular graphs
(`build_block_candidate`, planner.solve.milp_blocks) have their own builders.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import numpy as np

from partita.costmodel.price import comm, streams
from partita.costmodel.errors import PartitaError
from partita.costmodel.capture.graph import OpGraph
from partita.costmodel.hardware import Cluster
from partita.costmodel.price.memory import state_bytes
from partita.planner.enumerate.cp_ep import cp_refusal, default_cp, default_ep, ep_refusal, experts_of
from partita.costmodel.hardware.stacks import get_stack
from partita.planner.plan.executable import (composition_refusal, cp_refusal_for, pipeline_refusal_for, runs_autocast,
                                        zero_refusal)
from partita.planner.solve.milp import StageProblem, StageSolution
from partita.planner.solve.milp_blocks import BlockProblem
from partita.planner.enumerate.options import (Variant, cost_variant, pareto_indices, pipelined_fsdp, variants, zero1_excess,
                                     zero_state_bytes)
from partita.planner.estimate.phases import grads_absent, memory_phases, widest_product
from partita.planner.enumerate.space import (SearchSpace, TrainConfig, _meshes, _micro_batch_allowed, _schedules, divisors,
                                   overlap_choices, micro_batch_cap)
from partita.planner.plan import SPLIT
from partita.planner.plan.schedules import AUTO, SCHEDULES
from partita.planner.enumerate.strategies import BlockOption, replicate_option, sequence_option, tensor_option


@dataclass
class Candidate:
    """One mesh, ZeRO stage and micro-batch size, with its program and (if solved) its solution."""

    pp: int
    dp: int
    tp: int
    zero: int
    micro_batch: int
    num_microbatches: int
    schedule: str
    virtual_stages: int
    lower_bound: float
    problem: StageProblem
    options: list[Variant]
    parts: dict                     # prefix/suffix components for the breakdown
    solution: StageSolution | None = None
    pruned: bool = False
    sequence_parallel: bool = False
    cp: int = 1
    """Context-parallel ranks per sequence (planner.enumerate.cp_ep); the mesh has pp x dp x cp x tp ranks."""
    ep: int = 1
    """Expert-parallel ranks per MoE layer's experts, among the dp ranks (planner.enumerate.cp_ep)."""
    formulation: str = "counts"
    """"counts" (planner.solve.milp: identical layers) or "blocks" (planner.solve.milp_blocks: any chain)."""
    tp_overlap: bool = False
    """The layers' TP collectives overlap their GEMMs (costmodel.price.streams.tp_overlap; sequence parallel only)."""
    p2p_overlap: bool = False
    """The pipeline's sends overlap other chunks' compute (costmodel.price.streams.overlapped_sends; interleaved)."""

    @property
    def step_time(self) -> float:
        return self.solution.objective if self.solution and self.solution.feasible else float("inf")

    @property
    def key(self) -> tuple:
        return (self.pp, self.dp, self.tp, self.zero, self.micro_batch, self.schedule, self.virtual_stages,
                self.sequence_parallel, self.cp, self.ep, self.tp_overlap, self.p2p_overlap)


def plan_key(plan) -> tuple:
    """`Candidate.key` of the candidate a Plan (planner.plan) was built from, read off the plan's fields."""
    return (plan.mesh.pp, plan.mesh.dp, plan.mesh.tp, plan.zero_stage, plan.schedule.micro_batch_size,
            plan.schedule.name, plan.schedule.virtual_stages, any(b.sharding == "sequence" for b in plan.blocks),
            plan.mesh.cp, plan.mesh.ep, bool(plan.overlap.get("tp_comm")), bool(plan.overlap.get("p2p")))


def split_model(graph: OpGraph) -> tuple[list[str], list[str], list[str]]:
    """(prefix groups, repeated layers, suffix groups)."""
    layers = graph.repeated()
    if not layers:
        return list(graph.groups), [], []
    i, j = graph.groups.index(layers[0]), graph.groups.index(layers[-1])
    return graph.groups[:i], layers, graph.groups[j + 1:]


class _Bases:
    """Sharding options per tensor-parallel degree, computed once per search."""

    def __init__(self, graph: OpGraph, cluster: Cluster, prefix, layers, suffix):
        self.graph, self.cluster = graph, cluster
        self.prefix, self.layers, self.suffix = prefix, layers, suffix
        self._cache: dict[int, tuple] = {}
        self._others: dict = {}

    def for_cluster(self, cluster: Cluster) -> "_Bases":
        """The same model's options costed on another (group's) devices."""
        if cluster is self.cluster:
            return self
        key = id(cluster)
        if key not in self._others:
            self._others[key] = _Bases(self.graph, cluster, self.prefix, self.layers, self.suffix)
        return self._others[key]

    def running(self, train: TrainConfig, zero: int) -> "_Bases":
        """The options of the model as the runtime runs a candidate with this ZeRO stage: under autocast
        (planner.plan.executable.runs_autocast; OpGraph.as_run) or as captured."""
        how = "autocast" if runs_autocast(train.dtype, zero, train.autocast, train.master_weights) else "as-captured"
        key = ("run", how)
        if key not in self._others:  # (as_run copies the whole graph: once per search, not per candidate)
            graph = self.graph.as_run(how)
            self._others[key] = self if graph is self.graph else _Bases(graph, self.cluster, self.prefix,
                                                                        self.layers, self.suffix)
        return self._others[key]

    def get(self, tp: int, sp: bool = False):
        """(layer options, prefix options, suffix options, largest activation) for tp ranks, with
        sequence parallelism or without. Under sequence parallelism the layers' only option is the
        sequence-parallel split (a replicated layer would gather its input and slice its output)."""
        if (tp, sp) not in self._cache:
            g, c = self.graph, self.cluster
            layer = []
            if self.layers:
                if sp:
                    o = sequence_option(g, self.layers[0], c, tp)
                    layer = [o] if o is not None else []
                else:
                    layer = [replicate_option(g, self.layers[0], c, tp)]
                    if tp > 1:
                        t = tensor_option(g, self.layers[0], c, tp)
                        layer = layer + ([t] if t is not None else [])
            split = sequence_option if sp else tensor_option
            extra = lambda grp: (tp > 1 and split(g, grp, c, tp)) or replicate_option(g, grp, c, tp)
            pre = [extra(grp) for grp in self.prefix]
            suf = [extra(grp) for grp in self.suffix]
            max_out = max([g.g.nodes[n]["out_bytes"] for n in g.g.nodes] or [0])
            self._cache[(tp, sp)] = (layer, pre, suf, max_out)
        return self._cache[(tp, sp)]


DDP_BUCKET_BYTES = 25 * 2**20
"""torch DistributedDataParallel's default bucket_cap_mb (25 MiB)."""


def step_sync(cluster: Cluster) -> float:
    """Seconds of the one collective every training step issues whatever the plan: the runtime
    all-reduces the step's loss (one fp32 scalar) over all ranks before the optimizer step
    (runtime/loop/session.py), t = comm.all_reduce(all devices, 4 bytes); 0 on one device."""
    return comm.all_reduce(cluster, comm.group_for(cluster, cluster.num_devices, 1), 4)


def zero1_broadcast(space: SearchSpace) -> bool:
    """Whether ZeRO-1 is priced as partita's runtime runs it (a broadcast of the parameters after the step,
    planner.enumerate.options) or as Megatron's distributed optimizer (the stack partita does not run)."""
    return get_stack(space.stack).partita_runs


def zero1_state_excess(bases: _Bases, pp: int, dp: int, tp: int, anywhere: bool = False) -> np.ndarray:
    """Per stage, the parameters the busiest rank steps beyond n / dp under ZeRO-1 as partita's runtime
    partitions them (options.zero1_excess, whole tensors, 1/tp of each under tensor parallelism): exact for
    one stage; for pp stages, whose layers the program places, Graham's bound for greedy assignment --
    (1 - 1/dp) x the largest tensor the stage may hold (`anywhere`: any group on any stage, as the general
    program places them; else the prefix on the first stage, the suffix on the last, layers anywhere)."""
    key = ("zero1_excess", pp, dp, tp, anywhere)
    if key not in bases._cache:
        g = bases.graph
        sizes = lambda groups: [n / tp for grp in groups for node in g.nodes_of(grp)
                                for n in g.g.nodes[node]["params"].values()]
        largest = lambda groups: max(sizes(groups), default=0.0)
        if pp == 1:
            out = np.array([zero1_excess(sizes(g.groups), dp)])
        elif anywhere:
            out = np.full(pp, largest(g.groups) * (1 - 1 / dp))
        else:
            layer = largest(bases.layers[:1])
            out = np.full(pp, layer)
            out[0], out[-1] = max(layer, largest(bases.prefix)), max(layer, largest(bases.suffix))
            out *= 1 - 1 / dp
        bases._cache[key] = out
    return bases._cache[key]


def _add_extra_costs(e: dict, s: int, options, cluster: Cluster, sb, zero: int, dp: int, tp: int, b: int,
                     ddp_overlap: bool = False, pipelined: bool = False, zero1_bcast: bool = True) -> None:
    """Charge the prefix or suffix blocks (embeddings, head) of stage s to the per-stage arrays `e`
    ("zero": what the stream model exposes of their ZeRO and offload traffic, and its contention;
    "zero_flush": the same of the ZeRO traffic issued once per step)."""
    for o in options:
        var = cost_variant(Variant(o), cluster, sb, zero, dp, tp, b, ddp_overlap, pipelined=pipelined,
                           zero1_broadcast=zero1_bcast)
        e["compute"][s] += var.compute
        e["tp"][s] += var.tp_comm
        e["zero"][s] += max(0.0, var.time - var.tp_comm - var.compute)
        e["state"][s] += var.state
        e["grad"][s] += var.grad
        e["act"][s] += var.act
        e["flush"][s] += var.flush
        e["zero_flush"][s] += var.zero_flush
        e["dp"][s] += var.dp_comm


def counted_full_recompute(opts, space: SearchSpace) -> tuple[np.ndarray, int] | None:
    """The stage program's fixed count (planner.solve.milp, count_use): the options that recompute in full and
    how many layers must take one (SearchSpace.full_recompute_layers); None when the search chooses."""
    if space.full_recompute_layers is None:
        return None
    return np.array([o.recompute == "full" for o in opts], dtype=bool), space.full_recompute_layers


def pinned_layers(space: SearchSpace, pp: int) -> np.ndarray | None:
    """The stage program's pinned split (planner.solve.milp, n_s): SearchSpace.stage_layers, for its pp."""
    if space.stage_layers is None:
        return None
    assert len(space.stage_layers) == pp, (space.stage_layers, pp)  # SearchSpace fixed pp to its length
    return np.array(space.stage_layers)


def model_state_bytes(train: TrainConfig, zero: int):
    """Model-state bytes per parameter (costmodel.price.memory) as the runtime holds them at this ZeRO stage."""
    return state_bytes(train.dtype, train.optimizer, runs_autocast(train.dtype, zero, train.autocast, train.master_weights),
                       train.master_weights)


def _prune(space: SearchSpace) -> bool:
    """Drop dominated layer variants (planner.enumerate.options.pareto), unless the number of fully recomputed
    layers is fixed: a dominated full-recompute variant may then be the one a layer must take."""
    return space.full_recompute_layers is None


def build_candidate(bases: _Bases, train: TrainConfig, space: SearchSpace, pp: int, dp: int, tp: int,
                    zero: int, b: int, schedule: str = "1F1B", v: int = 1, sp: bool = False, cp: int = 1,
                    ep: int = 1, tp_overlap: bool = False, p2p_overlap: bool = False) -> Candidate | None:
    bases = bases.running(train, zero)
    graph, cluster, layers = bases.graph, bases.cluster, bases.layers
    m = train.global_batch // (dp * b)
    mesh_dp, micro_batch = dp, b
    # context parallelism (planner.enumerate.cp_ep): a rank runs b / cp samples' worth of every sequence, and the
    # dp x cp ranks holding the same parameters shard and reduce them as data-parallel ranks do
    dp, b = dp * cp, (b / cp if cp > 1 else b)
    sb = model_state_bytes(train, zero)
    layer_bases, pre, suf, max_out = bases.get(tp, sp)
    if tp > 1 and layers and not any(o.name in SPLIT for o in layer_bases):
        return None  # the layers cannot be split over tp ranks
    # the runtime's DDP (one stage, no tensor parallelism) reduces gradient buckets during the backward
    ddp = zero <= 1 and dp > 1 and tp == 1 and pp == 1
    # the same variants serve every pipeline depth and schedule of this (tp, dp, ZeRO, b): costed once
    # (a pipeline stage syncs its ZeRO gradients once per step: options.py)
    bcast = zero1_broadcast(space)
    key = ("variants", tp, sp, zero, dp, b, space.recompute, space.offload, ddp, train.dtype, train.optimizer,
           train.master_weights,
           cp, ep, pp > 1, space.keep_gathered, _prune(space), space.kernels, tp_overlap, bcast)
    layer_variants = lambda bases_, prune: variants(
        bases_, cluster, sb, zero, dp, tp, b, space.recompute, space.offload, ddp_overlap=ddp, cp=cp, ep=ep,
        pipelined=pp > 1, keep_gathered=space.keep_gathered, kernels=space.kernels, prune=prune,
        tp_overlap=tp_overlap, zero1_broadcast=bcast)
    if key not in bases._cache:
        bases._cache[key] = layer_variants(layer_bases, _prune(space))
    opts = bases._cache[key]
    if tp > 1 and layers and not any(o.sharding in SPLIT for o in opts):
        if space.tp is None:
            return None  # splitting the layers never pays on this mesh: a smaller tp does better
        # a fixed tp is priced as asked (what-if), even where a smaller one would do better
        opts = layer_variants([o for o in layer_bases if o.name in SPLIT], _prune(space))
    if tp > 1 and not layers and not any(o.name in SPLIT for o in (*pre, *suf)):
        return None  # nothing to split: the tp ranks would duplicate all work
    dp_group = comm.group_for(cluster, dp, tp)
    dp_latency = comm.affine(comm.all_reduce, cluster, dp_group)[0] if zero <= 1 else 0.0

    e = {k: np.zeros(pp) for k in ("compute", "tp", "p2p", "p2p_contention", "p2p_hidden", "p2p_fill", "state",
                                   "grad", "act", "flush", "dp", "zero", "zero_flush")}
    for s, group_opts in ((0, pre), (pp - 1, suf)):
        _add_extra_costs(e, s, group_opts, cluster, sb, zero, dp, tp, b, ddp, pp > 1, bcast)
    if "tied" not in bases._cache:
        bases._cache["tied"] = tied_across_stages(graph, bases.prefix, bases.suffix)
    tied = _charge_tied(e, bases._cache["tied"], bases.suffix, cluster, sb, zero, dp, tp, pp)
    if zero == 1 and bcast:  # whole tensors per rank: the busiest holds and steps more than 1/dp of them
        excess = zero1_state_excess(bases, pp, dp, tp)
        e["state"] += sb.optimizer * excess
        e["flush"] += excess * sb.step_traffic / (cluster.device.mem_bandwidth * cluster.device.mem_efficiency)
    e["flush"] += dp_latency + step_sync(cluster)
    e["dp"] += dp_latency + step_sync(cluster)
    if ddp:
        # the last bucket (DDP's default: 25 MiB) has no backward left to hide behind: the layers' windows
        # charged it only kappa t (their contention), so exposing it adds (1 - kappa) t
        grads = sum(o.param_numel for o in (*pre, *suf)) + len(layers) * layer_bases[0].param_numel if layers else 0
        last = comm.all_reduce(cluster, dp_group, min(DDP_BUCKET_BYTES, grads * sb.grad_comm / pp)) \
            * (1 - cluster.device.overlap_slowdown)
        e["flush"] += last
        e["dp"] += last
    if zero >= 2 and dp > 1 and opts:
        # each stage's first gathers and last reduce-scatter, per micro-batch
        e["zero"] += max(streams.edge_exposed(o.timing.lanes) for o in opts)
    if sp and layers:
        e["tp"] += _edge_reshards(bases, pre, suf, b, pp)
    if pp > 1 and layers:
        across = dp * tp >= cluster.devices_per_node
        # activation + its gradient; sequence-sharded activations go as each rank's 1/t shard
        if "boundary" not in bases._cache:
            bases._cache["boundary"] = graph.boundary_bytes(layers[0])
        sent = bases._cache["boundary"] * b / (tp if sp else 1)
        send = 2 * comm.p2p(cluster, sent, across)
        if space.p2p_scatter_gather and tp > 1 and not sp:  # 1/t each, then an all-gather inside the tp group
            send = 2 * (comm.p2p(cluster, sent / tp, across) + comm.all_gather(cluster, comm.group_for(cluster, tp, 1), sent))
        chunks = np.full(pp, float(v))  # each of a device's v chunks sends on (interleaved: the last wraps round)
        chunks[-1] = v - 1
        if p2p_overlap and opts:  # beside another chunk's compute, at least one layer's (costmodel.price.streams)
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
    in_flight = SCHEDULES[schedule].in_flight(m, pp, v)  # micro-batches held per rank (planner.plan.schedules)
    # ZeRO-3's two layers gathered at a time (in a pipeline the states already count them all gathered)
    gathered = 2 * min(o.param_numel for o in layer_bases) * sb.param \
        if zero == 3 and layer_bases and not pipelined_fsdp(pp > 1, zero, dp) else 0.0
    main_mem, phases, workspace, cache = memory_phases(bases, opts, e, in_flight, m, b, pp, tp, zero, dp, sb, sp,
                                                       suf, gathered, cluster.device)
    extra_time = e["compute"] + e["tp"] + e["zero"] + e["p2p"] + e["p2p_contention"]
    problem = StageProblem(
        num_stages=pp, num_layers=len(layers), num_microbatches=m,
        option_time=np.array([o.time for o in opts] or [0.0]),
        option_state=np.array([o.state for o in opts] or [0.0]),
        option_act=np.array([o.act for o in opts] or [0.0]),
        option_flush=np.array([o.flush for o in opts] or [0.0]),
        extra_time=extra_time, extra_mem=main_mem,
        extra_flush=e["flush"], in_flight=in_flight, capacity=capacity_less_cache(cluster.device, cluster.device.allocator_cache_bytes(cache["stages"])),
        virtual_stages=v, phases=phases, option_grad=np.array([o.grad for o in opts] or [0.0]),
        grads_absent=grads_absent(m, in_flight, zero, dp, tp),
        must_use=np.array([tp > 1 and o.sharding in SPLIT for o in opts] or [False]),
        count_use=counted_full_recompute(opts, space), stage_layers=pinned_layers(space, pp),
        option_host_state=np.array([o.host_state for o in opts] or [0.0]),
        option_host_act=np.array([o.host_act for o in opts] or [0.0]),
        host_capacity=cluster.device.host_memory_bytes,
        option_rank=np.array([o.complexity for o in opts] or [0], dtype=float))
    # (m - 1/v) t_max + sum tau / v  >=  sum tau ((m - 1/v) / p + 1 / v), as t_max >= the mean stage
    t_min = problem.option_time.min()
    lb = (SCHEDULES[schedule].lower_bound_factor(m, pp, v) * (len(layers) * t_min + extra_time.sum())
          + (len(layers) * problem.option_flush.min() + e["flush"].sum()) / pp)
    return Candidate(pp=pp, dp=mesh_dp, tp=tp, zero=zero, micro_batch=micro_batch, num_microbatches=m,
                     schedule=schedule, virtual_stages=v, lower_bound=lb, sequence_parallel=sp, cp=cp, ep=ep,
                     tp_overlap=tp_overlap, p2p_overlap=p2p_overlap, problem=problem, options=opts,
                     parts={**{f"e_{k}": x for k, x in e.items()},
                                                          "workspace": workspace, "tied": tied,
                                                          "allocator_cache": cache,
                                                          "extra_options": dict(zip((*bases.prefix, *bases.suffix),
                                                                                    (*pre, *suf)))})


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


def build_hetero_candidate(bases: _Bases, train: TrainConfig, space: SearchSpace, pp: int, dp: int, tp: int,
                           zero: int, b: int, stage_groups: list[Cluster], schedule: str = "1F1B") -> Candidate | None:
    """A candidate on a heterogeneous cluster: stage s runs on the devices of stage_groups[s].

    Every stage offers the same variants (the union of each group's Pareto-optimal ones), each costed on
    its own group's devices and links; capacities are per stage; a boundary between two groups is sent
    over the inter-group link.
    """
    bases = bases.running(train, zero)
    graph, layers = bases.graph, bases.layers
    m = train.global_batch // (dp * b)
    sb = model_state_bytes(train, zero)
    distinct = list({id(gc): gc for gc in stage_groups}.values())  # Clusters hold dicts: not hashable
    full, extras = {}, {}
    for gc in distinct:
        gb = bases.for_cluster(gc)
        layer_bases, pre, suf, _ = gb.get(tp)
        if tp > 1 and not any(o.name in SPLIT for o in layer_bases):
            return None
        full[id(gc)] = variants(layer_bases, gc, sb, zero, dp, tp, b, space.recompute, space.offload, prune=False,
                                pipelined=pp > 1, keep_gathered=space.keep_gathered, kernels=space.kernels,
                                zero1_broadcast=zero1_broadcast(space))
        extras[id(gc)] = (pre, suf)
    keep = (sorted(set().union(*(pareto_indices(full[id(gc)]) for gc in distinct))) if _prune(space)
            else list(range(len(full[id(distinct[0])]))))
    by_stage = [[full[id(gc)][i] for i in keep] for gc in stage_groups]
    opts = by_stage[0]
    if tp > 1 and not any(o.sharding in SPLIT for o in opts):
        return None
    mat = lambda attr: np.array([[getattr(o, attr) for o in row] for row in by_stage])
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
    boundary = graph.boundary_bytes(layers[0]) * b
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
    in_flight = SCHEDULES[schedule].in_flight(m, pp)
    transient = widest_product(graph) * b / tp
    max_out = max([graph.g.nodes[n]["out_bytes"] for n in graph.g.nodes] or [0])
    workspace = 2.0 * max_out * b + max(o.base.saved_bytes for o in opts) * b
    if zero == 3 and not pipelined_fsdp(pp > 1, zero, dp):  # (a pipeline's states count every layer gathered)
        workspace += 2 * min(o.base.param_numel for o in opts) * sb.param
    extra_time = e["compute"] + e["tp"] + e["zero"] + e["p2p"]
    problem = StageProblem(
        num_stages=pp, num_layers=len(layers), num_microbatches=m, option_time=mat("time"),
        option_state=mat("state"), option_act=mat("act"), option_flush=mat("flush"), extra_time=extra_time,
        extra_mem=e["state"] + in_flight * e["act"] + workspace, extra_flush=e["flush"], in_flight=in_flight,
        capacity=np.array([capacity_less_cache(gc.device, gc.device.allocator_cache_bytes(transient))
                           for gc in stage_groups]),
        must_use=np.array([tp > 1 and o.sharding in SPLIT for o in opts]),
        count_use=counted_full_recompute(opts, space), stage_layers=pinned_layers(space, pp),
        option_host_state=mat("host_state"), option_host_act=mat("host_act"),
        host_capacity=np.array([gc.device.host_memory_bytes for gc in stage_groups]),
        option_rank=np.array([o.complexity for o in opts], dtype=float))
    lb = (SCHEDULES[schedule].lower_bound_factor(m, pp)
          * (len(layers) * problem.option_time.min() + extra_time.sum())
          + (len(layers) * problem.option_flush.min() + e["flush"].sum()) / pp)
    return Candidate(pp=pp, dp=dp, tp=tp, zero=zero, micro_batch=b, num_microbatches=m,
                     schedule=schedule, virtual_stages=1,
                     lower_bound=lb, problem=problem, options=opts,
                     parts={**{f"e_{k}": v for k, v in e.items()}, "workspace": workspace, "stage_options": by_stage,
                            "stage_groups": [gc.spec for gc in stage_groups],
                            "extra_options": dict(zip((*bases.prefix, *bases.suffix),
                                                      (*extras[id(stage_groups[0])][0],
                                                       *extras[id(stage_groups[-1])][1])))})


def _enumerate_hetero(bases: _Bases, cluster: Cluster, train: TrainConfig, space: SearchSpace) -> list[Candidate]:
    """Meshes whose dp x tp block divides every group: group g hosts n_g / (dp tp) consecutive stages,
    in the resource list's order or reversed (which group takes the first, memory-hungriest stage)."""
    import math
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


def capacity_less_cache(device, cache) -> float | np.ndarray:
    """What a stage's predicted peak may reach: the device's usable memory less the allocator's predicted
    cache of the stage's transients (costmodel.hardware.Device.allocator_cache_bytes); one figure for every
    stage under a flat headroom, which stands in for the cache."""
    cache = np.asarray(cache, dtype=float)
    return device.usable_memory() - cache if device.charges_allocator_cache else device.usable_memory()


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
    space = executable_space(graph, space)
    prefix, layers, suffix = split_model(graph)
    bases = _Bases(graph, cluster, prefix, layers, suffix)
    if use_block_program(graph, prefix, layers, suffix):
        # (a heterogeneous cluster is planned on its conservative device view here)
        return [], [], [], _enumerate_blocks(bases, cluster, train, space)
    if cluster.groups and cluster.heterogeneous:
        return prefix, layers, suffix, _enumerate_hetero(bases, cluster, train, space)
    out = []
    experts = experts_of(graph, layers[0]) if layers else None
    cps = space.cp or default_cp(graph.seq_len, cp_refusal(graph, layers, 2) is None and
                                 cp_refusal_for(graph.name) is None)
    for pp, dp, tp, zero, b, m, cp in _meshes(cluster, train, space, max(1, len(layers)), cps):
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
                c = build_candidate(bases, train, space, pp, dp, tp, zero, b, schedule, v, sp, cp, ep, tpo, p2po)
                if c is not None:
                    out.append(c)
    return prefix, layers, suffix, out


def _fixed(space: SearchSpace, axis: str, value) -> bool:
    """The user fixed `axis` to `value` (the space holds it and nothing that would leave it out)."""
    values = getattr(space, axis)
    return values is not None and value in values and 1 not in values


def _runs_or_fixed(space: SearchSpace, pp: int, tp: int, cp: int, ep: int) -> bool:
    """Whether the runtime runs this composition of axes (planner.plan.executable), or the user fixed every axis
    in it (a what-if priced as asked, with a plan note): the search never picks one the runtime refuses."""
    if composition_refusal(pp, tp, cp, ep) is None:
        return True
    return all(_fixed(space, k, v) for k, v in (("pp", pp), ("tp", tp), ("cp", cp), ("ep", ep)) if v > 1)


def _zero_runs_or_fixed(space: SearchSpace, zero: int, tp: int, cp: int, ep: int) -> bool:
    """Whether the runtime runs ZeRO stage `zero` on this mesh (planner.plan.executable.zero_refusal), or the
    user fixed the stage and every axis that stops it (a what-if: `--zero 1 --tp 8` prices Megatron's
    distributed optimizer with tensor parallelism, with a plan note), or the plan is for a stack partita's
    runtime does not run (SearchSpace.stack)."""
    if zero_refusal(zero, tp, cp, ep) is None or not get_stack(space.stack).partita_runs:
        return True  # (a plan for a stack partita does not run: Megatron's distributed optimizer runs with TP)
    return space.zero == (zero,) and all(_fixed(space, k, v) for k, v in (("tp", tp), ("cp", cp), ("ep", ep))
                                         if v > 1)


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


def _plain_schedule(train: TrainConfig, pp: int, m: int) -> str | None:
    """The schedule of a candidate with one model chunk per rank (blocks, heterogeneous clusters) running m
    micro-batches over pp stages: the requested one when it runs one chunk, else what --schedule auto tries
    with one chunk (space._schedules: 1F1B, GPipe where m < pp; 1F1B for pp = 1, where every schedule is the
    same); None when the requested one refuses m over pp (1F1B with m < pp)."""
    asked = SCHEDULES.get(train.schedule)
    requested = train.schedule if asked is not None and not asked.virtual else AUTO
    return next((name for name, _ in _schedules(requested, pp, m, 0, (1,))), None)


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


@dataclass(frozen=True)
class TiedWeight:
    """A parameter held under two names whose owners are groups of the graph (a tied embedding and head)."""

    first: str
    """The name the capture counts it under (costmodel.capture.trace: the first name), and its group."""
    second: str
    first_group: str
    second_group: str
    numel: int


def tied_weights(graph: OpGraph) -> list[TiedWeight]:
    """Every tied parameter of the graph (node attribute `tied`: {second name: first name})."""
    numel, group_of = {}, {}
    for _, d in graph.g.nodes(data=True):
        for name, n in d.get("params", {}).items():
            numel.setdefault(name, n)
            group_of.setdefault(name, d["group"])
    out = {}
    for _, d in graph.g.nodes(data=True):
        for second, first in d.get("tied", {}).items():
            if first in numel and second not in out:
                out[second] = TiedWeight(first, second, group_of[first], d["group"], numel[first])
    return list(out.values())


def tied_across_stages(graph: OpGraph, first_stage: list[str], last_stage: list[str]) -> list[TiedWeight]:
    """The tied weights with one owner among the groups a pipeline puts on its first stage and the other
    among those on its last (Megatron's embedding group: input embedding and LM head). Ties within a stage
    cost nothing; ties into the repeated layers (whose stage the solver picks) are not charged."""
    first, last = set(first_stage), set(last_stage)
    return [t for t in tied_weights(graph)
            if (t.first_group in first and t.second_group in last) or (t.first_group in last and t.second_group in first)]


def _tied_terms(t: TiedWeight, cluster: Cluster, sb, zero: int, dp: int, tp: int, pp: int) -> dict:
    """The second copy's model state and grad bytes and the per-step all-reduce of its gradient (summing the
    two stages' gradients before the optimizer step, runtime/parallel/pp.py) between pipeline ranks 0 and pp - 1 of
    the same (dp, tp) coordinate: pp - 1 pipeline ranks apart, each dp x tp ranks wide. Under ZeRO 2/3
    the gradient is each dp rank's shard. Tied weights are replicated over tp (runtime/launcher/checks.py)."""
    grad_bytes = t.numel * sb.grad_comm / (dp if zero >= 2 else 1)
    seconds = comm.all_reduce(cluster, comm.group_for(cluster, 2, (pp - 1) * dp * tp), grad_bytes)
    return {"params": [t.first, t.second], "numel": t.numel, "pp_ranks": [0, pp - 1], "grad_bytes": grad_bytes,
            "allreduce_s": seconds, "state_bytes": zero_state_bytes(t.numel, sb, zero, dp)}


def _charge_tied(e: dict, tied: list[TiedWeight], last_stage: list[str], cluster: Cluster, sb, zero: int, dp: int,
                 tp: int, pp: int) -> list[dict]:
    """Charge each tied weight split over the first and last stage (pp > 1) to the per-stage arrays `e`:
    the second copy's state and gradient on the stage that holds no copy in the capture's count (the one
    of its second owner), the gradient all-reduce once per step in the last stage's flush (and its
    data-parallel-comm share of the breakdown). Returns what was charged (Candidate.parts["tied"])."""
    if pp <= 1:
        return []
    out = []
    for t in tied:
        terms = _tied_terms(t, cluster, sb, zero, dp, tp, pp)
        copy_stage = pp - 1 if t.second_group in last_stage else 0
        e["state"][copy_stage] += terms["state_bytes"]
        e["grad"][copy_stage] += terms["grad_bytes"]
        e["flush"][pp - 1] += terms["allreduce_s"]
        e["dp"][pp - 1] += terms["allreduce_s"]
        out.append(terms)
    return out


def _charge_tied_blocks(problem: BlockProblem, tied: list[TiedWeight], groups: list[str], cluster: Cluster, sb,
                        zero: int, dp: int, tp: int, pp: int) -> list[dict]:
    """`_charge_tied` for the general program: a tied weight whose owners are the first and the last group
    (on the first and last stage whatever the solver decides; `tied_across_stages` of those two groups)
    charges its copy's state to the options of the owner the capture did not count it at, and the
    gradient all-reduce to the last group's flush (the last stage's)."""
    if pp <= 1:
        return []
    out = []
    last = problem.block_of == len(groups) - 1
    for t in tied:
        terms = _tied_terms(t, cluster, sb, zero, dp, tp, pp)
        copy = problem.block_of == (0 if t.first_group == groups[-1] else len(groups) - 1)
        problem.state[copy] += terms["state_bytes"]
        problem.flush[last] += terms["allreduce_s"]
        out.append(terms)
    return out

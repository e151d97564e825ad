"""What every candidate builder shares (planner.enumerate.candidates: uniform layers, heterogeneous clusters,
the general block program): the Candidate record, the model's sharding options per tensor-parallel degree
(`_Bases`), the per-stage charges outside the layers' variants -- the step's loss all-reduce, ZeRO-1's
excess state, the prefix and suffix groups, the capacity a stage's peak may reach --, the lower bound, and
which compositions and schedules the runtime runs."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from partita.costmodel.capture.graph import OpGraph
from partita.costmodel.hardware import Cluster
from partita.costmodel.hardware.stacks import get_stack
from partita.costmodel.price import comm
from partita.costmodel.price.memory import state_bytes
from partita.planner.enumerate.options import Variant, cost_variant, zero1_excess
from partita.planner.enumerate.space import SearchSpace, TrainConfig, _schedules
from partita.planner.enumerate.strategies import replicate_option, sequence_option, tensor_option
from partita.planner.plan.executable import composition_refusal, runs_autocast, zero_refusal
from partita.planner.plan.schedules import AUTO, SCHEDULES
from partita.planner.solve.milp import StageProblem, StageSolution


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
                     ddp_overlap: bool = False, pipelined: bool = False, zero1_bcast: bool = True,
                     memo: dict | None = None) -> None:
    """Charge the prefix or suffix blocks (embeddings, head) of stage s to the per-stage arrays `e`
    ("zero": what the stream model exposes of their ZeRO and offload traffic, and its contention;
    "zero_flush": the same of the ZeRO traffic issued once per step). `memo` (a search's cache): the same
    blocks on the same rank shape cost the same at every pipeline depth and schedule, so they are costed once."""
    key = ("extras", tuple(id(o) for o in options), id(cluster), sb, zero, dp, tp, b, ddp_overlap, pipelined,
           zero1_bcast)
    hit = memo.get(key) if memo is not None else None
    if hit is None:
        sums = dict.fromkeys(("compute", "tp", "zero", "state", "grad", "act", "flush", "zero_flush", "dp"), 0.0)
        for o in options:
            var = cost_variant(Variant(o), cluster, sb, zero, dp, tp, b, ddp_overlap, pipelined=pipelined,
                               zero1_broadcast=zero1_bcast)
            for k, x in (("compute", var.compute), ("tp", var.tp_comm),
                         ("zero", max(0.0, var.time - var.tp_comm - var.compute)), ("state", var.state),
                         ("grad", var.grad), ("act", var.act), ("flush", var.flush), ("zero_flush", var.zero_flush),
                         ("dp", var.dp_comm)):
                sums[k] += x
        hit = (tuple(options), cluster, sums)  # the blocks and cluster kept alive: their ids stay theirs
        if memo is not None:
            memo[key] = hit
    for k, x in hit[2].items():
        e[k][s] += x


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
                       train.master_weights, fp32_grads=train.fp32_grads)


def _prune(space: SearchSpace) -> bool:
    """Drop dominated layer variants (planner.enumerate.options.pareto), unless the number of fully recomputed
    layers is fixed: a dominated full-recompute variant may then be the one a layer must take."""
    return space.full_recompute_layers is None


def capacity_less_cache(device, cache) -> float | np.ndarray:
    """What a stage's predicted peak may reach: the device's usable memory less the allocator's predicted
    cache of the stage's transients (costmodel.hardware.Device.allocator_cache_bytes); one figure for every
    stage under a flat headroom, which stands in for the cache."""
    cache = np.asarray(cache, dtype=float)
    return device.usable_memory() - cache if device.charges_allocator_cache else device.usable_memory()


def _lower_bound(problem: StageProblem, schedule: str, v: int = 1) -> float:
    """The lower bound of planner.enumerate.candidates' docstring, LB (solved with any stage times):
    (m - 1/v) t_max + sum tau / v  >=  sum tau ((m - 1/v) / p + 1 / v), as t_max >= the mean stage."""
    n, pp = problem.num_layers, problem.num_stages
    return (SCHEDULES[schedule].lower_bound_factor(problem.num_microbatches, pp, v)
            * (n * problem.option_time.min() + problem.extra_time.sum())
            + (n * problem.option_flush.min() + problem.extra_flush.sum()) / pp)


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


def _plain_schedule(train: TrainConfig, pp: int, m: int) -> str | None:
    """The schedule of a candidate with one model chunk per rank (blocks, heterogeneous clusters) running m
    micro-batches over pp stages: the requested one when it runs one chunk, else what --schedule auto tries
    with one chunk (space._schedules: 1F1B, GPipe where m < pp; 1F1B for pp = 1, where every schedule is the
    same); None when the requested one refuses m over pp (1F1B with m < pp)."""
    asked = SCHEDULES.get(train.schedule)
    requested = train.schedule if asked is not None and not asked.virtual else AUTO
    return next((name for name, _ in _schedules(requested, pp, m, 0, (1,))), None)

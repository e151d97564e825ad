"""The outer search: every mesh shape and micro-batch size, each solved by the stage program.

Candidates are meshes pp x dp x tp = number of devices with tp inside a node (tp | devices per node),
pp <= layers, dp | global batch, and micro-batch sizes b | global_batch / dp with m = global_batch /
(dp b) >= pp micro-batches. Each candidate gets a lower bound on its step time before it is solved,

    LB = (m + p - 1) / p * (L * min_o T_o + E) + (L * min_o D_o + F) / p

(the bottleneck is at least the average stage; the flush at least its average), and candidates are
solved in order of LB, skipping every one whose bound is no better than the best plan found. The bound
is valid, so pruning never loses the optimum.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from costmodel import comm
from costmodel.errors import InfeasibleError, PartitaError
from costmodel.graph import OpGraph
from costmodel.hardware import Cluster, GiB
from costmodel.memory import state_bytes
from planner.milp import StageProblem, StageSolution, solve_stages, min_memory
from planner.strategies import BlockOption, replicate_option, tensor_option


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """What is trained, and how."""

    global_batch: int
    """Samples per optimizer step, over all data-parallel replicas and micro-batches."""
    seq_len: int | None = None
    """Tokens per sample; None keeps the model's own."""
    dtype: str = "bf16"
    """"bf16" (bf16 parameters and activations, fp32 master weights) or "fp32"."""
    optimizer: str = "adam"
    schedule: str = "1F1B"
    """Pipeline schedule: "1F1B" or "GPipe"."""
    max_micro_batch: int = 64

    def __post_init__(self):
        if not isinstance(self.global_batch, int) or self.global_batch < 1:
            raise PartitaError(f"global batch must be a positive integer, got {self.global_batch!r}")
        if self.dtype not in ("bf16", "fp32", "fp16"):
            raise PartitaError(f"dtype {self.dtype!r} not supported; accepted: bf16, fp16, fp32")
        if self.schedule not in ("1F1B", "GPipe"):
            raise PartitaError(f"schedule {self.schedule!r} not supported; accepted: 1F1B, GPipe")


@dataclass
class Candidate:
    """One mesh and micro-batch size, with its program and (if solved) its solution."""

    pp: int
    dp: int
    tp: int
    micro_batch: int
    num_microbatches: int
    lower_bound: float
    problem: StageProblem
    options: list[BlockOption]
    parts: dict                     # per-option and per-stage components for the breakdown
    solution: StageSolution | None = None
    pruned: bool = False

    @property
    def step_time(self) -> float:
        return self.solution.objective if self.solution and self.solution.feasible else float("inf")


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


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def split_model(graph: OpGraph) -> tuple[list[str], list[str], list[str]]:
    """(prefix groups, repeated layers, suffix groups)."""
    layers = graph.repeated()
    if not layers:
        return list(graph.groups), [], []
    i, j = graph.groups.index(layers[0]), graph.groups.index(layers[-1])
    return graph.groups[:i], layers, graph.groups[j + 1:]


def _layer_options(graph: OpGraph, group: str, cluster: Cluster, tp: int) -> list[BlockOption]:
    opts = [replicate_option(graph, group, cluster, tp)]
    if tp > 1:
        t = tensor_option(graph, group, cluster, tp)
        if t is not None:
            opts.append(t)
    return opts


def _extra_option(graph: OpGraph, group: str, cluster: Cluster, tp: int) -> BlockOption:
    """Embeddings and the head: tensor-parallel when the block allows it, else replicated."""
    return (tp > 1 and tensor_option(graph, group, cluster, tp)) or replicate_option(graph, group, cluster, tp)


def build_candidate(graph: OpGraph, cluster: Cluster, train: TrainConfig, prefix, layers, suffix,
                    pp: int, dp: int, tp: int, b: int, cache: dict) -> Candidate:
    m = train.global_batch // (dp * b)
    dev = cluster.device
    sb = state_bytes(train.dtype, train.optimizer)
    if tp not in cache:
        cache[tp] = (_layer_options(graph, layers[0], cluster, tp) if layers else [],
                     [_extra_option(graph, g, cluster, tp) for g in prefix],
                     [_extra_option(graph, g, cluster, tp) for g in suffix],
                     max([graph.g.nodes[n]["out_bytes"] for n in graph.g.nodes] or [0]))
    options, pre, suf, max_out = cache[tp]
    dp_group = comm.group_for(cluster, dp, tp)
    # gradients are all-reduced in buckets (DDP): the latency is paid once per stage here, the
    # bandwidth per byte of each layer
    dp_latency, dp_per_byte = comm.affine(comm.all_reduce, cluster, dp_group)

    def dp_comm(o: BlockOption) -> float:
        return o.param_numel * sb.grad * dp_per_byte

    def flush(o: BlockOption) -> float:
        return dp_comm(o) + o.param_numel * sb.step_traffic / dev.mem_bandwidth

    compute = np.array([(o.fwd_s + o.bwd_s) * b for o in options] or [0.0])
    tpcomm = np.array([o.tp_comm_s(cluster, b) for o in options] or [0.0])
    state = np.array([float(o.param_numel * sb.total) for o in options] or [0.0])
    act = np.array([float(o.saved_bytes * b) for o in options] or [0.0])
    fl = np.array([flush(o) for o in options] or [0.0])

    e_compute, e_tp, e_p2p = np.zeros(pp), np.zeros(pp), np.zeros(pp)
    e_state, e_act, e_flush = np.zeros(pp), np.zeros(pp), np.zeros(pp)
    for s, group_opts in ((0, pre), (pp - 1, suf)):
        for o in group_opts:
            e_compute[s] += (o.fwd_s + o.bwd_s) * b
            e_tp[s] += o.tp_comm_s(cluster, b)
            e_state[s] += o.param_numel * sb.total
            e_act[s] += o.saved_bytes * b
            e_flush[s] += flush(o)
    e_flush += dp_latency
    if pp > 1 and layers:
        across = dp * tp >= cluster.devices_per_node
        send = comm.p2p(cluster, graph.boundary_bytes(layers[0]) * b, across)
        e_p2p[:-1] = 2 * send  # activation forward, its gradient backward
    in_flight = (np.array([min(pp - s, m) for s in range(pp)]) if train.schedule == "1F1B"
                 else np.full(pp, m))
    workspace = 2.0 * max_out * b
    problem = StageProblem(
        num_stages=pp, num_layers=len(layers), num_microbatches=m,
        option_time=compute + tpcomm, option_state=state, option_act=act, option_flush=fl,
        extra_time=e_compute + e_tp + e_p2p, extra_mem=e_state + in_flight * e_act + workspace,
        extra_flush=e_flush, in_flight=in_flight.astype(float), capacity=dev.usable_memory(),
        option_min_use=np.array([1 if (tp > 1 and o.name == "tensor") else 0 for o in options] or [0]))
    total_e = (e_compute + e_tp + e_p2p).sum()
    lb = ((m + pp - 1) / pp * (len(layers) * (compute + tpcomm).min() + total_e)
          + (len(layers) * fl.min() + e_flush.sum()) / pp)
    parts = {"compute": compute, "tpcomm": tpcomm, "e_compute": e_compute, "e_tp": e_tp, "e_p2p": e_p2p,
             "state_split": (sb.param, sb.grad, sb.optimizer), "e_act": e_act, "workspace": workspace,
             "dp_comm": np.array([dp_comm(o) for o in options] or [0.0]),
             "e_dp_comm": np.array([sum(dp_comm(o) for o in grp) for grp in (pre, suf)]) + dp_latency}
    return Candidate(pp=pp, dp=dp, tp=tp, micro_batch=b, num_microbatches=m, lower_bound=lb,
                     problem=problem, options=options, parts=parts)


def enumerate_candidates(graph: OpGraph, cluster: Cluster, train: TrainConfig):
    prefix, layers, suffix = split_model(graph)
    n = cluster.num_devices
    cache: dict = {}
    out = []
    for tp in divisors(min(n, cluster.devices_per_node)):
        if n % tp:
            continue
        for pp in divisors(n // tp):
            if pp > max(1, len(layers)):
                continue
            dp = n // (tp * pp)
            if train.global_batch % dp:
                continue
            local = train.global_batch // dp
            for b in divisors(local):
                m = local // b
                if b > train.max_micro_batch or (pp > 1 and m < pp):
                    continue
                c = build_candidate(graph, cluster, train, prefix, layers, suffix, pp, dp, tp, b, cache)
                if tp > 1 and not any(o.name == "tensor" for o in c.options):
                    continue  # the layers cannot be split over tp ranks
                out.append(c)
    return prefix, layers, suffix, out


def search(graph: OpGraph, cluster: Cluster, train: TrainConfig, progress=None) -> SearchResult:
    t0 = time.perf_counter()
    prefix, layers, suffix, cands = enumerate_candidates(graph, cluster, train)
    if not cands:
        raise PartitaError(f"no mesh of {cluster.num_devices} devices divides global batch {train.global_batch}: "
                           f"choose a global batch divisible by the data-parallel degree (e.g. a multiple of "
                           f"{cluster.num_devices})")
    cands.sort(key=lambda c: (c.lower_bound, c.pp, c.tp, -c.micro_batch))
    best: Candidate | None = None
    for i, c in enumerate(cands):
        if progress:
            progress(i, len(cands))
        if best is not None and c.lower_bound >= best.step_time * (1 - 1e-9):
            c.pruned = True
            continue
        c.solution = solve_stages(c.problem)
        if c.solution.feasible and (best is None or c.step_time < best.step_time * (1 - 1e-12)):
            best = c
    result = SearchResult(graph=graph, cluster=cluster, train=train, layers=layers, prefix=prefix,
                          suffix=suffix, candidates=cands, best=best, wall_time_s=time.perf_counter() - t0)
    if best is None:
        raise InfeasibleError(explain_infeasible(result))
    return result


def explain_infeasible(result: SearchResult) -> str:
    """The least memory per device any candidate needs, what dominates it, and what would make it fit."""
    best = (float("inf"), None, None)
    for c in sorted(result.candidates, key=lambda c: (-c.pp * c.tp, c.micro_batch))[:12]:
        need, counts = min_memory(c.problem)
        if need < best[0]:
            best = (need, c, counts)
    need, c, counts = best
    cap = result.cluster.device.usable_memory()
    dev = result.cluster.device.name
    if c is None:
        return f"no plan fits on {result.cluster.num_devices} x {dev}"
    prob = c.problem
    mem = (counts * (prob.option_state[None, :] + prob.in_flight[:, None] * prob.option_act[None, :])).sum(1) \
        + prob.extra_mem
    s = int(np.argmax(mem))
    act = float(counts[s] @ prob.option_act * prob.in_flight[s] + prob.in_flight[s] * c.parts["e_act"][s])
    states = float(mem[s] - act - c.parts["workspace"])
    binding = "activations" if act > states else "model states (parameters, gradients, optimizer)"
    advice = ("activations dominate: a shorter sequence, or activation recomputation / offload"
              if act > states else
              "model states dominate: more devices for pipeline/tensor parallelism, or ZeRO sharding / offload")
    return (f"no plan fits on {result.cluster.num_devices} x {dev}: the smallest footprint needs "
            f"{need / GiB:.1f} GiB per device ({binding} bind: model states {states / GiB:.1f} GiB, activations "
            f"{act / GiB:.1f} GiB for {int(prob.in_flight[s])} micro-batch(es) in flight, at pp={c.pp}, dp={c.dp}, "
            f"tp={c.tp}, micro-batch {c.micro_batch}, stage {s}) but a {dev} has {cap / GiB:.1f} GiB usable; "
            f"{advice}, or devices with more memory")

"""Per-block sharding strategies and their costs.

A block (one group of the OpGraph: a transformer layer, an embedding, the head) can run

- "replicate": every rank of the tensor-parallel group computes the whole block (t = 1 is the plain
  data-parallel case), or
- "tensor": Megatron-style tensor parallelism (Shoeybi et al. 2019). Which Linear is column- and which
  is row-parallel is not looked up by name: it is derived by propagating a sharding through the block's
  graph. A Linear fed a replicated tensor becomes column-parallel (its output sharded on the last dim);
  a Linear fed a tensor sharded on its last dim becomes row-parallel (output partial, summed by an
  all-reduce, replicated). Views, transposes, elementwise ops with broadcast operands and attention carry
  the sharded dim along; anything else that touches a sharded tensor (a norm over the sharded dim, a
  view that fixes the sharded size) makes the block ineligible. The block's output must end replicated.

Recompute policies (what a block keeps for its backward pass; the rest is re-run in the backward):
  none       everything autograd saves
  selective  only what operators with parameters (linear layers, norms) and fused attention produced,
             plus the block's input; everything else -- activations, dropout, residual adds and, when
             attention is materialised, its core (q k^T, softmax, dropout, scores x v) -- is re-run in
             the backward: little time for much memory (Korthikanti et al. 2022's trade, generalised)
  full       only the block's input; the whole forward is re-run (Chen et al. 2016)

Costs per sample of micro-batch, for one rank of the tensor-parallel group (t ranks):
  compute  = sum over nodes of max(flops / (peak * efficiency), bytes / memory bandwidth), sharded
             nodes divided by t (roofline per operator)
  tp comm  = one all-reduce of each row-parallel output in forward, and of each distinct input of the
             column-parallel layers in backward (Megatron's g and f operators)
  memory   = parameters of column/row layers divided by t (row-parallel biases replicated), saved
             activations produced by sharded nodes divided by t, the rest whole.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from costmodel import comm
from costmodel.graph import OpGraph
from costmodel.hardware import Cluster

_ALIAS_OPS = {"view", "reshape", "transpose", "permute", "contiguous", "flatten", "unflatten", "expand"}
_ELEMENTWISE = {"add", "sub", "mul", "truediv", "div", "neg", "gelu", "silu", "relu", "tanh", "sigmoid",
                "exp", "float", "to", "type_as", "dropout", "pow", "rsqrt", "sqrt", "getitem", "iadd", "imul",
                "softmax", "cat", "chunk", "split", "narrow", "masked_fill"}
_BATCHED_MATMUL = {"matmul", "bmm", "baddbmm"}
_LAST_DIM_OPS = {"softmax", "cat", "chunk", "split", "narrow"}  # fine unless along the sharded dim


@dataclass
class BlockOption:
    """One way to run one block, costed per sample (multiply by micro-batch size)."""

    name: str                      # "replicate" | "tensor"
    tp: int
    fwd_s: float                   # forward compute seconds per sample
    bwd_s: float                   # backward compute seconds per sample
    tp_comm_bytes_fwd: list[int] = field(default_factory=list)   # all-reduce sizes per sample, forward
    tp_comm_bytes_bwd: list[int] = field(default_factory=list)
    param_numel: int = 0           # parameters held per rank
    saved_bytes: int = 0           # activations saved per sample per rank
    placements: dict[str, str] = field(default_factory=dict)     # module fqn -> colwise/rowwise
    launch_s: float = 0.0          # operator launch latency per micro-batch (forward + backward), not per sample
    relaunch_by_policy: dict[str, float] = field(default_factory=dict)  # launches of a recompute re-run
    saved_by_policy: dict[str, int] = field(default_factory=dict)  # recompute policy -> saved bytes per sample
    refwd_by_policy: dict[str, float] = field(default_factory=dict)  # recompute policy -> extra seconds per sample

    def tp_comm_s(self, cluster: Cluster, micro_batch: int) -> float:
        group = comm.group_for(cluster, self.tp, 1)
        return sum(comm.all_reduce(cluster, group, b * micro_batch)
                   for b in (*self.tp_comm_bytes_fwd, *self.tp_comm_bytes_bwd))

    def time_s(self, cluster: Cluster, micro_batch: int) -> float:
        """Forward + backward seconds for one micro-batch, TP communication included (not overlapped)."""
        return (self.fwd_s + self.bwd_s) * micro_batch + self.launch_s + self.tp_comm_s(cluster, micro_batch)


def launches(d: dict) -> int:
    """Kernels a node launches in forward (a view launches none)."""
    return 0 if d["alias"] or (d["fwd_flops"] == 0 and d["mem_bytes"] == 0) else 1


BACKWARD_LAUNCHES = 2
"""Kernels the backward of a launching node takes (its input and weight gradients, or an elementwise
gradient and its accumulation)."""


def node_seconds(d: dict, cluster: Cluster, dtype: str) -> tuple[float, float]:
    """Roofline forward and backward seconds of one node (per traced sample)."""
    dev = cluster.device
    flop_rate = dev.peak(dtype) * dev.matmul_efficiency
    fwd = max(d["fwd_flops"] / flop_rate, d["mem_bytes"] / dev.mem_bandwidth)
    bwd = max(d["bwd_flops"] / flop_rate, 2 * d["mem_bytes"] / dev.mem_bandwidth)
    return fwd, bwd


def replicate_option(graph: OpGraph, group: str, cluster: Cluster, tp: int) -> BlockOption:
    fwd = bwd = 0.0
    numel = saved = 0
    for n in graph.nodes_of(group):
        d = graph.g.nodes[n]
        f, b = node_seconds(d, cluster, graph.dtype)
        fwd, bwd = fwd + f, bwd + b
        numel += sum(d["params"].values())
        saved += d["saved_bytes"]
    opt = BlockOption(name="replicate", tp=tp, fwd_s=fwd, bwd_s=bwd, param_numel=numel, saved_bytes=saved)
    _add_recompute_policies(opt, graph, group, cluster, set(), 1)
    return opt





def tensor_option(graph: OpGraph, group: str, cluster: Cluster, tp: int) -> BlockOption | None:
    """The Megatron-style split of `group` over `tp` ranks, or None when the block cannot be split."""
    roles = propagate_tp(graph, group, tp)
    if roles is None:
        return None
    sharded, placements = roles
    g = graph.g
    fwd = bwd = 0.0
    numel = saved = 0
    comm_fwd: list[int] = []
    comm_bwd_inputs: dict[str, int] = {}
    for n in graph.nodes_of(group):
        d = g.nodes[n]
        f, b = node_seconds(d, cluster, graph.dtype)
        style = placements.get(d["module"]) if d["op"] == "call_module" else None
        split = n in sharded or style is not None
        fwd += f / tp if split else f
        bwd += b / tp if split else b
        saved += d["saved_bytes"] // tp if n in sharded else d["saved_bytes"]
        for pname, pn in d["params"].items():
            replicated_bias = style == "rowwise" and pname.endswith("bias")
            numel += pn // tp if style and not replicated_bias else pn
        if style == "rowwise":
            comm_fwd.append(d["out_bytes"])
        elif style == "colwise":
            src = next(iter(g.predecessors(n)))
            comm_bwd_inputs[src] = g.nodes[src]["out_bytes"]
    opt = BlockOption(name="tensor", tp=tp, fwd_s=fwd, bwd_s=bwd, tp_comm_bytes_fwd=comm_fwd,
                      tp_comm_bytes_bwd=list(comm_bwd_inputs.values()), param_numel=numel,
                      saved_bytes=saved, placements=placements)
    split = sharded | {n for n in graph.nodes_of(group)
                       if g.nodes[n]["op"] == "call_module" and g.nodes[n]["module"] in placements}
    _add_recompute_policies(opt, graph, group, cluster, split, tp, sharded)
    return opt


def keeps_output_under_selective(d: dict) -> bool:
    """Selective recompute keeps what parametric operators and fused attention produce (module docstring)."""
    return bool(d["params"]) or d["kind"] == "scaled_dot_product_attention"


def input_bytes(graph: OpGraph, group: str) -> int:
    """Bytes of the activations entering `group` from earlier groups (what full recompute keeps)."""
    g = graph.g
    mine = set(graph.nodes_of(group))
    srcs = {p for n in mine for p in g.predecessors(n) if p not in mine}
    return sum(g.nodes[p]["out_bytes"] for p in srcs
               if g.nodes[p]["op"] not in ("placeholder", "get_attr") and not g.nodes[p]["via_user"])


def _add_recompute_policies(opt: BlockOption, graph: OpGraph, group: str, cluster: Cluster,
                            split: set[str], tp: int, sharded: set[str] | None = None) -> None:
    """Fill saved bytes and re-run seconds per recompute policy (see the module docstring)."""
    sharded = split if sharded is None else sharded
    g = graph.g
    keep_sel = 0
    rerun_sel = 0.0
    for n in graph.nodes_of(group):
        d = g.nodes[n]
        f, _ = node_seconds(d, cluster, graph.dtype)
        f = f / tp if n in split else f
        saved = d["saved_bytes"] // tp if n in sharded else d["saved_bytes"]
        if keeps_output_under_selective(d):
            keep_sel += saved
        else:
            rerun_sel += f
    inp = input_bytes(graph, group)
    lat = cluster.device.op_latency
    fwd_launch = sum(launches(g.nodes[n]) for n in graph.nodes_of(group)) * lat
    sel_launch = sum(launches(g.nodes[n]) for n in graph.nodes_of(group)
                     if not keeps_output_under_selective(g.nodes[n])) * lat
    opt.launch_s = fwd_launch * (1 + BACKWARD_LAUNCHES)
    opt.relaunch_by_policy = {"none": 0.0, "selective": sel_launch, "full": fwd_launch}
    opt.saved_by_policy = {"none": opt.saved_bytes, "selective": min(opt.saved_bytes, keep_sel + inp),
                           "full": min(opt.saved_bytes, inp)}
    opt.refwd_by_policy = {"none": 0.0, "selective": rerun_sel, "full": opt.fwd_s}


def propagate_tp(graph: OpGraph, group: str, tp: int) -> tuple[set[str], dict[str, str]] | None:
    """Propagate a tensor-parallel sharding through `group`; see the module docstring.

    Returns (nodes whose outputs are sharded, {module fqn: "colwise" | "rowwise"}), or None if the block
    cannot be split over `tp` ranks.
    """
    g = graph.g
    nodes = graph.nodes_of(group)
    in_group = set(nodes)
    dim: dict[str, int] = {}          # node -> sharded dim of its output (absent: replicated)
    placements: dict[str, str] = {}
    for n in nodes:
        d = g.nodes[n]
        shape = d["shape"]
        ins = [p for p in g.predecessors(n) if p in dim]
        if d["kind"] == "linear":
            weight = [p for p in d["params"] if p.endswith("weight")]
            out_f, in_f = _linear_dims(d, g, n)
            if not ins:
                if out_f % tp:
                    return None
                placements[d["module"]] = "colwise"
                dim[n] = len(shape) - 1
            else:
                if in_f % tp or dim[ins[0]] != len(g.nodes[ins[0]]["shape"]) - 1 or not weight:
                    return None
                placements[d["module"]] = "rowwise"
            continue
        if not ins:
            continue
        out_dim = _carry(d, [(dim[p], g.nodes[p]["shape"]) for p in ins],
                         [g.nodes[p]["shape"] for p in g.predecessors(n) if p not in dim], tp)
        if out_dim is None:
            return None
        dim[n] = out_dim
    # the block's outputs (to later groups, or the model's own outputs) must be replicated
    for n in nodes:
        succ = list(g.successors(n))
        if n in dim and (not succ or any(s not in in_group for s in succ)):
            return None
    if not placements:
        return None
    return set(dim), placements


def _linear_dims(d: dict, g, n: str) -> tuple[int, int]:
    out_f = d["shape"][-1] if d["shape"] else 0
    preds = list(g.predecessors(n))
    in_f = g.nodes[preds[0]]["shape"][-1] if preds and g.nodes[preds[0]]["shape"] else 0
    return out_f, in_f


def _carry(d: dict, sharded_ins: list[tuple[int, tuple]], other_ins: list[tuple], tp: int) -> int | None:
    """The sharded dim of a node's output given its sharded inputs, or None if the op breaks the split."""
    kind = d["kind"]
    shape = tuple(d["shape"])
    (sdim, sshape), *rest = sharded_ins
    if any(r[0] - len(r[1]) != sdim - len(sshape) for r in rest):
        return None  # sharded inputs disagree on the (right-aligned) sharded dim
    if kind == "scaled_dot_product_attention":
        return sdim if sdim == 1 and shape[1] % tp == 0 else None  # split over heads
    if kind in _BATCHED_MATMUL:  # q @ k^T, probs @ v: both operands split on the same batch (head) dim
        ok = len(sharded_ins) == 2 and not other_ins and sdim < len(sshape) - 2 and len(shape) == len(sshape)
        return sdim if ok and shape[sdim] % tp == 0 else None
    if kind in ("transpose", "permute", "view", "reshape", "flatten", "unflatten", "contiguous", "expand"):
        return _carry_shape(kind, d, sdim, sshape, shape, tp)
    if kind in _ELEMENTWISE:
        if kind in _LAST_DIM_OPS and d.get("reduce_dim") == sdim:
            return None
        right = sdim - len(sshape)  # negative, right-aligned position
        for o in other_ins:  # a replicated operand must broadcast along the sharded dim
            if o and len(o) >= -right and o[right] != 1:
                return None
        if len(shape) < -right:
            return None
        return len(shape) + right
    return None


def _carry_shape(kind: str, d: dict, sdim: int, sshape: tuple, shape: tuple, tp: int) -> int | None:
    if kind in ("transpose", "permute"):
        perm = d.get("perm")
        if perm is None:  # transpose(a, b) recorded as two dims
            a, b = d.get("dims", (None, None))
            if a is None:
                return None
            a, b = a % len(sshape), b % len(sshape)
            return b if sdim == a else a if sdim == b else sdim
        return list(perm).index(sdim)
    if kind == "contiguous":
        return sdim
    # view / reshape / flatten: the sharded input dim spans the elements of stride [inner, inner * size);
    # it stays shardable if some output dim ends at the same outer stride (that dim is then split in t
    # contiguous chunks exactly like the input), is divisible by tp, and is the one the model sizes with
    # -1 (so the same code still fits a shard).
    inner = 1
    for s in sshape[sdim + 1:]:
        inner *= s
    outer = inner * sshape[sdim]
    acc = 1
    for i in range(len(shape) - 1, -1, -1):
        if acc * shape[i] == outer:
            if shape[i] % tp or d.get("infer_dim_at", i) != i:
                return None
            return i
        acc *= shape[i]
    return None

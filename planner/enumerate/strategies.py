"""Per-block sharding strategies and their costs.

A block (one group of the OpGraph: a transformer layer, an embedding, the head) can run

- "replicate": every rank of the tensor-parallel group computes the whole block (t = 1 is the plain
  data-parallel case), or
- "tensor": Megatron-style tensor parallelism (Shoeybi et al. 2019), or
- "sequence": the same split with Megatron sequence parallelism (Korthikanti et al. 2022): what "tensor"
  leaves replicated (norms, dropout, residual adds: every position-wise op on [batch, seq, ...]) is split
  over the sequence instead, so its compute and saved activations are divided by t as well; the block
  takes and hands on its activations sharded on the sequence dim (layout "S" rather than "R").

"tensor" and "sequence" also split token embeddings and the loss over the vocabulary (Megatron's
vocab-parallel embedding and cross-entropy): a token Embedding's table is sharded by rows (each rank
looks up its rows, an all-reduce sums the partial outputs), and a Linear whose vocabulary-sharded output
reaches a cross_entropy keeps it sharded; the loss then needs three all-reduces of one float per token
(the row max, the sum of exponentials and the target logit). Which Linear is column- and which
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
  op         torchtitan's per-op selective checkpointing (its `selective_ac_option = "op"`): of the
             matrix products with a weight (linear layers), in forward order, the 1st, 3rd, 5th ...
             outputs, plus fused attention's, plus the block's input; the other products, norms and
             everything else are re-run. Between selective and full: on a Llama layer (q k v o gate up
             down) it keeps q, v, gate and down and re-runs k, o and up -- about half of selective's
             bytes for a third of the layer's matmul FLOPs re-run, a point no mix of selective and full
             layers reaches
  full       only the block's input; the whole forward is re-run (Chen et al. 2016)

Costs per sample of micro-batch, for one rank of the tensor-parallel group (t ranks):
  compute  = sum over nodes of max(flops / (peak * efficiency), bytes / memory bandwidth), sharded
             nodes divided by t (roofline per operator)
  tp comm  = one all-reduce of each row-parallel output in forward, and of each distinct input of the
             column-parallel layers in backward (Megatron's g and f operators; the runtime's DTensor layers
             reduce each column-parallel layer's input gradient separately: BlockOption.tp_comm_s); under sequence
             parallelism each all-reduce becomes a reduce-scatter and its mirror an all-gather: forward
             all-gather of each column-parallel input and reduce-scatter of each row-parallel output,
             backward the reverse (the same ring bytes, twice the latency)
  memory   = parameters of column/row layers divided by t (row-parallel biases replicated), saved
             activations produced by sharded nodes divided by t, the rest whole. Under sequence
             parallelism the rest is divided by t too, except the input a column-parallel layer keeps:
             PyTorch's ColwiseParallel saves the all-gathered (whole) tensor, where Megatron-LM keeps
             the shard and gathers again in the backward (Korthikanti's 34 s b h / t counts the shard):
             on a stack that does (costmodel.hardware.stacks.Stack.sp_saves_shard) it is 1/t too.
             Under autocast (costmodel.capture.trace) a Linear also saves a bf16 cast of its input: whole for a
             column-parallel layer (its input is replicated, or gathered), 1/t for a row-parallel one;
             and a bf16 cast of its weight, 1/t where the weight is split (`weight_saved`, per
             micro-batch: it does not grow with the batch). Selective and op recompute re-run both
             casts (runtime/parallel/recompute.py saves parametric ops' outputs, not casts); full recompute too.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from partita.costmodel.price import comm
from partita.costmodel.capture.graph import OpGraph
from partita.costmodel.hardware import Cluster
from partita.costmodel.hardware.stacks import get_stack
from partita.costmodel.price.kernels import BACKWARD_LAUNCHES, NodeTime, node_time
from partita.planner.enumerate.cp_ep import Experts, attention_kv_bytes, experts_of
from partita.planner.enumerate.tp_split import _BATCHED_MATMUL, propagate_tp, sequence_split

@dataclass
class BlockOption:
    """One way to run one block, costed per sample (multiply by micro-batch size)."""

    name: str                      # "replicate" | "tensor" | "sequence"
    tp: int
    fwd_s: float                   # forward compute seconds per sample
    bwd_s: float                   # backward compute seconds per sample
    tp_comm_bytes_fwd: list[int] = field(default_factory=list)   # all-reduce sizes per sample, forward
    tp_comm_bytes_bwd: list[int] = field(default_factory=list)
    param_numel: int = 0           # parameters held per rank
    saved_bytes: int = 0           # activations saved per sample per rank
    weight_saved: int = 0          # weight copies autograd saves (autocast's casts) per rank, per micro-batch
    placements: dict[str, str] = field(default_factory=dict)     # module fqn -> colwise/rowwise
    launch_s: float = 0.0          # operator launch latency per micro-batch (forward + backward), not per sample
    fixed_s: float = 0.0           # GEMMs' per-micro-batch seconds (costmodel.price.kernels: t(b) = b t_1 + fixed)
    refixed_by_policy: dict[str, float] = field(default_factory=dict)  # the fixed seconds a re-run repeats
    relaunch_by_policy: dict[str, float] = field(default_factory=dict)  # launches of a recompute re-run
    saved_by_policy: dict[str, int] = field(default_factory=dict)  # recompute policy -> saved bytes per sample
    refwd_by_policy: dict[str, float] = field(default_factory=dict)  # recompute policy -> extra seconds per sample
    tp_gather_fwd: list[int] = field(default_factory=list)   # sequence parallel: all-gather sizes (whole tensor)
    tp_scatter_fwd: list[int] = field(default_factory=list)  # sequence parallel: reduce-scatter sizes
    tp_gather_bwd: list[int] = field(default_factory=list)
    tp_scatter_bwd: list[int] = field(default_factory=list)
    layout: str = "R"              # activations entering and leaving: "R" replicated, "S" sequence-sharded
    tp_reduce_each_bwd: list[int] | None = None  # backward all-reduces as the runtime issues them (below)
    param_tensors: int = 0         # parameter tensors held per rank (each costs the optimizer a few operators)
    dtensor_params: int = 0        # of which DTensors (Device.sharded_param_latency each per optimizer step)
    gemm_fwd_s: float = 0.0        # of fwd_s: the column- and row-parallel GEMMs (what TP overlap hides behind)
    gemm_bwd_s: float = 0.0
    gemm_fixed_fwd: float = 0.0    # their per-micro-batch seconds (of fixed_s)
    gemm_fixed_bwd: float = 0.0
    kv_bytes: int = 0              # keys and values entering fused attention, per sample per rank (planner.enumerate.cp_ep)
    experts: Experts | None = None  # a mixture-of-experts layer's experts (planner.enumerate.cp_ep), None when dense
    _comm_memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    """(forward, forward + backward) TP seconds by (cluster, micro-batch): every variant of this option (recompute,
    offload, ZeRO ...) prices the same collectives, and the search costs thousands of them. Keyed by the
    cluster's id with the cluster kept beside the figures (so the id is never reused for another)."""

    def _comm_s(self, cluster: Cluster, micro_batch: int, reduce: list, gather: list, scatter: list) -> float:
        """The collectives' seconds (costmodel.price.comm), each also a DTensor redistribution on the CPU:
        + (number of collectives) x Device.redistribute_latency."""
        group = comm.group_for(cluster, self.tp, 1)
        b = micro_batch
        calls = len(reduce) + len(gather) + len(scatter) if self.tp > 1 else 0
        return (sum(comm.all_reduce(cluster, group, x * b) for x in reduce)
                + sum(comm.all_gather(cluster, group, x * b) for x in gather)
                + sum(comm.reduce_scatter(cluster, group, x * b) for x in scatter)
                + calls * cluster.device.redistribute_latency)

    def _tp_seconds(self, cluster: Cluster, micro_batch: int) -> tuple[float, float]:
        """(forward, forward + backward) tensor-parallel seconds, computed once per cluster and micro-batch."""
        hit = self._comm_memo.get((id(cluster), micro_batch))
        if hit is None or hit[0] is not cluster:
            fwd = self._comm_s(cluster, micro_batch, self.tp_comm_bytes_fwd, self.tp_gather_fwd, self.tp_scatter_fwd)
            bwd = self.tp_comm_bytes_bwd if self.tp_reduce_each_bwd is None else self.tp_reduce_each_bwd
            hit = (cluster, fwd, fwd + self._comm_s(cluster, micro_batch, bwd, self.tp_gather_bwd, self.tp_scatter_bwd))
            self._comm_memo[(id(cluster), micro_batch)] = hit
        return hit[1], hit[2]

    def tp_fwd_comm_s(self, cluster: Cluster, micro_batch: int) -> float:
        """Tensor-parallel communication of the forward alone (what a recompute re-run repeats)."""
        return self._tp_seconds(cluster, micro_batch)[0]

    def tp_comm_s(self, cluster: Cluster, micro_batch: int) -> float:
        """Forward and backward tensor-parallel communication. The backward all-reduces are
        `tp_reduce_each_bwd` when set: the runtime's column-parallel layers (DTensor ColwiseParallel on a
        plain, replicated input) each all-reduce their own input gradient, so q, k and v reading one
        tensor issue three all-reduces of it where Megatron's f operator issues one
        (`tp_comm_bytes_bwd`, one per distinct input)."""
        return self._tp_seconds(cluster, micro_batch)[1]

    def layout_copy_s(self, cluster: Cluster, micro_batch: float, samples: float) -> tuple[float, float]:
        """(forward, backward) seconds of the copies that re-lay batch-first activations around each
        sequence-parallel collective (costmodel.hardware.stacks.Stack.sp_batch_first): each all-gather's whole
        output and each reduce-scatter's whole input read and written once, on the compute stream. None with one
        sample per micro-batch (`samples`: the rank's micro-batch before a context-parallel split; `micro_batch`
        sizes the tensors, as in the collectives) or where the stack gathers in place."""
        if self.tp <= 1 or samples <= 1 or not get_stack(cluster.device.stack).sp_batch_first:
            return 0.0, 0.0
        dev = cluster.device
        per_byte = 2 * micro_batch / (dev.mem_bandwidth * dev.mem_efficiency)
        return (per_byte * (sum(self.tp_gather_fwd) + sum(self.tp_scatter_fwd)),
                per_byte * (sum(self.tp_gather_bwd) + sum(self.tp_scatter_bwd)))

    def gemm_s(self, micro_batch: float) -> tuple[float, float]:
        """(forward, backward) seconds of the tensor-parallel GEMMs for one micro-batch: the window the
        block's TP collectives overlap under tp_comm_overlap (costmodel.price.streams.tp_overlap)."""
        return (self.gemm_fwd_s * micro_batch + self.gemm_fixed_fwd,
                self.gemm_bwd_s * micro_batch + self.gemm_fixed_bwd)

    def time_s(self, cluster: Cluster, micro_batch: int) -> float:
        """Forward + backward seconds for one micro-batch, TP communication included (not overlapped)."""
        return ((self.fwd_s + self.bwd_s) * micro_batch + self.fixed_s + self.launch_s
                + self.tp_comm_s(cluster, micro_batch))




def launches(d: dict) -> int:
    """Kernels a node launches in forward (a view launches none)."""
    return 0 if d["alias"] or (d["fwd_flops"] == 0 and d["mem_bytes"] == 0) else 1




def node_seconds(d: dict, cluster: Cluster, dtype: str, tp: int = 1, style: str | None = None,
                 split: bool = False) -> NodeTime:
    """Seconds of one node for one rank of the tensor-parallel group (costmodel.price.kernels: by kernel kind
    and shape): per traced sample, and per micro-batch. A column-parallel (or vocabulary-split) Linear
    works on N / t output features, a row-parallel one on K / t input features; any other node in
    `split` does 1/t of the same-shaped work."""
    if tp > 1 and style in ("colwise", "vocab") and d["kind"] == "linear":
        return node_time(d, cluster.device, dtype, n_div=tp)
    if tp > 1 and style == "rowwise" and d["kind"] == "linear":
        return node_time(d, cluster.device, dtype, k_div=tp)
    return node_time(d, cluster.device, dtype, share=1 / tp if split and tp > 1 else 1.0)


def replicate_option(graph: OpGraph, group: str, cluster: Cluster, tp: int) -> BlockOption:
    fwd = bwd = 0.0
    numel = saved = weights = 0
    fixed = 0.0
    for n in graph.nodes_of(group):
        d = graph.g.nodes[n]
        t = node_seconds(d, cluster, graph.dtype)
        fwd, bwd, fixed = fwd + t.fwd, bwd + t.bwd, fixed + t.fixed_fwd + t.fixed_bwd
        numel += sum(d["params"].values())
        saved += d["saved_bytes"]
        weights += d.get("weight_saved_bytes", 0)
    opt = BlockOption(name="replicate", tp=tp, fwd_s=fwd, bwd_s=bwd, param_numel=numel, saved_bytes=saved,
                      weight_saved=weights,
                      param_tensors=sum(len(graph.g.nodes[n]["params"]) for n in graph.nodes_of(group)),
                      fixed_s=fixed)
    _add_recompute_policies(opt, graph, group, cluster, set(), 1)
    opt.kv_bytes, opt.experts = attention_kv_bytes(graph, group), experts_of(graph, group)
    return opt





def tensor_option(graph: OpGraph, group: str, cluster: Cluster, tp: int) -> BlockOption | None:
    """The Megatron-style split of `group` over `tp` ranks, or None when the block cannot be split."""
    return _split_option(graph, group, cluster, tp, sequence=False)


def sequence_option(graph: OpGraph, group: str, cluster: Cluster, tp: int) -> BlockOption | None:
    """The Megatron split with sequence parallelism (module docstring), or None when `group` cannot run
    it: an op outside the tensor-parallel regions that mixes positions, or a sequence not divisible by tp."""
    return _split_option(graph, group, cluster, tp, sequence=True)


def _split_option(graph: OpGraph, group: str, cluster: Cluster, tp: int, sequence: bool) -> BlockOption | None:
    """The "tensor" (or, `sequence`, "sequence") option of `group` over tp ranks (module docstring); None when
    the block cannot be split so."""
    roles = propagate_tp(graph, group, tp, allow_empty=sequence)
    if roles is None:
        return None
    sharded, placements = roles
    g = graph.g
    seq = sequence_split(graph, group, tp, sharded, placements) if sequence else set()
    if seq is None or (sequence and not seq and not placements):
        return None
    # a cross_entropy of vocabulary-sharded logits: its softmax is sharded too (output replicated)
    loss = {n for n in graph.nodes_of(group) if g.nodes[n]["kind"] == "cross_entropy"
            and next(iter(g.predecessors(n))) in sharded}
    sharded = sharded | loss
    c = _split_costs(graph, group, cluster, tp, sequence, sharded, seq, loss, placements)
    rows_out = [g.nodes[n]["out_bytes"] for n in graph.nodes_of(group)
                if g.nodes[n]["kind"] == "linear" and placements.get(g.nodes[n]["module"]) == "rowwise"]
    opt = BlockOption(name="sequence" if sequence else "tensor", tp=tp, fwd_s=c.fwd, bwd_s=c.bwd,
                      tp_comm_bytes_fwd=c.reduce_fwd, param_numel=c.numel, saved_bytes=c.saved, placements=placements,
                      layout="S" if sequence else "R", fixed_s=c.fixed, weight_saved=c.weights)
    opt.gemm_fwd_s, opt.gemm_bwd_s, opt.gemm_fixed_fwd, opt.gemm_fixed_bwd = c.gemm
    if sequence:
        opt.tp_gather_fwd, opt.tp_scatter_fwd = list(c.col_inputs.values()), c.scatter_fwd
        opt.tp_scatter_bwd, opt.tp_gather_bwd = list(c.col_inputs.values()), rows_out
    else:
        opt.tp_comm_bytes_bwd = list(c.col_inputs.values())
        opt.tp_reduce_each_bwd = c.col_each
    split_nodes = sharded | seq | {n for n in graph.nodes_of(group)
                                   if g.nodes[n]["kind"] == "linear" and g.nodes[n]["module"] in placements}
    opt.param_tensors = sum(len(g.nodes[n]["params"]) for n in graph.nodes_of(group))
    opt.dtensor_params = sum(len(g.nodes[n]["params"]) for n in graph.nodes_of(group)
                             if g.nodes[n]["module"] in placements)
    # (under sequence parallelism the block's input arrives sharded: recompute keeps 1/t of it)
    opt.kv_bytes, opt.experts = attention_kv_bytes(graph, group) // tp, experts_of(graph, group)
    _add_recompute_policies(opt, graph, group, cluster, split_nodes, tp, sharded | seq, tp if sequence else 1,
                            dtensor_nodes=_dtensor_nodes(graph, group, sharded, seq, loss, placements),
                            placements=placements)
    return opt


@dataclass
class _SplitCosts:
    """What a split block costs one rank, summed over its nodes (per sample, and per micro-batch `fixed`)."""

    fwd: float = 0.0
    bwd: float = 0.0
    fixed: float = 0.0
    gemm: list = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])
    """The placed Linears' forward, backward per sample; forward, backward per micro-batch."""
    numel: int = 0
    saved: int = 0
    weights: int = 0
    reduce_fwd: list = field(default_factory=list)
    scatter_fwd: list = field(default_factory=list)
    col_inputs: dict = field(default_factory=dict)
    col_each: list = field(default_factory=list)
    """The input of every column-parallel layer (BlockOption.tp_comm_s)."""


def _split_costs(graph: OpGraph, group: str, cluster: Cluster, tp: int, sequence: bool, sharded: set[str],
                 seq: set[str], loss: set[str], placements: dict[str, str]) -> _SplitCosts:
    """Each node's seconds, parameters and saved bytes on one rank, and the tensor-parallel collectives'
    bytes: a row-parallel layer's (or vocab embedding's) output reduced (or, `sequence`, reduce-scattered),
    a column-parallel one's input gathered, a vocab-parallel loss's three floats per token reduced."""
    g, c = graph.g, _SplitCosts()
    keep_shard = get_stack(cluster.device.stack).sp_saves_shard  # a column-parallel input saved as its shard
    for n in graph.nodes_of(group):
        d = g.nodes[n]
        style = placements.get(d["module"]) if d["kind"] in ("linear", "embedding") else None
        split = n in sharded or n in seq or (style is not None and d["kind"] == "linear")
        t = node_seconds(d, cluster, graph.dtype, tp, style, split)
        c.fwd, c.bwd, c.fixed = c.fwd + t.fwd, c.bwd + t.bwd, c.fixed + t.fixed_fwd + t.fixed_bwd
        if d["kind"] == "linear" and style in ("colwise", "rowwise"):
            c.gemm = [a + b for a, b in zip(c.gemm, (t.fwd, t.bwd, t.fixed_fwd, t.fixed_bwd))]
        c.saved += _saved_share(g, n, tp, sharded, seq, placements, keep_shard)
        c.weights += d.get("weight_saved_bytes", 0) // (tp if style else 1)
        for pname, pn in d["params"].items():
            replicated_bias = style == "rowwise" and pname.endswith("bias")
            c.numel += pn // tp if style and not replicated_bias else pn
        if style == "rowwise" or (style == "vocab" and d["kind"] == "embedding"):
            (c.scatter_fwd if sequence else c.reduce_fwd).append(d["out_bytes"])
        elif style in ("colwise", "vocab"):
            src = next(iter(g.predecessors(n)))
            c.col_inputs[src] = g.nodes[src]["out_bytes"]
            c.col_each.append(g.nodes[src]["out_bytes"])
        elif n in loss:
            tokens = g.nodes[next(iter(g.predecessors(n)))]["shape"][0]
            c.reduce_fwd += [4 * tokens] * 3  # vocab-parallel loss: row max, sum of exps, target logit (fp32)
    return c


def _dtensor_nodes(graph: OpGraph, group: str, sharded: set[str], seq: set[str], loss: set[str],
                   placements: dict[str, str]) -> set[str]:
    """Nodes the runtime runs on DTensors (Device.sharded_op_latency per launch): the placed Linears and
    Embeddings, under sequence parallelism all that is split over the sequence, and what a vocab head's
    sharded logits pass through to the loss-parallel loss; their parameters are DTensors."""
    g = graph.g
    on_dtensors = seq | loss | {n for n in graph.nodes_of(group) if g.nodes[n]["kind"] in ("linear", "embedding")
                                and g.nodes[n]["module"] in placements}
    for n in loss:
        p = next(iter(g.predecessors(n)))
        while p in sharded and g.nodes[p]["kind"] != "linear":
            on_dtensors.add(p)
            p = next(iter(g.predecessors(p)))
    return on_dtensors


def _saved_share(g, n: str, tp: int, sharded: set[str], seq: set[str], placements: dict[str, str],
                 keep_shard: bool = False) -> int:
    """Bytes node n's output and its own saved tensors cost one rank (module docstring, memory); a placed
    Linear's cast of its input (autocast) is whole when column-parallel, 1/t when row-parallel."""
    d = g.nodes[n]
    cast = d.get("cast_saved_bytes", 0)
    style = placements.get(d["module"]) if d["kind"] == "linear" else None
    if cast and style is not None:
        return _share(g, n, d["saved_bytes"] - cast, tp, sharded, seq, placements, keep_shard) + \
            (cast // tp if style == "rowwise" else cast)
    return _share(g, n, d["saved_bytes"], tp, sharded, seq, placements, keep_shard)


def _share(g, n: str, saved: int, tp: int, sharded: set[str], seq: set[str], placements: dict[str, str],
           keep_shard: bool = False) -> int:
    d = g.nodes[n]
    if n in sharded:
        return saved // tp
    if n not in seq:
        return saved
    if keep_shard:  # Megatron-LM / Transformer Engine: the shard, gathered again in the backward
        return saved // tp
    # a column-parallel layer fed by n keeps the all-gathered, whole tensor
    feeds_col = any(g.nodes[s]["kind"] == "linear" and placements.get(g.nodes[s]["module"]) in ("colwise", "vocab")
                    for s in g.successors(n))
    if feeds_col and saved >= d["out_bytes"]:
        return d["out_bytes"] + (saved - d["out_bytes"]) // tp
    return saved // tp


def keeps_output_under_selective(d: dict, takes_param: bool = False) -> bool:
    """Selective recompute keeps what parametric operators and fused attention produce (module docstring),
    as runtime/parallel/recompute.py does: an operator with parameters is a module owning them (Linear, LayerNorm,
    Embedding) or an op fed a parameter directly (`takes_param`: the `x * weight` of a hand-written
    RMSNorm); a parameter itself (get_attr), an input, or a view or cast of parameters alone keeps nothing."""
    if d["op"] in ("placeholder", "get_attr"):
        return False
    return bool(d["params"]) or takes_param or d["kind"] == "scaled_dot_product_attention"


MATMUL_KINDS = {"linear", "grouped_mm", "mm", "addmm"} | _BATCHED_MATMUL


def is_weight_matmul(d: dict, takes_param: bool = False) -> bool:
    """A matrix product with a weight (a Linear, or a matmul fed a parameter): what the "op" policy counts
    and keeps every other one of, as runtime/parallel/recompute.py's AlternatePolicy counts aten mm/addmm/...
    calls that take a weight."""
    return d["kind"] in MATMUL_KINDS and (bool(d["params"]) or takes_param)


def input_bytes(graph: OpGraph, group: str) -> int:
    """Bytes of the activations entering `group` from earlier groups (what full recompute keeps)."""
    g = graph.g
    mine = set(graph.nodes_of(group))
    srcs = {p for n in mine for p in g.predecessors(n) if p not in mine}
    return sum(g.nodes[p]["out_bytes"] for p in srcs
               if g.nodes[p]["op"] not in ("placeholder", "get_attr") and not g.nodes[p]["via_user"])


def _add_recompute_policies(opt: BlockOption, graph: OpGraph, group: str, cluster: Cluster,
                            split: set[str], tp: int, sharded: set[str] | None = None, input_div: int = 1,
                            dtensor_nodes: set[str] = frozenset(), placements: dict[str, str] | None = None) -> None:
    """Fill saved bytes, launch latency and re-run seconds per recompute policy (see the module docstring).

    Launch latency: each launch (`launches`, forward; BACKWARD_LAUNCHES more in backward) costs
    Device.op_latency, plus Device.sharded_op_latency for a node in `dtensor_nodes` (run on DTensors)."""
    sharded = split if sharded is None else sharded
    placements = placements or {}
    g = graph.g
    kept = _kept_by_policy(graph, group)
    keep, rerun, fixed, fixed_all = _policy_costs(graph, group, cluster, kept, split, tp, sharded, placements)
    inp = input_bytes(graph, group) // input_div
    dev = cluster.device

    def lat(n: str) -> float:
        return launches(g.nodes[n]) * (dev.op_latency + (dev.sharded_op_latency if n in dtensor_nodes else 0.0))
    fwd_launch = sum(lat(n) for n in graph.nodes_of(group))
    opt.launch_s = fwd_launch * (1 + BACKWARD_LAUNCHES)
    opt.relaunch_by_policy = {"none": 0.0, **{p: sum(lat(n) for n in graph.nodes_of(group) if n not in nodes)
                                               for p, nodes in kept.items()}, "full": fwd_launch}
    opt.saved_by_policy = {"none": opt.saved_bytes, **{p: min(opt.saved_bytes, keep[p] + inp) for p in kept},
                           "full": min(opt.saved_bytes, inp)}
    opt.refwd_by_policy = {"none": 0.0, **rerun, "full": opt.fwd_s}
    opt.refixed_by_policy = {"none": 0.0, **fixed, "full": fixed_all}


def _weights(graph: OpGraph, group: str) -> set[str]:
    """Parameters, and what is computed from parameters alone (a transpose or cast of a weight), are
    weights: an op fed one (and an activation) counts as an operator with parameters."""
    g = graph.g
    weights = {p for n in graph.nodes_of(group) for p in g.predecessors(n)
               if g.nodes[p]["op"] == "get_attr" and g.nodes[p]["params"]}
    for n in graph.nodes_of(group):  # graph order is topological
        ins = list(g.predecessors(n))
        if g.nodes[n]["op"] != "placeholder" and ins and all(p in weights for p in ins):
            weights.add(n)
    return weights


def _kept_by_policy(graph: OpGraph, group: str) -> dict[str, set[str]]:
    """{"selective": what operators with parameters and fused attention produce, "op": every other weight
    matmul and attention} -- the nodes whose outputs each policy keeps (module docstring)."""
    g = graph.g
    weights = _weights(graph, group)
    takes_weight = lambda n: any(p in weights for p in g.predecessors(n))
    kept = {"selective": set(), "op": set()}
    products = 0
    for n in graph.nodes_of(group):
        if n in weights:
            continue
        d = g.nodes[n]
        if keeps_output_under_selective(d, takes_weight(n)):
            kept["selective"].add(n)
        if is_weight_matmul(d, takes_weight(n)):
            products += 1
            if products % 2:
                kept["op"].add(n)
        elif d["kind"] == "scaled_dot_product_attention":
            kept["op"].add(n)
    return kept


def _policy_costs(graph: OpGraph, group: str, cluster: Cluster, kept: dict[str, set[str]], split: set[str],
                  tp: int, sharded: set[str], placements: dict[str, str]) -> tuple[dict, dict, dict, float]:
    """Per policy (keep bytes, re-run seconds per sample, re-run seconds per micro-batch), and the whole
    forward's per-micro-batch seconds (what full recompute re-runs)."""
    g = graph.g
    keep = dict.fromkeys(kept, 0)
    rerun = dict.fromkeys(kept, 0.0)
    fixed = dict.fromkeys(kept, 0.0)
    fixed_all = 0.0
    for n in graph.nodes_of(group):
        d = g.nodes[n]
        style = placements.get(d["module"]) if d["kind"] in ("linear", "embedding") else None
        t = node_seconds(d, cluster, graph.dtype, tp, style, n in split)
        fixed_all += t.fixed_fwd
        div = tp if n in sharded else 1
        # the checkpoint caches every output of a kept op, whether or not autograd saves it (an attention
        # or MLP output projection feeding only a residual add): `saved_bytes` holds what autograd saves
        # of what the op produced (its output, if saved, and internals such as a norm's statistics); an
        # output smaller than that is taken to be among it, else added
        # (a kept op's own casts of its input, autocast's, are re-run: only its output is cached)
        saved, out = d["saved_bytes"] - d.get("cast_saved_bytes", 0), 0 if d["alias"] else d["out_bytes"]
        for policy, nodes in kept.items():
            if n in nodes:
                keep[policy] += (saved if saved >= out else saved + out) // div
            else:
                rerun[policy] += t.fwd
                fixed[policy] += t.fixed_fwd
    return keep, rerun, fixed, fixed_all

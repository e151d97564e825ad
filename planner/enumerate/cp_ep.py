"""Context and expert parallelism: what each changes in a layer's costs.

Context parallelism (cp) splits every sequence over cp ranks. Each rank holds a head chunk and a tail
chunk of 2 cp chunks, which balances causal attention (Llama 3, arXiv 2407.21783, Sec. 3.3.2). A rank
then runs 1/cp of every token-wise operator and, balanced, 1/cp of causal attention. So a cp candidate is
priced as its data-parallel counterpart with b / cp samples per rank, its model states sharded and its
gradients reduced over the dp x cp ranks that hold the same parameters. Attention needs every key and
value of the sequence; partita runs the all-gather form Llama 3 used:

    forward          all-gather K and V over the cp group      B = K + V of the whole sequences (per tp rank)
    backward         reduce-scatter their gradients            B
    full recompute   the forward's gather once more

These collectives sit on the critical path: attention waits for them (Llama 3: the all-gather is exposed,
small next to attention at long sequences). The gathered K and V stay for the backward, (cp - 1) / cp x B
more activation bytes, unless the layer is recomputed whole.

Expert parallelism (ep) shards each mixture-of-experts layer's experts over ep ranks of the data-parallel
group. Each token's hidden state goes to the ranks holding its top-k experts and comes back: an all-to-all
dispatch and an all-to-all combine of D = tokens x k x hidden bytes per rank, forward and again backward,
on the critical path. Expert parameters per rank are 1/ep of them, and their gradients are reduced over
the dp / ep ranks that hold the same experts. A rank's expert work is unchanged on average (ep ranks'
tokens x k / E rows per expert, E / ep experts), but the busiest rank paces the all-to-all. Its expert GEMMs
are charged EP_IMBALANCE times their balanced time, an assumption the report states.
"""
from __future__ import annotations

from dataclasses import dataclass

from partita.costmodel.price import comm
from partita.costmodel.capture.graph import OpGraph
from partita.costmodel.hardware import Cluster

CP_SEARCH_MIN_SEQ = 16384
"""Shortest sequence for which the search tries cp > 1 on its own. Llama 3 trained with cp only in its
128k-token stage (Table 4), and Megatron-LM recommends it for long sequences. Below this, a fixed --cp is
still priced."""
CP_MIN_CHUNK = 512
"""Fewest tokens in each of a rank's two chunks for the search's own cp degrees."""
EP_IMBALANCE = 1.25
"""The busiest expert-parallel rank's expert tokens over the mean: the Switch Transformer's default
capacity factor (Fedus et al., JMLR 2022, Sec. 2.2), the bound trained routers are held to. An assumption,
stated in every MoE plan's report."""


def attention_kv_bytes(graph: OpGraph, group: str) -> int:
    """Bytes per sample of the keys and values entering the fused attention (scaled_dot_product_attention)
    operators of `group`, at the captured sequence length: each operator's inputs shaped like a head
    tensor (q, k, v: 4-d with the output's last dimension), less the query (the output's size)."""
    g, total = graph.g, 0
    for n in graph.nodes_of(group):
        d = g.nodes[n]
        if d["kind"] != "scaled_dot_product_attention":
            continue
        heads = [g.edges[p, n]["nbytes"] for p in g.predecessors(n)
                 if len(g.nodes[p]["shape"] or ()) == 4 and g.nodes[p]["shape"][-1] == d["shape"][-1]]
        total += max(0, sum(heads) - d["out_bytes"])
    return total // max(1, graph.batch)


def has_math_attention(graph: OpGraph, group: str) -> bool:
    """Whether `group` mixes positions outside fused attention (explicit scores: `attention="math"`),
    which the runtime's context parallelism does not split: a softmax over [batch, heads, s, s] scores (a
    MoE router's softmax over [tokens, experts] is not one)."""
    return any("softmax" in graph.g.nodes[n]["kind"] and len(graph.g.nodes[n]["shape"] or ()) == 4
               for n in graph.nodes_of(group))


@dataclass(frozen=True)
class Experts:
    """A layer's mixture-of-experts work, per sample, at tp = 1."""

    dispatch_bytes: int
    """Rows sent to experts (tokens x k) x hidden, bytes: one all-to-all each way."""
    count: int
    """Experts per layer (the expert weights' leading dimension)."""
    numel: int
    """Expert parameters (all experts)."""
    flops_share: float
    """The grouped GEMMs' share of the layer's forward and backward FLOPs."""


def experts_of(graph: OpGraph, group: str) -> Experts | None:
    """The experts of `group` (grouped GEMMs, costmodel.price.flops), or None for a dense layer. A grouped GEMM
    reads tokens x k rows, so the dispatched bytes are k x the layer's output (hidden-wide) per sample; the
    expert parameters are those named `experts` (transformers' MoE blocks, partita's MoE preset)."""
    g = graph.g
    grouped = [n for n in graph.nodes_of(group) if g.nodes[n]["kind"] == "grouped_mm"]
    if not grouped:
        return None
    rows = [g.nodes[p]["shape"][0] for n in grouped for p in g.predecessors(n)
            if len(g.nodes[p]["shape"] or ()) == 2 and not g.nodes[p]["params"] and g.nodes[p]["kind"] != "get_attr"]
    tokens = graph.batch * (graph.seq_len or 1)
    top_k = max(rows or [0]) / tokens  # the routed rows are tokens x k
    owners = [n for n in graph.nodes_of(group) if any("experts" in k.split(".") for k in g.nodes[n]["params"])]
    params = {k: v for n in owners for k, v in g.nodes[n]["params"].items() if "experts" in k.split(".")}
    count = min((g.nodes[n]["shape"][0] for n in owners if len(g.nodes[n]["shape"] or ()) == 3), default=1)
    flops = lambda nodes: sum(g.nodes[n]["fwd_flops"] + g.nodes[n]["bwd_flops"] for n in nodes)
    total = flops(graph.nodes_of(group))
    return Experts(dispatch_bytes=int(top_k * graph.boundary_bytes(group) / graph.batch), count=count, numel=sum(params.values()),
                   flops_share=flops(grouped) / total if total else 0.0)


def cp_comm(cluster: Cluster, kv_bytes: float, cp: int, tp: int, recompute: str) -> float:
    """Seconds per micro-batch of a layer's K/V all-gathers and gradient reduce-scatters over its cp
    group (module docstring); `kv_bytes`: K and V of the rank's whole sequences (per tp rank)."""
    if cp <= 1 or kv_bytes <= 0:
        return 0.0
    group = comm.group_for(cluster, cp, tp)
    gather = comm.all_gather(cluster, group, kv_bytes)
    return gather * (2 if recompute == "full" else 1) + comm.reduce_scatter(cluster, group, kv_bytes)


def ep_comm(cluster: Cluster, dispatch_bytes: float, ep: int, tp: int, cp: int, recompute: str) -> float:
    """Seconds per micro-batch of a layer's all-to-all dispatch and combine, forward and backward (and the
    forward's again under full recompute), over ep ranks of the data-parallel group."""
    if ep <= 1 or dispatch_bytes <= 0:
        return 0.0
    one = comm.all_to_all(cluster, comm.group_for(cluster, ep, cp * tp), dispatch_bytes)
    return one * (6 if recompute == "full" else 4)


def default_cp(seq: int | None, splittable: bool) -> tuple[int, ...]:
    """The cp degrees the search tries on its own: 1, and for sequences of CP_SEARCH_MIN_SEQ tokens or
    more on a model whose attention the runtime splits, powers of two keeping each chunk CP_MIN_CHUNK
    tokens or more."""
    if not splittable or not seq or seq < CP_SEARCH_MIN_SEQ:
        return (1,)
    return tuple(c for c in (1, 2, 4, 8, 16, 32) if seq % (2 * c) == 0 and seq // (2 * c) >= CP_MIN_CHUNK)


def cp_refusal(graph: OpGraph, layers: list[str], cp: int) -> str | None:
    """Why the model cannot run cp-way context parallelism, or None."""
    if cp <= 1:
        return None
    seq = graph.seq_len
    if not layers:
        return "context parallelism splits a stack of repeated layers; this model has none"
    if not seq or seq % (2 * cp):
        return (f"context parallelism over {cp} ranks cuts each sequence into {2 * cp} chunks, and the "
                f"sequence ({seq} tokens) is not divisible by {2 * cp}")
    if has_math_attention(graph, layers[0]):
        return ("context parallelism splits fused attention only; this model computes attention scores "
                "explicitly (attention=math): use attention=sdpa")
    if not attention_kv_bytes(graph, layers[0]):
        return "context parallelism splits fused attention (scaled_dot_product_attention), and this model's layers have none"
    return None


def default_ep(experts: Experts | None, dp: int) -> tuple[int, ...]:
    """The ep degrees the search tries on its own: 1, and for a MoE model every divisor of dp that also
    divides the number of experts, up to 8 (a node's worth of ranks: all-to-all stays fast)."""
    if experts is None:
        return (1,)
    return tuple(e for e in range(1, min(dp, experts.count, 8) + 1) if dp % e == 0 and experts.count % e == 0)


def ep_refusal(experts: Experts | None, dp: int, ep: int) -> str | None:
    """Why experts cannot be sharded ep-way over dp ranks, or None."""
    if ep <= 1:
        return None
    if experts is None:
        return "expert parallelism shards mixture-of-experts layers; this model has none"
    if dp % ep:
        return f"expert parallelism shards experts over data-parallel ranks: ep={ep} must divide dp={dp}"
    if experts.count % ep:
        return f"ep={ep} must divide the number of experts per layer ({experts.count})"
    return None

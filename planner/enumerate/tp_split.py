"""How a block splits over tensor-parallel ranks, derived from its graph (planner.enumerate.strategies' docstring):
which Linear is column- and which row-parallel, found by propagating a sharding through the block
(`propagate_tp`) -- a Linear fed a replicated tensor becomes column-parallel, one fed a tensor sharded on its
last dim row-parallel; views, transposes, elementwise ops with broadcast operands and attention carry the
sharded dim along; anything else that touches a sharded tensor makes the block ineligible, and its output
must end replicated -- and, under sequence parallelism, which of the rest splits over the sequence
(`sequence_split`)."""
from __future__ import annotations

from partita.costmodel.capture.graph import OpGraph

_ALIAS_OPS = {"view", "reshape", "transpose", "permute", "contiguous", "flatten", "unflatten", "expand"}
_ELEMENTWISE = {"add", "sub", "mul", "truediv", "div", "neg", "gelu", "silu", "relu", "tanh", "sigmoid",
                "exp", "float", "to", "type_as", "dropout", "pow", "rsqrt", "sqrt", "getitem", "iadd", "imul",
                "softmax", "scaled_masked_softmax", "cat", "chunk", "split", "narrow", "masked_fill"}
_BATCHED_MATMUL = {"matmul", "bmm", "baddbmm"}
_LAST_DIM_OPS = {"softmax", "scaled_masked_softmax", "cat", "chunk", "split", "narrow"}  # fine unless along the sharded dim

NORM_KINDS = {"layernorm", "layer_norm", "rmsnorm", "rms_norm"}
_POSITIONWISE = (_ELEMENTWISE - _LAST_DIM_OPS) | NORM_KINDS | {"mean", "sum", "embedding", "dropout"}


def sequence_split(graph: OpGraph, group: str, tp: int, sharded: set[str],
                   placements: dict[str, str]) -> set[str] | None:
    """Nodes outside the tensor-parallel regions that sequence parallelism splits over the sequence:
    those whose output is laid out [batch, seq, ...]. None if one of them mixes positions (it would
    need the whole sequence) or the sequence does not divide by tp. Norm modules among them get the
    placement "sequence" (added to `placements`)."""
    g = graph.g
    seq_len = graph.seq_len
    if not seq_len or seq_len % tp:
        return None
    out: set[str] = set()
    mine = set(graph.nodes_of(group))
    flows: set[str] = set()  # nodes carrying the activations (not buffers such as a causal mask)
    for n in graph.nodes_of(group):
        d = g.nodes[n]
        if d["shape"] and any((p in flows) or (p not in mine and g.nodes[p]["op"] != "get_attr")
                              for p in g.predecessors(n)):
            flows.add(n)
        shape = d["shape"]
        if (n in sharded or n not in flows or d["op"] in ("placeholder", "get_attr") or len(shape) < 2
                or shape[1] != seq_len):
            continue
        if d["kind"] == "linear" and d["module"] in placements:
            continue
        kind = d["kind"]
        if kind in _LAST_DIM_OPS or kind in ("mean", "sum"):
            if d.get("reduce_dim") not in (None, len(shape) - 1, -1):
                return None
        elif kind not in _POSITIONWISE and kind not in _ALIAS_OPS:
            return None
        if kind in _ALIAS_OPS and not any(len(g.nodes[p]["shape"]) >= 2 and g.nodes[p]["shape"][1] == seq_len
                                         for p in g.predecessors(n)):
            return None  # a view that makes a sequence dim out of something else
        out.add(n)
        if kind in NORM_KINDS or kind == "mean":
            placements[d["module"]] = "sequence"
    return out


def propagate_tp(graph: OpGraph, group: str, tp: int,
                 allow_empty: bool = False) -> tuple[set[str], dict[str, str]] | None:
    """Propagate a tensor-parallel sharding through `group` (module docstring).

    Returns (nodes whose outputs are sharded, {module fqn: "colwise" | "rowwise" | "vocab"}), or None if
    the block cannot be split over `tp` ranks (or has nothing to split, unless `allow_empty`).
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
        if d["kind"] == "embedding" and not ins and _token_embedding(d, g, n, tp):
            placements[d["module"]] = "vocab"  # rows sharded; the partial lookups are summed: replicated
            continue
        if d["kind"] == "cross_entropy" and ins:
            logits = next(iter(g.predecessors(n)))
            if ins != [logits] or dim[logits] != len(g.nodes[logits]["shape"]) - 1:
                return None
            _mark_vocab_head(g, logits, dim, placements)
            continue  # the loss of vocab-sharded logits: replicated (module docstring)
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
    if not placements and not allow_empty:
        return None
    return set(dim), placements


def _token_embedding(d: dict, g, n: str, tp: int) -> bool:
    """An Embedding looked up by the model's token input (not positions), whose rows divide by tp."""
    weight = [pn for name, pn in d["params"].items() if name.endswith("weight")]
    hidden = d["shape"][-1] if d["shape"] else 0
    if not weight or not hidden or (weight[0] // hidden) % tp:
        return False
    return any(g.nodes[p]["op"] == "placeholder" for p in g.predecessors(n))


def _mark_vocab_head(g, logits: str, dim: dict, placements: dict[str, str]) -> None:
    """The column-parallel Linear whose vocabulary-sharded output reaches the loss becomes "vocab"."""
    n = logits
    while g.nodes[n]["kind"] != "linear":
        ins = [p for p in g.predecessors(n) if p in dim]
        if not ins:
            return
        n = ins[0]
    if placements.get(g.nodes[n]["module"]) == "colwise":
        placements[g.nodes[n]["module"]] = "vocab"


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

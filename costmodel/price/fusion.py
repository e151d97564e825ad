"""Compiled kernels: what torch.compile's fusion does to the memory-bound operators of a captured graph.

Eager PyTorch runs every elementwise operator and reduction as its own kernel: an RMSNorm is six kernels
(pow, mean, add, rsqrt, mul, mul), each reading its inputs from HBM and writing its output back, so the
norm moves about eight activations' bytes where one read and one write would do. torch.compile's
Inductor generates one kernel for a connected run of pointwise operators and reductions (prologue and
epilogue fusion), bounded by the matmuls and attention it leaves to cuBLAS and the attention kernels
(Ansel et al., "PyTorch 2", ASPLOS'24, Sec. 5: "fusing pointwise, reduction and scatter kernels").
Those kernels are memory-bound, so a fused group costs what it moves across its boundary:

    bytes(C) = sum over tensors read from outside C  (each producer once)
             + sum over tensors of C used outside C  (each written once)

and one launch, where eager pays the sum of every member's reads and writes and one launch per member
(costmodel.price.kernels prices both the same way: bytes at the achievable HBM bandwidth, twice in backward).

Groups are formed in graph order: an operator joins the group of one of its inputs' producers when that
keeps the groups acyclic -- it may not if another of its inputs depends on that group through a matmul
(the residual add after an MLP does not fuse with the norm before it: the norm's output feeds the MLP,
whose output the add needs). Views join a group without cost; a group of views alone runs no kernel.
Groups stay inside a layer, and only the layers (`is_layer`: a numbered child of a module list) are
compiled: torchtitan and most recipes compile each transformer block on its own, and so does partita's
runtime (runtime.parallel.blocks, with this same rule); the embedding, the final norm and head, the loss and
operators with no FLOP formula keep their eager price.

Saved activations. AOTAutograd's min-cut partitioner (the default for training under torch.compile)
saves the cheapest cut between forward and backward and recomputes fusible operators inside the
backward's fused kernels rather than keep their outputs. So a fused group keeps no tensor that never
leaves it: an output consumed only inside its group (silu(gate) before the product with up, x * rsqrt
before the norm weight, a dropout mask regenerated from its seed) is saved by nobody, while the group's
inputs and the outputs other operators read (a norm's output, which the next matmul saves) stay as
eager saves them. Saved bytes are charged to the operator whose storage they are (costmodel.capture.trace), so
the rule zeroes the saved bytes of every member whose output does not escape its group (through views
included). A member that escapes keeps all of its saved bytes, including any second storage it made (a
dropout mask beside a dropout output read outside): the rule never saves less than the partitioner does.

Under autocast a Linear saves a bf16 cast of its fp32 input; in a compiled layer the Linears reading one
tensor share one such cast (`_one_cast_per_input`).

Not modelled: Inductor may split a large group into a few kernels (a reduction feeding a broadcast),
each re-reading a shared input: the bytes above are a lower bound on what it moves.
"""
from __future__ import annotations

from partita.costmodel.capture.graph import MEMORY_KEYS, OpGraph
from partita.costmodel.hardware.stacks import KERNELS, get_stack  # noqa: F401 (KERNELS re-exported)
from partita.costmodel.price.kernels import ATTENTION_KINDS, gemm_dims


def is_layer(fqn: str) -> bool:
    """A layer a compiled run compiles: a numbered child of a ModuleList ("blocks.3", "model.layers.0").
    The one definition both the pricing (fusion_groups) and the runtime (runtime.parallel.blocks) use, so a compiled
    plan is priced fused exactly where it runs compiled."""
    return fqn.rpartition(".")[2].isdigit()


_NOT_FUSED = {"cross_entropy"}
"""Kinds that stay their own kernel: the loss (already one fused kernel, costmodel.models.losses)."""


def _fusible(d: dict) -> bool:
    """A memory-bound operator or view that produces a tensor (not a matmul, attention or the loss; not an
    operator whose FLOPs are unknown, which keeps its eager price)."""
    return (d["op"] in ("call_function", "call_method", "call_module") and d["out_bytes"] > 0
            and d["kind"] not in ATTENTION_KINDS | _NOT_FUSED and gemm_dims(d) is None
            and not d.get("uncosted"))


def fusion_groups(graph: OpGraph) -> list[list[str]]:
    """The groups torch.compile would fuse, each a list of nodes in graph order (module docstring)."""
    g = graph.g
    layers = {grp for grp in graph.groups if is_layer(grp)}
    comp: dict[str, int] = {}       # node -> its fusion group
    upstream: dict[str, int] = {}   # node -> the fusion groups it depends on, itself included (a bit set)
    groups: list[list[str]] = []
    for n in g.nodes:  # insertion order is a topological order (costmodel.capture.graph)
        d = g.nodes[n]
        preds = list(g.predecessors(n))
        deps = 0
        for p in preds:
            deps |= upstream[p]
        if _fusible(d) and d["group"] in layers:
            choice = None
            for p in sorted(preds, key=lambda p: -g.edges[p, n].get("nbytes", 0)):  # the largest input first
                c = comp.get(p)
                if c is None or g.nodes[p]["group"] != d["group"]:
                    continue
                # joining c is acyclic iff no other input reaches c through a node outside it
                if all(comp.get(q) == c or not upstream[q] >> c & 1 for q in preds):
                    choice = c
                    break
            if choice is None:
                choice = len(groups)
                groups.append([])
            comp[n] = choice
            groups[choice].append(n)
            deps |= 1 << choice
        upstream[n] = deps
    return groups


def group_bytes(graph: OpGraph, members: list[str]) -> int:
    """Bytes a fused group moves: its external inputs once each, its outputs used outside once each (a
    view's output is its base's); 0 for a group of views alone (module docstring)."""
    g, inside = graph.g, set(members)
    if all(g.nodes[n]["alias"] for n in members):
        return 0
    reads = {p: g.edges[p, n].get("nbytes", 0) for n in members for p in g.predecessors(n) if p not in inside}
    written: set[str] = set()
    for n in members:
        if any(s not in inside for s in g.successors(n)) or g.out_degree(n) == 0:
            base = n
            while base is not None and g.nodes[base]["alias"]:  # a view: what is written is its base
                base = next((p for p in g.predecessors(base) if p in inside), None)
            if base is not None:
                written.add(base)
    return sum(reads.values()) + sum(g.nodes[n]["out_bytes"] for n in written)


def _escapes(g, n: str, inside: set[str]) -> bool:
    """Whether node n's output is read outside its group, directly or through a view in the group."""
    return g.out_degree(n) == 0 or any(s not in inside or (g.nodes[s]["alias"] and _escapes(g, s, inside))
                                       for s in g.successors(n))


def compiled(graph: OpGraph) -> OpGraph:
    """A copy of `graph` priced as torch.compile runs it: each fusion group's bytes and FLOPs on its first
    operator (one launch, costmodel.price.kernels' memory-bound price), its other members free, and no saved
    bytes for a member whose output never leaves its group (module docstring). The copy keeps every other
    attribute (parameters, shapes), so the planner uses it as it is; a node's `autocast` record is fused
    the same way (OpGraph.as_run of the copy is the compiled autocast graph)."""
    return _with_autocast(graph, _compiled)


def _with_autocast(graph: OpGraph, price) -> OpGraph:
    """`price(graph)`, with each node's `autocast` record priced the same way (from `price` of the autocast run)."""
    out = price(graph)
    if graph.has_autocast():
        mixed = price(graph.as_run("autocast"))
        for n, d in out.g.nodes(data=True):
            d["autocast"] = {k: mixed.g.nodes[n][k] for k in MEMORY_KEYS}
    return out


def _compiled(graph: OpGraph) -> OpGraph:
    out = graph.copy()
    g = out.g
    for members in fusion_groups(graph):
        inside = set(members)
        for n in members:
            if not _escapes(g, n, inside):
                g.nodes[n].update(saved_bytes=0, cast_saved_bytes=0)
        kernels = [n for n in members if not g.nodes[n]["alias"]]
        if not kernels:
            continue
        head = kernels[0]
        fwd = sum(g.nodes[n]["fwd_flops"] for n in kernels)
        bwd = sum(g.nodes[n]["bwd_flops"] for n in kernels)
        g.nodes[head].update(mem_bytes=group_bytes(graph, members), fwd_flops=fwd, bwd_flops=bwd,
                             fused=len(kernels))
        for n in kernels[1:]:
            g.nodes[n].update(mem_bytes=0, fwd_flops=0, bwd_flops=0, fused=0)
    _one_cast_per_input(out)
    out.g.graph["kernels"] = "compiled"
    return out


def _one_cast_per_input(graph: OpGraph) -> None:
    """In a compiled layer, the operators that cast the same input (autocast's bf16 copies of one norm
    output for q, k and v) share one cast: the graph AOTAutograd traces has one `_to_copy` per consumer,
    identical, and its common-subexpression elimination keeps one, which the fused kernel producing the
    input writes. Each input's cast is kept on its first consumer, removed from the others' saved bytes.
    (Measured on CPU, torch 2.13: a compiled Llama block under autocast saves one bf16 copy of each norm
    output; eager saves one per consuming Linear.)"""
    g = graph.g
    layers = {grp for grp in graph.groups if is_layer(grp)}
    for p in g.nodes:
        if g.nodes[p]["group"] not in layers:
            continue
        casting = [s for s in g.successors(p) if g.nodes[s]["group"] == g.nodes[p]["group"]
                   and g.nodes[s].get("cast_saved_bytes", 0) and len(list(g.predecessors(s))) == 1]
        for s in casting[1:]:
            d = g.nodes[s]
            d.update(saved_bytes=d["saved_bytes"] - d["cast_saved_bytes"], cast_saved_bytes=0)


FUSED_PIECE_KINDS = frozenset({"pow", "mean", "add", "mul", "silu", "neg", "cat", "chunk", "getitem", "to", "float",
                               "type_as"})
"""The eager operators of an RMSNorm (x.pow(2).mean(-1), + eps, x * r, * weight) and of a gated activation
(silu(gate) * up): what a stack's fused kernels replace (`fused_kernel_saves`). Not rsqrt: its per-row 1 / rms is
what the fused norm saves too."""


def _piece(kinds: set[str]) -> str | None:
    """Which fused kernel a fusion group is the eager form of: "norm" (an RMSNorm's pow / mean), "gate" (silu)."""
    if kinds & {"pow", "mean"}:
        return "norm"
    return "gate" if "silu" in kinds else None


def fused_kernel_saves(graph: OpGraph, pieces: tuple[str, ...] = ("norm", "gate")) -> OpGraph:
    """A copy of `graph` whose saved bytes are those of a stack that runs `pieces` of each layer as fused kernels
    (costmodel.hardware.stacks.Stack.fused_saves), its time left eager (the stack's fitted constants price that).
    Such a kernel saves what its backward needs from outside it, never its intermediates:

    - "norm": a fused RMSNorm (apex's FusedRMSNorm / MixedFusedRMSNorm; Transformer Engine's RMSNorm and
      LayerNormLinear) saves its input and the per-row 1 / rms (kept), not eager's x * rsqrt(mean(x^2) + eps):
      its backward recomputes the normalised input from them (apex csrc/layer_norm_cuda_kernel.cu reads input
      and invvar; TE's rmsnorm_bwd takes x, rsigma and gamma);
    - "gate": a fused SwiGLU (Megatron-Core's bias_swiglu_impl, megatron/core/fusions/fused_bias_swiglu.py; TE's
      swiglu) saves the [gate, up] it was given and recomputes silu(gate) in its backward, where eager autograd
      keeps silu(gate) for the product's backward;

    so on a Llama layer both remove 2 s b h per norm and the ffn-wide silu(gate) (about 11 s b h of eager's 45 at
    ffn = 3.5 h), leaving Korthikanti et al.'s count for the fused layer. It is the compiled rule's save (a
    member whose output never leaves its group keeps nothing) restricted to those groups and to the members of
    FUSED_PIECE_KINDS: a softmax and a dropout keep their saves, as Megatron's fused scale-mask-softmax keeps
    its output and its bias-dropout-add its mask."""
    def saves(graph_: OpGraph) -> OpGraph:
        out = graph_.copy()
        g = out.g
        for members in fusion_groups(graph_):
            if _piece({g.nodes[n]["kind"] for n in members}) not in pieces:
                continue
            inside = set(members)
            for n in members:
                if g.nodes[n]["kind"] in FUSED_PIECE_KINDS and not _escapes(g, n, inside):
                    g.nodes[n].update(saved_bytes=0, cast_saved_bytes=0)
        out.g.graph["kernels"] = "fused-saves:" + ",".join(pieces)
        return out
    return _with_autocast(graph, saves)


def with_kernels(graph: OpGraph, kernels: str, stack: str | None = None) -> OpGraph:
    """`graph` priced for `kernels` (KERNELS) on `stack` (costmodel.hardware.stacks): `compiled(graph)` when
    compiled; eager, itself -- or `fused_kernel_saves` on a stack that fuses some of a layer's pieces."""
    if kernels == "eager":
        pieces = get_stack(stack).fused_saves
        if not pieces or str(graph.g.graph.get("kernels") or "").startswith("fused-saves"):
            return graph
        return fused_kernel_saves(graph, pieces)
    if graph.g.graph.get("kernels") == kernels:
        return graph
    return compiled(graph)

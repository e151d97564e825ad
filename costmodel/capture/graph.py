"""OpGraph: the captured model as a networkx DiGraph of operators, grouped into layers.

Node attributes (per traced sample): op, target, kind, module (owner FQN), group, shape, dtype,
out_bytes, fwd_flops, bwd_flops, saved_bytes, alias, mem_bytes, params {name: numel}, param_bytes;
cast_saved_bytes (of saved_bytes, the casts of its input a node makes inside itself) and
weight_saved_bytes (saved tensors computed from parameters alone, per micro-batch, not per sample);
in a bf16 capture also `autocast`: those byte attributes as partita's runtime runs the model under
torch.autocast over fp32 parameters (costmodel.capture.trace; `as_run`).
Edge attribute: nbytes (the tensor that flows).

Groups are the layers a pipeline can split between: the children of the repeated-layer container
(`blocks.0`, `model.layers.3`) and the other top-level modules (`tok_emb`, `ln_f`, `head`). Nodes with no
module (adds, views, the loss), and nodes of a module that holds the layers (the ops HF's `GPT2Model`
runs around its blocks), join the group of their first grouped input, else of their first user.
Linear nodes may carry `weight_layout`: "out_in" (nn.Linear) or "in_out" (transformers' Conv1D).
A node that ran an operator whose FLOPs cannot be counted names it in `uncosted` (`uncosted_ops()`).
`repeated` lists the groups that are copies of one another (same operators, shapes and costs), which
the planner exploits to keep its program small.
"""
from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass

import networkx as nx

_COST_KEYS = ("fwd_flops", "bwd_flops", "saved_bytes", "out_bytes", "mem_bytes", "param_bytes")
MEMORY_KEYS = ("out_bytes", "mem_bytes", "saved_bytes", "cast_saved_bytes", "weight_saved_bytes")
"""The byte attributes that depend on how the model runs (a node's `autocast` record holds its own)."""
RUNS = ("as-captured", "autocast")
"""How a bf16 model runs (`OpGraph.as_run`): on bf16 parameters as captured (FSDP2's MixedPrecisionPolicy,
Megatron-LM's bf16 model), or under torch.autocast over fp32 parameters (partita's runtime without FSDP)."""


@dataclass
class GroupCost:
    """Sums over one group's nodes (per traced sample)."""

    name: str
    nodes: list[str]
    fwd_flops: int = 0
    bwd_flops: int = 0
    saved_bytes: int = 0
    param_bytes: int = 0
    param_numel: int = 0
    out_bytes: int = 0
    """Bytes of the group's output tensor (what a pipeline stage boundary after it sends)."""


class OpGraph:
    def __init__(self, *, name: str, batch: int, seq_len: int | None, dtype: str):
        self.g = nx.DiGraph()
        self.name, self.batch, self.seq_len, self.dtype = name, batch, seq_len, dtype
        self.groups: list[str] = []
        self.layer_container: str | None = None
        """The stack of layers holding most operators; `layer_containers` lists every stack."""
        self.layer_containers: list[str] = []
        self.capture_seconds = 0.0

    # construction ----------------------------------------------------------------------------
    def add_node(self, name: str, **attrs) -> None:
        self.g.add_node(name, **attrs)

    def add_edge(self, u: str, v: str, **attrs) -> None:
        self.g.add_edge(u, v, **attrs)

    def finalize(self, capture_seconds: float = 0.0) -> None:
        self.capture_seconds = capture_seconds
        self.layer_containers = _layer_containers([d["module"] for _, d in self.g.nodes(data=True)])
        self.layer_container = self.layer_containers[0] if self.layer_containers else None
        order = list(self.g.nodes)  # insertion order = the fx graph's order, a topological order
        seen: dict[str, None] = {}
        for n in order:
            d = self.g.nodes[n]
            d["group"] = _group_key(d["module"], self.layer_containers)
            d["via_user"] = False
            if d["group"]:
                seen.setdefault(d["group"], None)
        self.groups = list(seen)
        rank = {g: i for i, g in enumerate(self.groups)}
        for n in order:  # ungrouped nodes (adds, views, the loss) join their first grouped input
            d = self.g.nodes[n]
            if not d["group"]:
                ins = [self.g.nodes[p]["group"] for p in self.g.predecessors(n) if self.g.nodes[p]["group"]]
                d["group"] = ins[0] if ins else ""
        for n in reversed(order):  # inputs and constants: the earliest group that uses them
            d = self.g.nodes[n]
            if not d["group"]:
                outs = [self.g.nodes[s]["group"] for s in self.g.successors(n) if self.g.nodes[s]["group"]]
                d["group"] = min(outs, key=rank.__getitem__) if outs else self.groups[0]
                d["via_user"] = True

    def copy(self) -> "OpGraph":
        """A copy whose node attributes can be changed without touching this graph (costmodel.price.fusion)."""
        out = copy.copy(self)
        out.__dict__.pop("_by_group", None)  # the group index is rebuilt on first use
        out.g = self.g.copy()  # new node and edge attribute dicts, the same values
        return out

    def has_autocast(self) -> bool:
        """Whether the capture recorded the model under autocast too (a bf16 capture: costmodel.capture.trace)."""
        return bool(self.g.graph.get("autocast"))

    def as_run(self, how: str) -> "OpGraph":
        """This graph with the byte attributes of `how` the model runs (RUNS): itself as captured, or a copy
        with every node's `autocast` record in place (and the edges' bytes with them); a graph without an
        autocast record (fp32, or captured with autocast=None) is itself either way."""
        if how not in RUNS:
            raise ValueError(f"how must be one of {RUNS}, got {how!r}")
        if how == "as-captured" or not self.has_autocast() or self.g.graph.get("run") == how:
            return self
        out = self.copy()
        for n, d in out.g.nodes(data=True):
            d.update(d.get("autocast", {}))
        for u, v, e in out.g.edges(data=True):
            e["nbytes"] = out.g.nodes[u]["out_bytes"]
        out.g.graph["run"] = how
        return out

    # queries -----------------------------------------------------------------------------------
    def nodes_of(self, group: str) -> list[str]:
        """The nodes of `group` in graph order (indexed once per graph: the planner asks thousands of times)."""
        index = self.__dict__.get("_by_group")
        if index is None or index[0] != self.g.number_of_nodes():
            by_group: dict[str, list[str]] = {}
            for n, d in self.g.nodes(data=True):
                by_group.setdefault(d.get("group", ""), []).append(n)
            index = self._by_group = (self.g.number_of_nodes(), by_group)
        return list(index[1].get(group, []))

    def group_cost(self, group: str) -> GroupCost:
        nodes = self.nodes_of(group)
        c = GroupCost(name=group, nodes=nodes)
        for n in nodes:
            d = self.g.nodes[n]
            c.fwd_flops += d["fwd_flops"]
            c.bwd_flops += d["bwd_flops"]
            c.saved_bytes += d["saved_bytes"]
            c.param_bytes += d["param_bytes"]
            c.param_numel += sum(d["params"].values())
        c.out_bytes = self.boundary_bytes(group)
        return c

    def boundary_bytes(self, group: str) -> int:
        """Bytes of activations leaving `group` for later groups (sent between pipeline stages)."""
        idx = {g: i for i, g in enumerate(self.groups)}
        total = 0
        for n in self.nodes_of(group):
            if any(idx[self.g.nodes[s]["group"]] > idx[group] for s in self.g.successors(n)):
                if not self.g.nodes[n]["via_user"] and self.g.nodes[n]["op"] not in ("placeholder", "get_attr"):
                    total += self.g.nodes[n]["out_bytes"]
        return total

    def signature(self, group: str) -> tuple:
        return tuple((self.g.nodes[n]["kind"], self.g.nodes[n]["shape"],
                      *(self.g.nodes[n][k] for k in _COST_KEYS)) for n in self.nodes_of(group)
                     if not self.g.nodes[n]["via_user"])

    def repeated(self) -> list[str]:
        """The longest run of consecutive groups with identical signatures (the transformer layers)."""
        best: list[str] = []
        run: list[str] = []
        prev = None
        for grp in self.groups:
            sig = self.signature(grp)
            run = run + [grp] if sig == prev else [grp]
            prev = sig
            if len(run) > len(best):
                best = list(run)
        return best if len(best) > 1 else []

    def totals(self) -> dict[str, int]:
        out = {k: 0 for k in _COST_KEYS}
        for _, d in self.g.nodes(data=True):
            for k in _COST_KEYS:
                out[k] += d[k]
        out["param_numel"] = sum(sum(d["params"].values()) for _, d in self.g.nodes(data=True))
        return out

    def uncosted_ops(self) -> dict[str, int]:
        """Operators run without a FLOP count although they compute (costmodel.price.flops.is_uncosted), each
        with the number of nodes that ran it: their time is priced by the bytes they move only."""
        out: dict[str, int] = {}
        for _, d in self.g.nodes(data=True):
            for op in d.get("uncosted", ()):
                out[op] = out.get(op, 0) + 1
        return dict(sorted(out.items()))

    def __len__(self) -> int:
        return self.g.number_of_nodes()


def _layer_containers(modules: list[str]) -> list[str]:
    """Module paths whose numbered children are the layers ("blocks", "model.layers"), the one holding most
    operators first. An encoder-decoder has two stacks ("encoder.block", "decoder.block"): each layer of
    either is a group, so a pipeline can split inside the encoder as well as the decoder. A stack nested in a
    layer (MoE experts) is not one: only the first numbered part of a path counts."""
    counts: Counter[str] = Counter()
    children: dict[str, set[str]] = {}
    for m in modules:
        parts = m.split(".")
        for i, p in enumerate(parts):
            if p.isdigit() and i > 0:
                container = ".".join(parts[:i])
                counts[container] += 1
                children.setdefault(container, set()).add(p)
                break
    ranked = [c for c, _ in counts.most_common()]
    return ranked[:1] + [c for c in ranked[1:] if len(children[c]) > 1]


def _group_key(module: str, containers: list[str]) -> str:
    if not module:
        return ""
    for c in containers:
        if (c + ".").startswith(module + "."):
            return ""  # ops in the forward of a module that holds layers (HF's `transformer`, `model`)
        if module.startswith(c + "."):
            return f"{c}.{module[len(c) + 1:].split('.')[0]}"
    # outside the layers: the child of the deepest module it shares with a stack
    # (`transformer.wte` beside `transformer.h`, `bert.embeddings` beside `bert.encoder.layer`)
    parts = module.split(".")

    def shared(container: str) -> int:
        n = 0
        for a, b in zip(parts, container.split(".")):
            if a != b:
                break
            n += 1
        return n

    return ".".join(parts[:max(map(shared, containers), default=0) + 1])

"""Record a deep stack of identical layers from a shallow copy of the same model.

Recording a graph (every fx node run on fake tensors under a FLOP counter and saved-tensor hooks,
costmodel.capture.trace.Recorder) costs about half a millisecond a node: most of the capture of a 100-layer model
(6,800 nodes for llama3-405b). The layers of a stack are the same module with the same input shapes, so
what is recorded for a layer of the deep model is what is recorded for the matching layer of the model
built with `SHALLOW` layers:

    deep layer 0          <- shallow layer 0   (its input comes from the embedding, not from a layer)
    deep layer 1 .. L-2   <- shallow layer 1   (input from a layer, output to a layer)
    deep layer L-1        <- shallow layer 2   (its output goes to the final norm and the head)
    nodes before / after  <- the same nodes of the shallow graph

Saved activations are charged to the node that produced the storage (Recorder.pack), so a middle layer's
figures include what the next layer saves of its output, exactly as shallow layer 1's do.

`pair_nodes` checks that the two graphs really are the same stack -- the same node sequence in every
segment, targets compared with the layer index blanked -- and returns None otherwise; the caller then
records the deep graph node by node. The equality of both ways is tested on several presets
(tests/costmodel/test_replicate.py).
"""
from __future__ import annotations

import re

import torch.fx as fx

SHALLOW = 3
"""Layers in the shallow copy: a first, a middle and a last layer."""


def _segments(gm: fx.GraphModule, prefix: str, owner) -> list[tuple[object, list[fx.Node]]] | None:
    """The graph's nodes in order, cut into ("pre", nodes), (0, nodes), ..., (L-1, nodes), ("post", nodes);
    None when a layer's nodes are not one contiguous run in layer order."""
    pattern = re.compile(r"(?:^|\.)" + re.escape(prefix) + r"\.(\d+)(?:\.|$)")
    segments: list[tuple[object, list[fx.Node]]] = [("pre", [])]
    for n in gm.graph.nodes:
        m = pattern.search(owner(n, gm))
        key = int(m.group(1)) if m else ("pre" if len(segments) == 1 else "post")
        if key != segments[-1][0]:
            expected = 0 if segments[-1][0] == "pre" else (segments[-1][0] + 1 if isinstance(segments[-1][0], int)
                                                         else None)
            if key != expected and not (key == "post" and isinstance(segments[-1][0], int)):
                return None  # a layer out of order, split in two, or top-level nodes between layers
            segments.append((key, []))
        segments[-1][1].append(n)
    return segments


def _signature(n: fx.Node, prefix: str) -> tuple:
    """What a node does, with the layer index of module targets blanked (blocks.7.attn -> blocks.#.attn)."""
    target = n.target
    if isinstance(target, str):
        target = re.sub(r"(^|\.)" + re.escape(prefix) + r"\.\d+(?=\.|$)", r"\1" + prefix + ".#", target)
    consts = tuple(repr(a) for a in (*n.args, *n.kwargs.values()) if not isinstance(a, (fx.Node, list, tuple)))
    return n.op, target, len(n.args), tuple(sorted(n.kwargs)), consts


def pair_nodes(deep: fx.GraphModule, shallow: fx.GraphModule, prefix: str, owner) -> dict[str, str] | None:
    """deep node name -> the shallow node recorded in its place, or None when the graphs are not the same
    stack (different layer bodies, layers not contiguous, fewer than SHALLOW layers in either)."""
    a, b = _segments(deep, prefix, owner), _segments(shallow, prefix, owner)
    if a is None or b is None:
        return None
    deep_layers = sum(isinstance(k, int) for k, _ in a)
    if deep_layers < SHALLOW or sum(isinstance(k, int) for k, _ in b) != SHALLOW:
        return None
    shallow_by_key = dict(b)
    pairs: dict[str, str] = {}
    for key, nodes in a:
        if isinstance(key, int):
            key = 0 if key == 0 else (SHALLOW - 1 if key == deep_layers - 1 else 1)
        twin = shallow_by_key.get(key)
        if twin is None or len(twin) != len(nodes):
            return None
        for n, m in zip(nodes, twin):
            if _signature(n, prefix) != _signature(m, prefix):
                return None
            pairs[n.name] = m.name
    return pairs

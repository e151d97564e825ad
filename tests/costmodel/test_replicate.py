"""partita.costmodel.capture.replicate: a deep stack recorded from its 3-layer copy gives the same OpGraph, node for node,
as recording every node of the deep model."""
import dataclasses

import pytest

from partita.costmodel.models import resolve_model
from partita.costmodel.capture import trace
from partita.costmodel.capture import capture

MODELS = [
    "gpt:layers=7,hidden=64,heads=4,vocab=128,seq=16",
    "gpt:layers=5,hidden=64,heads=4,vocab=128,seq=16,dropout=0.1,attention=math",
    "llama:layers=6,hidden=64,heads=4,kv_heads=2,ffn=160,vocab=96,seq=24",
    "megatron-1.7b",
]


def _nodes(graph):
    return {n: dict(d) for n, d in graph.g.nodes(data=True)}


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_shallow_record_equals_full_record(model, dtype, monkeypatch):
    spec = resolve_model(model)
    assert spec.at_depth is not None
    recorded = []
    record = trace._record
    monkeypatch.setattr(trace, "_record", lambda gm, *a: recorded.append(len(gm.graph.nodes)) or record(gm, *a))
    fast = capture(spec, dtype)
    full = capture(dataclasses.replace(spec, at_depth=None), dtype)
    per = 2 if dtype == "bf16" else 1  # a bf16 capture records the model twice: as captured, under autocast
    assert len(recorded) == 2 * per
    # the shallow copy was recorded (+1: output)
    assert recorded[0] == recorded[per - 1] < recorded[per] == recorded[-1] == len(full.g.nodes) + 1
    assert list(fast.g.nodes) == list(full.g.nodes)
    assert _nodes(fast) == _nodes(full)
    assert {(u, v): d for u, v, d in fast.g.edges(data=True)} == {(u, v): d for u, v, d in full.g.edges(data=True)}
    assert fast.groups == full.groups
    # the figures are not all zero (a pairing that copied nothing would still compare equal on names)
    assert sum(d["fwd_flops"] for d in _nodes(fast).values()) > 0
    assert sum(d["saved_bytes"] for d in _nodes(fast).values()) > 0
    if dtype == "bf16":
        assert sum(d["autocast"]["saved_bytes"] for d in _nodes(fast).values()) > 0


def test_graphs_that_are_not_the_same_stack_do_not_pair():
    """A shallow copy whose layers differ from the deep model's (here: another hidden size) is refused,
    so the deep graph is recorded node by node rather than copied from the wrong model."""
    from partita.costmodel.capture.replicate import SHALLOW, pair_nodes
    from partita.costmodel.capture.trace import _owner, _trace_fx
    deep = resolve_model("gpt:layers=5,hidden=64,heads=4,vocab=128,seq=16")
    other = resolve_model("gpt:layers=3,hidden=64,heads=4,vocab=128,seq=16,attention=math")
    same = deep.at_depth(SHALLOW)
    gm = _trace_fx(deep, "fp32", 1)[0]
    assert pair_nodes(gm, _trace_fx(same, "fp32", 1)[0], "blocks", _owner) is not None
    assert pair_nodes(gm, _trace_fx(other, "fp32", 1)[0], "blocks", _owner) is None

"""partita.planner.enumerate.candidates: the layer options a tensor-parallel degree offers."""
from partita.costmodel.hardware import parse_cluster
from partita.costmodel.models import resolve_model
from partita.costmodel.capture import capture
from partita.planner.enumerate.candidates import _Bases, split_model


def test_a_layer_tp_cannot_split_keeps_its_replicated_option():
    """3 heads do not split over tp=2: the layer stays replicated under that mesh rather than having no
    option at all (an operator-precedence slip once dropped both, leaving every tp=2 candidate empty)."""
    cluster = parse_cluster("4xcpu")
    for heads, options in ((3, 1), (4, 2)):
        g = capture(resolve_model(f"gpt:layers=3,hidden=96,heads={heads},vocab=128,seq=16"))
        layer = _Bases(g, cluster, *split_model(g)).get(2)[0]
        assert len(layer) == options


def test_a_search_copies_the_autocast_graph_once_not_per_candidate(monkeypatch):
    """Every bf16 candidate runs under autocast (OpGraph.as_run copies the captured graph); the copy is made
    once per search. Made per candidate it cost gpt3-175b's search 15 of its 17 seconds."""
    from partita.costmodel.capture.graph import OpGraph
    from partita.planner.api import TrainConfig, plan_search

    copies = []
    original = OpGraph.copy
    monkeypatch.setattr(OpGraph, "copy", lambda self: copies.append(1) or original(self))
    result, _ = plan_search("gpt:layers=4,hidden=256,heads=4,vocab=512,seq=128", cluster="2x4xA100-80GB",
                            train=TrainConfig(global_batch=16, seq_len=128))
    assert len(result.candidates) > 20
    assert 1 <= len(copies) <= 3

"""partita.planner.candidates: the layer options a tensor-parallel degree offers."""
from partita.costmodel.hardware import parse_cluster
from partita.costmodel.models import resolve_model
from partita.costmodel.trace import capture
from partita.planner.candidates import _Bases, split_model


def test_a_layer_tp_cannot_split_keeps_its_replicated_option():
    """3 heads do not split over tp=2: the layer stays replicated under that mesh rather than having no
    option at all (an operator-precedence slip once dropped both, leaving every tp=2 candidate empty)."""
    cluster = parse_cluster("4xcpu")
    for heads, options in ((3, 1), (4, 2)):
        g = capture(resolve_model(f"gpt:layers=3,hidden=96,heads={heads},vocab=128,seq=16"))
        layer = _Bases(g, cluster, *split_model(g)).get(2)[0]
        assert len(layer) == options

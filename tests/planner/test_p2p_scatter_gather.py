"""Megatron-LM's pipeline sends under tensor parallelism (SC'21 §4.1): each of the t ranks sends 1/t of the
boundary activation and the receivers all-gather it inside the node (SearchSpace.p2p_scatter_gather)."""
import pytest

from partita.costmodel.price import comm
from partita.costmodel.hardware import parse_cluster
from partita.planner.enumerate.candidates import _Bases, build_candidate, split_model
from partita.planner.enumerate.space import SearchSpace, TrainConfig


def _p2p(g, cluster, space, sp=False):
    pre, layers, suf = split_model(g)
    c = build_candidate(_Bases(g, cluster, pre, layers, suf), TrainConfig(global_batch=16), space,
                        pp=2, dp=1, tp=8, zero=0, b=1, sp=sp)
    return c.parts["e_p2p"][0]


def test_scatter_gather_sends_a_tth_across_nodes_and_gathers_inside(graph_of):
    g = graph_of("gpt:layers=2,hidden=4096,heads=32,seq=2048,vocab=512")  # a megabyte-scale boundary
    cluster = parse_cluster("2x8xA100-80GB")  # pp=2 x tp=8: the stages are on different nodes
    plain = _p2p(g, cluster, SearchSpace(tp=(8,), pp=(2,)))
    sg = _p2p(g, cluster, SearchSpace(tp=(8,), pp=(2,), p2p_scatter_gather=True))
    sent = g.boundary_bytes(split_model(g)[1][0])
    assert plain == pytest.approx(2 * comm.p2p(cluster, sent, True))
    assert sg == pytest.approx(2 * (comm.p2p(cluster, sent / 8, True)
                                    + comm.all_gather(cluster, comm.group_for(cluster, 8, 1), sent)))
    assert sg < plain
    # under sequence parallelism the activation already travels as each rank's 1/t: nothing changes
    assert _p2p(g, cluster, SearchSpace(tp=(8,), pp=(2,), p2p_scatter_gather=True), sp=True) == pytest.approx(
        _p2p(g, cluster, SearchSpace(tp=(8,), pp=(2,)), sp=True))

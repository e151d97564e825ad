"""Tensor parallelism beyond a node (#45: published runs use TP=16 over two 8-GPU nodes): a fixed tp of whole
nodes is planned, its collectives priced on the inter-node link; the search alone keeps tp inside a node."""
import pytest

from partita.cli import main
from partita.costmodel.errors import PartitaError
from partita.costmodel.hardware import parse_cluster
from partita.costmodel.price import comm
from partita.planner.api import plan
from partita.planner.enumerate.space import SearchSpace, tp_degrees
from partita.planner.search import TrainConfig

MODEL = "gpt:layers=4,hidden=2048,heads=16,seq=1024,vocab=32000"
TRAIN = TrainConfig(global_batch=16)


def test_a_fixed_tp_of_two_nodes_is_planned_and_pays_the_inter_node_link():
    across = plan(MODEL, cluster="2x8xH100-80GB", train=TRAIN, tp=16)
    inside = plan(MODEL, cluster="1x16xH100-80GB", train=TRAIN, tp=16)
    assert across.mesh.tp == inside.mesh.tp == 16
    # the same collectives, partly over a NIC instead of NVLink: slower
    assert across.predicted["breakdown"]["tp_comm_s"] > inside.predicted["breakdown"]["tp_comm_s"] > 0
    two, one = parse_cluster("2x8xH100-80GB"), parse_cluster("1x16xH100-80GB")
    group = comm.group_for(two, 16, 1)
    assert (group.size, group.per_node, group.nodes) == (16, 8, 2)
    activations = 16 * 1024 * 2048 * 2  # one micro-batch's bf16 activations, all-reduced twice a layer
    assert comm.all_reduce(two, group, activations) > 1.2 * comm.all_reduce(one, comm.group_for(one, 16, 1), activations)


def test_the_search_alone_keeps_tp_inside_a_node():
    cluster = parse_cluster("4x8xH100-80GB")
    assert tp_degrees(cluster, SearchSpace()) == [1, 2, 4, 8]
    assert tp_degrees(cluster, SearchSpace(tp=(16,))) == [1, 2, 4, 8, 16]
    assert plan(MODEL, cluster="2x8xH100-80GB", train=TRAIN).mesh.tp <= 8


@pytest.mark.parametrize("tp,needle", [
    (12, "tp=12 spans nodes of 8 devices, so it must be a whole number of nodes that divides the 16 devices"),
    (32, "tp=32 exceeds the cluster's 16 devices"),
])
def test_a_tp_that_splits_a_node_or_exceeds_the_cluster_is_one_line(capsys, tp, needle):
    with pytest.raises(PartitaError, match=needle):
        plan(MODEL, cluster="2x8xH100-80GB", train=TRAIN, tp=tp)
    args = ["plan", "--model", MODEL, "--cluster", "2x8xH100-80GB", "--global-batch", "16", "--tp", str(tp)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1

import pytest

from partita.costmodel.price import comm
from partita.costmodel.errors import PartitaError
from partita.costmodel.hardware import DEVICES, parse_cluster


def test_cluster_strings():
    c = parse_cluster("128x8xA100-80GB")
    assert (c.nodes, c.devices_per_node, c.num_devices, c.device.name) == (128, 8, 1024, "A100-80GB")
    assert parse_cluster("8xA100-80GB").nodes == 1
    assert parse_cluster("4xcpu").num_devices == 4


@pytest.mark.parametrize("bad", ["8x", "A100", "0x8xA100-80GB", "8xB200", "2x2x2xcpu"])
def test_bad_cluster_strings_say_what_is_accepted(bad):
    with pytest.raises(PartitaError, match="cluster|device"):
        parse_cluster(bad)


def test_reference_peaks():
    assert DEVICES["A100-80GB"].peak("bf16") == 312e12
    assert DEVICES["H100-80GB"].peak("bf16") == 989e12
    assert DEVICES["V100-32GB"].memory_bytes == 32510 * 2**20  # nvidia-smi total, MiB


def test_ring_all_reduce_inside_a_node():
    c = parse_cluster("8xA100-80GB")
    d = c.device
    g = comm.group_for(c, 8, 1)
    t = comm.all_reduce(c, g, 1e9)
    assert t == pytest.approx(2 * 7 * d.intra_node_latency + 2 * 7 / 8 * 1e9 / comm.beta_intra(d))
    assert comm.all_gather(c, g, 1e9) == pytest.approx(t / 2)


def test_groups_spanning_nodes_are_hierarchical_and_slower():
    c = parse_cluster("4x8xA100-80GB")
    inside = comm.group_for(c, 8, 1)
    across = comm.group_for(c, 4, 8)  # one rank per node
    mixed = comm.group_for(c, 16, 2)  # 4 per node on 4 nodes
    assert (inside.nodes, across.nodes, across.per_node, mixed.per_node, mixed.nodes) == (1, 4, 1, 4, 4)
    assert comm.all_reduce(c, across, 1e9) > comm.all_reduce(c, inside, 1e9)
    # hierarchical: 4 devices per node share the inter-node phase on 1/4 of the data each
    flat_over_nics = comm._ring(16, 1e9, c.device.inter_node_latency, c.device.inter_node_bw, 2)
    assert comm.all_reduce(c, mixed, 1e9) < flat_over_nics


def test_affine_split_is_exact():
    c = parse_cluster("2x8xA100-80GB")
    g = comm.group_for(c, 16, 1)
    lat, per_byte = comm.affine(comm.all_reduce, c, g)  # the ring's line
    for nbytes in (1e3, 1e6, 3e9):
        assert lat + per_byte * nbytes == pytest.approx(comm.all_reduce(c, g, nbytes, algorithm="ring"), rel=1e-9)
        assert comm.all_reduce(c, g, nbytes) <= lat + per_byte * nbytes  # an upper bound of the faster of two

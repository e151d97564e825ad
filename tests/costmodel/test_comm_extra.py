"""Tree all-reduce and the ring/tree choice, all-to-all, broadcast: hand-computed from the formulas in
costmodel/price/comm.py's docstring with a reference device (alpha_i 5 us, beta_i 600 GB/s; alpha_e 10 us,
beta_e 25 GB/s; links at their full figures), so the numbers below are the formulas' own."""
from dataclasses import replace

import pytest

from partita.costmodel.price import comm
from partita.costmodel.hardware import parse_cluster


def _reference(spec):
    c = parse_cluster(spec)
    return replace(c, device=replace(c.device, intra_node_bw=600e9, intra_link_efficiency=1.0,
                                     inter_link_efficiency=1.0))


ONE_NODE = _reference("8xA100-80GB")
FOUR_NODES = _reference("4x8xA100-80GB")
BIG = _reference("64x8xA100-80GB")


def test_reference_figures_used_below():
    d = ONE_NODE.device
    assert (d.intra_node_latency, d.intra_node_bw, d.inter_node_latency, d.inter_node_bw) == (5e-6, 600e9, 10e-6, 25e9)
    assert (comm.beta_intra(d), comm.beta_inter(ONE_NODE)) == (600e9, 25e9)


def test_links_run_at_their_achieved_fraction_of_the_per_direction_peak():
    """Presets take NVLink per direction (REFERENCE.md: A100 300 GB/s, H100 450 GB/s, not the two-way
    totals) and a collective moves bytes at the link efficiency's share of it."""
    for spec, nvlink in (("8xA100-80GB", 300e9), ("8xH100-80GB", 450e9), ("8xV100-32GB", 150e9)):
        c = parse_cluster(spec)
        d = c.device
        assert d.intra_node_bw == nvlink and 0.5 < d.intra_link_efficiency < 1 and 0.5 < d.inter_link_efficiency < 1
        assert comm.beta_intra(d) == pytest.approx(nvlink * d.intra_link_efficiency)
        g = comm.group_for(c, 8, 1)
        big = 8e9  # bandwidth-bound: the time is the bytes over the achieved bandwidth
        assert comm.all_gather(c, g, big) == pytest.approx(7 / 8 * big / comm.beta_intra(d), rel=1e-2)


def test_an_oversubscribed_pod_slows_groups_that_leave_it():
    c = replace(parse_cluster("64x8xA100-80GB"), nodes_per_pod=16, pod_oversubscription=2.0)
    inside = comm.group_for(c, 16, 8)   # one rank on each of 16 nodes: one pod
    across = comm.group_for(c, 32, 8)   # 32 nodes: two pods
    assert comm.beta_inter(c, inside.nodes) == 2 * comm.beta_inter(c, across.nodes)
    flat = parse_cluster("64x8xA100-80GB")
    assert comm.all_gather(c, inside, 1e9) == pytest.approx(comm.all_gather(flat, inside, 1e9))
    assert comm.all_gather(c, across, 1e9) > 1.8 * comm.all_gather(flat, across, 1e9)


def test_inside_a_node_the_chain_never_beats_the_ring():
    g = comm.group_for(ONE_NODE, 8, 1)
    # ring: 2*7*5e-6 + 2*7/8*1e6/600e9; chain "tree": 2*7*5e-6 + 2*1e6/600e9
    assert comm.ring_all_reduce(ONE_NODE, g, 1e6) == pytest.approx(7.2916667e-5)
    assert comm.tree_all_reduce(ONE_NODE, g, 1e6) == pytest.approx(7.3333333e-5)
    for nbytes in (1e2, 1e6, 1e9):
        assert comm.all_reduce_algorithm(ONE_NODE, g, nbytes) == "ring"
    assert comm.all_reduce_crossover(ONE_NODE, g) == 0.0


def test_double_binary_tree_across_nodes():
    g = comm.group_for(BIG, 64, 8)  # one rank on each of 64 nodes
    assert (g.nodes, g.per_node) == (64, 1)
    # ring: 2*63*10e-6 + 2*63/64*B/25e9; tree: 2*log2(64)*10e-6 + 2*B/25e9
    assert comm.ring_all_reduce(BIG, g, 1e6) == pytest.approx(1.33875e-3)
    assert comm.tree_all_reduce(BIG, g, 1e6) == pytest.approx(2.0e-4)
    assert comm.ring_all_reduce(BIG, g, 1e9) == pytest.approx(0.08001)
    assert comm.tree_all_reduce(BIG, g, 1e9) == pytest.approx(0.08012)
    assert comm.all_reduce(BIG, g, 1e6) == pytest.approx(2.0e-4)
    assert comm.all_reduce(BIG, g, 1e9) == pytest.approx(0.08001)
    # crossover: (1.26e-3 - 1.2e-4) / (2/25e9 - 2*63/64/25e9) = 9.12e8 bytes
    assert comm.all_reduce_crossover(BIG, g) == pytest.approx(9.12e8)
    assert comm.all_reduce_algorithm(BIG, g, 9.0e8) == "tree"
    assert comm.all_reduce_algorithm(BIG, g, 9.3e8) == "ring"


def test_tree_with_chains_inside_nodes():
    g = comm.group_for(FOUR_NODES, 32, 1)  # 8 per node on 4 nodes
    # ring: NCCL's ring latency passes all 32 ranks, 2 (32 - 4) steps inside nodes and 2 (4 - 1) between
    # them, 2*(28*5e-6 + 3*10e-6); bandwidth 2*7/8*1e6/600e9 + 2*3/4*(1e6/8)/25e9
    assert comm.ring_all_reduce(FOUR_NODES, g, 1e6) == pytest.approx(2 * (28 * 5e-6 + 3 * 10e-6) + 2 * 7 / 8 * 1e6 / 600e9
                                                                      + 2 * 3 / 4 * (1e6 / 8) / 25e9)
    # tree: 2*7*5e-6 + 2*1e6/600e9 + 2*2*10e-6 + 2*1e6/(8*25e9)
    assert comm.tree_all_reduce(FOUR_NODES, g, 1e6) == pytest.approx(1.2333333e-4)
    assert comm.all_reduce(FOUR_NODES, g, 1e6) == pytest.approx(1.2333333e-4)
    # all-gather: (32 - 4) steps inside nodes and 3 between, on the same bandwidth terms (factor 1)
    assert comm.all_gather(FOUR_NODES, g, 1e6) == pytest.approx(28 * 5e-6 + 3 * 10e-6 + 7 / 8 * 1e6 / 600e9
                                                               + 3 / 4 * (1e6 / 8) / 25e9)


@pytest.mark.parametrize("cluster,size,stride", [(BIG, 64, 8), (BIG, 512, 1), (FOUR_NODES, 32, 1), (BIG, 128, 4)])
def test_tree_wins_small_ring_wins_large(cluster, size, stride):
    g = comm.group_for(cluster, size, stride)
    assert comm.tree_all_reduce(cluster, g, 1e3) < comm.ring_all_reduce(cluster, g, 1e3)
    assert comm.ring_all_reduce(cluster, g, 1e10) < comm.tree_all_reduce(cluster, g, 1e10)
    for nbytes in (1e3, 1e6, 1e8, 1e10):
        assert comm.all_reduce(cluster, g, nbytes) == min(comm.ring_all_reduce(cluster, g, nbytes),
                                                           comm.tree_all_reduce(cluster, g, nbytes))


def test_affine_linearises_one_algorithm():
    g = comm.group_for(BIG, 64, 8)
    lat, per_byte = comm.affine(comm.all_reduce, BIG, g)
    assert (lat, per_byte) == (pytest.approx(1.26e-3), pytest.approx(2 * 63 / 64 / 25e9))
    cross = comm.all_reduce_crossover(BIG, g)
    for nbytes in (cross * 1.01, 3e9):  # exact where the ring is chosen
        assert lat + per_byte * nbytes == pytest.approx(comm.all_reduce(BIG, g, nbytes), rel=1e-9)
    assert lat + per_byte * 1e6 > comm.all_reduce(BIG, g, 1e6)  # an upper bound below the crossover
    t_lat, t_pb = comm.affine(comm.all_reduce, BIG, g, algorithm="tree")
    assert (t_lat, t_pb) == (pytest.approx(1.2e-4), pytest.approx(2 / 25e9))
    with pytest.raises(ValueError, match="one all-reduce algorithm"):
        comm.affine(comm.all_reduce, BIG, g, algorithm="auto")
    with pytest.raises(ValueError, match="accepted: auto, ring, tree"):
        comm.all_reduce(BIG, g, 1e6, algorithm="halving")


def test_all_to_all():
    g = comm.group_for(ONE_NODE, 8, 1)
    # 7 * (5e-6 + (8e6/8)/600e9)
    assert comm.all_to_all(ONE_NODE, g, 8e6) == pytest.approx(4.6666667e-5)
    two = _reference("2x8xA100-80GB")
    g16 = comm.group_for(two, 16, 1)
    # 7 peers on the node + 8 off it, 1e6 bytes each: 7*(5e-6 + 1e6/600e9) + 8*(10e-6 + 1e6/25e9)
    assert comm.all_to_all(two, g16, 16e6) == pytest.approx(4.4666667e-4)
    assert comm.all_to_all(two, comm.Group(1, 1), 16e6) == 0.0
    lat, pb = comm.affine(comm.all_to_all, two, g16)
    assert lat + pb * 5e7 == pytest.approx(comm.all_to_all(two, g16, 5e7))


def test_broadcast_binomial_small_pipelined_ring_large():
    g = comm.group_for(ONE_NODE, 8, 1)
    # binomial 3*(5e-6 + 1e3/600e9) beats the ring 7*5e-6 + 1e3/600e9
    assert comm.broadcast(ONE_NODE, g, 1e3) == pytest.approx(1.5005e-5)
    # ring 7*5e-6 + 1e9/600e9 beats binomial 3*(5e-6 + 1e9/600e9)
    assert comm.broadcast(ONE_NODE, g, 1e9) == pytest.approx(1.7016667e-3)
    g32 = comm.group_for(FOUR_NODES, 32, 1)
    # leaders across 4 nodes, then inside: min(2*(1e-5 + 1e9/25e9), 3e-5 + 1e9/25e9) + 1.7016667e-3
    assert comm.broadcast(FOUR_NODES, g32, 1e9) == pytest.approx(0.04003 + 1.7016667e-3)


def test_zero_sizes_and_singletons_are_free():
    g = comm.group_for(BIG, 64, 8)
    for f in (comm.all_reduce, comm.ring_all_reduce, comm.tree_all_reduce, comm.all_to_all):
        assert f(BIG, g, 0) == 0.0 and f(BIG, comm.Group(1, 1), 1e6) == 0.0
    assert comm.broadcast(BIG, comm.Group(1, 1), 1e6) == 0.0

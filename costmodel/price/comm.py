"""Alpha-beta costs of collectives (Hockney model), with NCCL's choice between ring and tree.

Notation: n ranks in the group, B bytes (defined per collective below), alpha the latency of one
message on a link, beta the link's bandwidth in bytes/s. A group that spans N nodes has k = n / N ranks
on each node; intra-node links have (alpha_i, beta_i), each device's share of the NICs (alpha_e, beta_e).

Ring algorithms (Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations in
MPICH", IJHPCA 19(1), 2005; the same factors are the "bus bandwidth" factors of NVIDIA's nccl-tests,
doc/PERFORMANCE.md):

    all-reduce      2 (n-1) alpha + 2 (n-1)/n * B / beta     B = the tensor each rank holds
    all-gather        (n-1) alpha +   (n-1)/n * B / beta     B = the gathered, full size
    reduce-scatter    (n-1) alpha +   (n-1)/n * B / beta     B = the full, unreduced size
    all-to-all        (n-1) alpha +   (n-1)/n * B / beta     B = what each rank holds; it keeps 1/n of it
                                                             (pairwise exchange, Thakur et al.)
    point-to-point          alpha +             B / beta

Across nodes the ring collectives' bandwidth is priced hierarchically: reduce-scatter inside each node,
the collective across the N nodes on 1/k of the data (the k devices of a node drive their k NIC shares
in parallel), all-gather inside the node; phases are added, not overlapped (a conservative choice).
Their latency is that of NCCL's ring, which passes every rank of the group: n - 1 message steps (2 (n - 1)
for all-reduce), N - 1 (2 (N - 1)) of them between nodes -- the hop counts of NCCL's own tuning model
(src/graph/tuning.cc, nsteps and nInterSteps) -- so

    ring latency across nodes   f ((n - N) alpha_i + (N - 1) alpha_e),   f = 2 for all-reduce, 1 otherwise

where two nested rings would count only (k - 1) + (N - 1) steps: on 64 nodes of 8 ranks, 70 instead
of 511.

Tree all-reduce: NCCL 2.4+ also runs all-reduce on a *double binary tree* across nodes (two
complementary binary trees, each carrying half of the data, so every rank sends and receives about 2B in
all: full bandwidth, logarithmic latency), with a chain through the k ranks inside each node (NVIDIA
developer blog "Massively Scale Your Deep Learning Training with NCCL 2.4", 2019; NVIDIA/nccl issue
545: "there are only inter-node trees, and intra-node is connected using chains"). Reduce goes up, the
broadcast comes down, both pipelined in chunks:

    tree all-reduce   2 (k-1) alpha_i + 2 B / beta_i         (chain inside the node; absent when k = 1)
                    + 2 ceil(log2 N) alpha_e + 2 B / (k beta_e)   (double binary tree; absent when N = 1)

`all_reduce` takes the faster of ring and tree for the size, as NCCL's tuner does. Inside one node
(N = 1) the chain has the ring's latency and more traffic, so the ring always wins there, as in NCCL;
across nodes the tree's latency grows with log2 N instead of N, so it wins for small messages on many
nodes and the ring (whose bandwidth term is never larger) wins for large ones. The crossover is
`all_reduce_crossover`.

Broadcast (B = the tensor, from one root): the faster of a binomial tree, ceil(log2 n) (alpha + B/beta)
(Thakur et al., short messages), and NCCL's pipelined ring, (n-1) alpha + B / beta (nccl-tests:
bus bandwidth = algorithm bandwidth for broadcast); across nodes: among node leaders, then inside nodes.

In a training step each message step also pays the device's `sync_latency` (costmodel.hardware.Device):
the ranks come from computing, so the peer's communication thread must be woken -- with more ranks than
cores, scheduled -- before the message moves, which a back-to-back timing (what `partita calibrate` fits
alpha and beta to) never sees. Every form above therefore uses

    alpha = Device.intra_node_latency + Device.sync_latency      (inside a node)
    alpha = Device.inter_node_latency + Device.sync_latency      (across nodes)

e.g. an in-step ring all-reduce inside a node costs 2 (n-1) (alpha_i + sync) + 2 (n-1)/n B / beta_i and a
point-to-point transfer alpha_i + sync + B / beta_i. sync_latency is 0 for the GPU presets (NCCL kernels
queue on the stream behind the compute that precedes them).

`affine` gives a (latency, seconds per byte) line for linear programs. all_reduce is piecewise (the min
of two lines), so `affine(all_reduce, ...)` linearises one algorithm: the ring by default, which is what
large gradient buckets use; it is exact above the crossover and an upper bound below it.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from partita.costmodel.hardware import Cluster

ALL_REDUCE_ALGORITHMS = ("auto", "ring", "tree")


@dataclass(frozen=True)
class Group:
    """A communication group: `size` ranks, `per_node` of them on each node."""

    size: int
    per_node: int

    @property
    def nodes(self) -> int:
        return max(1, self.size // self.per_node)


def group_for(cluster: Cluster, size: int, stride: int) -> Group:
    """The group of `size` ranks spaced `stride` apart in the rank order (node-major)."""
    return _group(cluster.devices_per_node, size, stride)


@functools.lru_cache(maxsize=4096)
def _group(dpn: int, size: int, stride: int) -> Group:
    if size <= 1:
        return Group(1, 1)
    span = size * stride
    if span <= dpn:
        return Group(size, size)
    per_node = max(1, dpn // stride) if stride < dpn else 1
    return Group(size, min(per_node, size))


def beta_intra(d) -> float:
    """Bytes/s a collective moves per device and direction inside a node: the link's per-direction peak
    times what NCCL achieves of it (Device.intra_link_efficiency)."""
    return d.intra_node_bw * d.intra_link_efficiency


def beta_inter(cluster: Cluster, nodes: int = 2) -> float:
    """Bytes/s per device and direction across nodes, for a group spanning `nodes` nodes: the NIC share
    times its achieved fraction (Device.inter_link_efficiency), divided by the pod oversubscription when
    the group spans more nodes than one pod holds (Cluster.nodes_per_pod)."""
    d = cluster.device
    beta = d.inter_node_bw * d.inter_link_efficiency
    if cluster.nodes_per_pod and nodes > cluster.nodes_per_pod:
        beta /= cluster.pod_oversubscription
    return beta


def alpha_intra(d) -> float:
    """In-step latency of one message step between devices of a node (module docstring)."""
    return d.intra_node_latency + d.sync_latency


def alpha_inter(d) -> float:
    """In-step latency of one message step between nodes (module docstring)."""
    return d.inter_node_latency + d.sync_latency


def _ring(n: int, nbytes: float, alpha: float, beta: float, factor: float) -> float:
    if n <= 1 or nbytes <= 0:
        return 0.0
    return factor * (n - 1) * alpha + factor * (n - 1) / n * nbytes / beta


def _log2(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


# ---------------------------------------------------------------------------------------- all-reduce

def ring_all_reduce(cluster: Cluster, group: Group, nbytes: float) -> float:
    d = cluster.device
    if group.size <= 1 or nbytes <= 0:
        return 0.0
    if group.nodes == 1:
        return _ring(group.size, nbytes, alpha_intra(d), beta_intra(d), 2)
    k = group.per_node
    # Each device's NIC share carries 1/k of the data in the inter-node phase; the k devices of a node
    # use their k NIC shares in parallel.
    inside = _ring(k, nbytes, 0.0, beta_intra(d), 1)
    across = _ring(group.nodes, nbytes / k, 0.0, beta_inter(cluster, group.nodes), 2)
    return 2 * inside + across + _ring_latency(d, group, 2)


def _ring_latency(d, group: Group, factor: int) -> float:
    """NCCL's ring latency across nodes: f (n - 1) steps, f (N - 1) of them between nodes (module docstring)."""
    return factor * ((group.size - group.nodes) * alpha_intra(d) + (group.nodes - 1) * alpha_inter(d))


def tree_all_reduce(cluster: Cluster, group: Group, nbytes: float) -> float:
    """NCCL's tree: a chain inside each node, a double binary tree across nodes (module docstring)."""
    d = cluster.device
    if group.size <= 1 or nbytes <= 0:
        return 0.0
    k, nodes = (group.size, 1) if group.nodes == 1 else (group.per_node, group.nodes)
    t = 0.0
    if k > 1:
        t += 2 * (k - 1) * alpha_intra(d) + 2 * nbytes / beta_intra(d)
    if nodes > 1:
        t += 2 * _log2(nodes) * alpha_inter(d) + 2 * nbytes / (k * beta_inter(cluster, nodes))
    return t


def all_reduce(cluster: Cluster, group: Group, nbytes: float, algorithm: str = "auto") -> float:
    """Seconds to all-reduce `nbytes` on `group`: the faster of ring and tree ("auto"), or one of them."""
    if algorithm == "ring":
        return ring_all_reduce(cluster, group, nbytes)
    if algorithm == "tree":
        return tree_all_reduce(cluster, group, nbytes)
    if algorithm != "auto":
        raise ValueError(f"all-reduce algorithm {algorithm!r}; accepted: {', '.join(ALL_REDUCE_ALGORITHMS)}")
    return min(ring_all_reduce(cluster, group, nbytes), tree_all_reduce(cluster, group, nbytes))


def all_reduce_algorithm(cluster: Cluster, group: Group, nbytes: float) -> str:
    """"ring" or "tree": which one `all_reduce` picks for this size (ring on ties)."""
    ring, tree = ring_all_reduce(cluster, group, nbytes), tree_all_reduce(cluster, group, nbytes)
    return "tree" if tree < ring else "ring"


def all_reduce_crossover(cluster: Cluster, group: Group) -> float:
    """Bytes below which the tree is faster than the ring (0 when it never is)."""
    ring_lat, ring_pb = _line(lambda c, g, b: ring_all_reduce(c, g, b), cluster, group)
    tree_lat, tree_pb = _line(lambda c, g, b: tree_all_reduce(c, g, b), cluster, group)
    if tree_lat >= ring_lat or tree_pb <= ring_pb:
        return 0.0
    return (ring_lat - tree_lat) / (tree_pb - ring_pb)


# ---------------------------------------------------------------------------------- other collectives

def all_gather(cluster: Cluster, group: Group, nbytes: float) -> float:
    """`nbytes` is the gathered (full) size."""
    d = cluster.device
    if group.size <= 1 or nbytes <= 0:
        return 0.0
    if group.nodes == 1:
        return _ring(group.size, nbytes, alpha_intra(d), beta_intra(d), 1)
    k = group.per_node
    return (_ring(k, nbytes, 0.0, beta_intra(d), 1)
            + _ring(group.nodes, nbytes / k, 0.0, beta_inter(cluster, group.nodes), 1) + _ring_latency(d, group, 1))


reduce_scatter = all_gather  # same volume and steps in the ring model; `nbytes` is the unreduced size


def off_node_bytes(cluster: Cluster, group: Group, nbytes: float) -> float:
    """Bytes one device sends off its node in a hierarchical all-gather or reduce-scatter of `nbytes`
    (the inter-node ring on 1/k of the data: (N-1)/N * B/k); 0 inside one node."""
    if group.size <= 1 or group.nodes <= 1 or nbytes <= 0:
        return 0.0
    return (group.nodes - 1) / group.nodes * nbytes / group.per_node


def all_to_all(cluster: Cluster, group: Group, nbytes: float) -> float:
    """Pairwise exchange: each rank holds `nbytes` and sends nbytes/n to each of the n-1 others.

    Across nodes, the (k-1) peers on the node are reached over intra-node links and the n-k others over
    the device's NIC share; the two parts are added.
    """
    d = cluster.device
    n = group.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    k = n if group.nodes == 1 else group.per_node
    chunk = nbytes / n
    t = (k - 1) * (alpha_intra(d) + chunk / beta_intra(d))
    if n > k:
        t += (n - k) * (alpha_inter(d) + chunk / beta_inter(cluster, group.nodes))
    return t


def _broadcast_flat(n: int, nbytes: float, alpha: float, beta: float) -> float:
    if n <= 1 or nbytes <= 0:
        return 0.0
    binomial = _log2(n) * (alpha + nbytes / beta)
    pipelined_ring = (n - 1) * alpha + nbytes / beta
    return min(binomial, pipelined_ring)


def broadcast(cluster: Cluster, group: Group, nbytes: float) -> float:
    """One root sends `nbytes` to every rank of the group."""
    d = cluster.device
    if group.size <= 1:
        return 0.0
    if group.nodes == 1:
        return _broadcast_flat(group.size, nbytes, alpha_intra(d), beta_intra(d))
    return (_broadcast_flat(group.nodes, nbytes, alpha_inter(d), beta_inter(cluster, group.nodes))
            + _broadcast_flat(group.per_node, nbytes, alpha_intra(d), beta_intra(d)))


def p2p(cluster: Cluster, nbytes: float, across_nodes: bool) -> float:
    d = cluster.device
    if nbytes <= 0:
        return 0.0
    if across_nodes:
        return alpha_inter(d) + nbytes / beta_inter(cluster)
    return alpha_intra(d) + nbytes / beta_intra(d)


# ------------------------------------------------------------------------------------ linear forms

def _line(collective, cluster: Cluster, group: Group) -> tuple[float, float]:
    one, big = collective(cluster, group, 1.0), collective(cluster, group, 1e9 + 1.0)
    per_byte = (big - one) / 1e9
    return one - per_byte, per_byte


def affine(collective, cluster: Cluster, group: Group, algorithm: str | None = None) -> tuple[float, float]:
    """(latency seconds, seconds per byte) of a collective, which is affine in the bytes it moves.

    Lets a linear program charge the latency once per bucket and the bandwidth per byte. For
    `all_reduce` (piecewise: the faster of ring and tree) this is the line of one algorithm, `algorithm`
    or by default the ring, which large gradient buckets use (exact above `all_reduce_crossover`, an
    upper bound below it).
    """
    if group.size <= 1:
        return 0.0, 0.0
    if collective is all_reduce or algorithm is not None:
        algo = algorithm or "ring"
        if algo == "auto":
            raise ValueError("affine() needs one all-reduce algorithm ('ring' or 'tree'), not 'auto'")
        return _line(lambda c, g, b: collective(c, g, b, algorithm=algo), cluster, group)
    return _line(collective, cluster, group)


# ------------------------------------------------------------------------------------------- islands

def islands_spanned(cluster: Cluster, span: int) -> int:
    """How many of the cluster's islands (Cluster.islands) a group of consecutive ranks `span` wide reaches:
    1 inside one island; all of them when it spans the cluster."""
    if cluster.islands <= 1 or span <= cluster.island_devices:
        return 1
    return min(cluster.islands, -(-span // cluster.island_devices))


def cross_island_all_reduce(cluster: Cluster, islands: int, nbytes: float) -> float:
    """Seconds of the cross-island phase of a hierarchical all-reduce of a tensor of `nbytes` per replica over
    `islands` islands: reduce-scatter inside each island (priced as any in-island collective), a ring all-reduce
    across the islands on the island link, all-gather inside. Each island's ranks together send the whole
    tensor once over its link, so with I islands, beta_I = Cluster.island_bw and alpha_I = island_latency:

        cross-island   2 (I - 1) alpha_I + 2 (I - 1) / I * B / beta_I        (0 when I = 1)

    (the ring's factors, module docstring, with the island as one rank of it)."""
    if islands <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (islands - 1) * cluster.island_latency + 2 * (islands - 1) / islands * nbytes / cluster.island_bw

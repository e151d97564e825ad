"""Alpha-beta costs of collectives (Hockney model; ring algorithms, Thakur et al. 2005).

A ring over n ranks moving a tensor of B bytes costs
    all-reduce:      2 (n-1) alpha + 2 (n-1)/n * B / beta
    all-gather:      (n-1) alpha   +   (n-1)/n * B / beta      (B = the gathered, full size)
    reduce-scatter:  (n-1) alpha   +   (n-1)/n * B / beta      (B = the full, unreduced size)
    point-to-point:  alpha + B / beta
where beta is the bandwidth of the slowest link on the ring. A group that spans nodes runs
hierarchically (reduce-scatter inside each node, all-reduce across nodes on 1/k of the data, all-gather
inside the node; k = group members per node), which is what NCCL's tree/ring choice approaches.
"""
from __future__ import annotations

from dataclasses import dataclass

from costmodel.hardware import Cluster


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
    if size <= 1:
        return Group(1, 1)
    span = size * stride
    dpn = cluster.devices_per_node
    if span <= dpn:
        return Group(size, size)
    per_node = max(1, dpn // stride) if stride < dpn else 1
    return Group(size, min(per_node, size))


def _ring(n: int, nbytes: float, alpha: float, beta: float, factor: float) -> float:
    if n <= 1 or nbytes <= 0:
        return 0.0
    return factor * (n - 1) * alpha + factor * (n - 1) / n * nbytes / beta


def all_reduce(cluster: Cluster, group: Group, nbytes: float) -> float:
    d = cluster.device
    if group.size <= 1:
        return 0.0
    if group.nodes == 1:
        return _ring(group.size, nbytes, d.intra_node_latency, d.intra_node_bw, 2)
    k = group.per_node
    # Each device's NIC share carries 1/k of the data in the inter-node phase; the k devices of a node
    # use their k NIC shares in parallel.
    inside = _ring(k, nbytes, d.intra_node_latency, d.intra_node_bw, 1)
    across = _ring(group.nodes, nbytes / k, d.inter_node_latency, d.inter_node_bw, 2)
    return 2 * inside + across


def all_gather(cluster: Cluster, group: Group, nbytes: float) -> float:
    d = cluster.device
    if group.size <= 1:
        return 0.0
    if group.nodes == 1:
        return _ring(group.size, nbytes, d.intra_node_latency, d.intra_node_bw, 1)
    k = group.per_node
    return (_ring(k, nbytes, d.intra_node_latency, d.intra_node_bw, 1)
            + _ring(group.nodes, nbytes / k, d.inter_node_latency, d.inter_node_bw, 1))


reduce_scatter = all_gather  # same volume and steps in the ring model


def p2p(cluster: Cluster, nbytes: float, across_nodes: bool) -> float:
    d = cluster.device
    if nbytes <= 0:
        return 0.0
    if across_nodes:
        return d.inter_node_latency + nbytes / d.inter_node_bw
    return d.intra_node_latency + nbytes / d.intra_node_bw


def affine(collective, cluster: Cluster, group: Group) -> tuple[float, float]:
    """(latency seconds, seconds per byte) of a collective, which is affine in the bytes it moves.

    Lets a linear program charge the latency once per bucket and the bandwidth per byte.
    """
    if group.size <= 1:
        return 0.0, 0.0
    one, big = collective(cluster, group, 1.0), collective(cluster, group, 1e9 + 1.0)
    per_byte = (big - one) / 1e9
    return one - per_byte, per_byte

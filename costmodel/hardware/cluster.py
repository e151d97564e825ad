"""A cluster: nodes of devices, the links between them, heterogeneous groups and islands, and the CLUSTER strings
that name one (partita.costmodel.hardware's docstring has their forms)."""
from __future__ import annotations

import math
import re
import dataclasses
from dataclasses import dataclass, asdict, fields

from partita.costmodel.errors import PartitaError, did_you_mean
from partita.costmodel.hardware.device import Device, kernel_constants, GPUS, DEVICES


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """Nodes of identical devices, or (with `groups`) the conservative view of several such groups.

    `spec` is the string or file it came from.
    """

    nodes: int
    devices_per_node: int
    device: Device
    spec: str = ""
    groups: tuple = ()
    """Homogeneous `Cluster`s (each with a `spec` naming the group, no groups of its own) when the
    cluster came from a resource list; empty for a CLUSTER string (the cluster is its own one group)."""
    inter_group_bw: float | None = None
    """Bytes/s one device can send to a device of another group; None: the groups' inter_node_bw."""
    inter_group_latency: float | None = None
    nodes_per_pod: int = 0
    """Nodes under one leaf/spine pod of a fat tree with full bandwidth inside it; 0: one flat,
    non-blocking fabric."""
    pod_oversubscription: float = 1.0
    """Ratio of a pod's node-facing to its uplink bandwidth (2.0: a 2:1 oversubscribed pod): a collective
    whose group spans pods runs its inter-node phase at inter_node_bw / this (costmodel.price.comm)."""
    islands: int = 1
    """Equal blocks of consecutive nodes (rank order is node-major) joined by one slower link: pods behind an
    oversubscribed spine, data centres, providers. 1: no islands. Inside an island everything is priced as on
    any cluster; the data-parallel traffic that crosses islands pays `island_bw` (costmodel.price.comm
    `cross_island_all_reduce`), which is what the sync modes (planner.estimate.sync) trade against."""
    island_bw: float = 0.0
    """Bytes/s one island sends to the others, per direction, all its devices together (2x100 Gb/s: 25e9)."""
    island_latency: float = 0.0
    """Seconds of one message over the island link (20 ms between data centres)."""

    @property
    def num_devices(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def island_devices(self) -> int:
        """Devices per island (all of them without islands)."""
        return self.num_devices // self.islands

    @property
    def heterogeneous(self) -> bool:
        return any(g.device != self.groups[0].device for g in self.groups)

    def group_list(self) -> tuple:
        """The homogeneous groups: `groups`, or the cluster itself."""
        return self.groups or (self,)

    def describe(self) -> dict:
        d = {"spec": self.spec, "num_devices": self.num_devices, "nodes": self.nodes,
             "devices_per_node": self.devices_per_node, "device": asdict(self.device)}
        if self.nodes_per_pod:
            d["nodes_per_pod"], d["pod_oversubscription"] = self.nodes_per_pod, self.pod_oversubscription
        if self.islands > 1:
            d.update(islands=self.islands, island_bw=self.island_bw, island_latency=self.island_latency)
        if self.groups:
            d["groups"] = [{"name": g.spec, "nodes": g.nodes, "devices_per_node": g.devices_per_node,
                            "device": asdict(g.device)} for g in self.groups]
            d["inter_group_bw"] = self.inter_group_bw
            d["inter_group_latency"] = self.inter_group_latency
        return d


# Fields of Device where the conservative value is the largest (the rest: the smallest).
_SAME_OR_UNKNOWN = {"stack": "pytorch", "generation": "", "other_attention": None}
_WORST_IS_MAX = {"gemm_half_dim", "gemm_half_mn", "gemm_split_k", "attention_half_seq", "attention_half_dim", "overlap_slowdown", "intra_node_latency", "inter_node_latency", "reserved_bytes", "allocator_headroom", "op_latency", "sync_latency",
                 "sharded_op_latency", "sharded_param_latency", "redistribute_latency"}


def device_on_stack(device: Device, stack: str) -> Device:
    """`device` running `stack`: a preset GPU takes the kernel constants of its generation under that stack;
    a device whose kernels were measured (a resource list, a CPU) keeps them and only names the stack."""
    if device.generation and device.name in GPUS:
        return dataclasses.replace(device, stack=stack, **kernel_constants(device.generation, stack))
    return dataclasses.replace(device, stack=stack)


def cluster_on_stack(cluster: Cluster, stack: str) -> Cluster:
    """`cluster` with every device on `stack` (device_on_stack)."""
    if not cluster.groups:
        return dataclasses.replace(cluster, device=device_on_stack(cluster.device, stack))
    groups = tuple(dataclasses.replace(g, device=device_on_stack(g.device, stack)) for g in cluster.groups)
    return with_fabric(cluster_from_groups(groups, inter_group_bw=cluster.inter_group_bw,
                                           inter_group_latency=cluster.inter_group_latency, spec=cluster.spec), cluster)


FABRIC_FIELDS = ("nodes_per_pod", "pod_oversubscription", "islands", "island_bw", "island_latency")
"""The Cluster fields that describe the fabric between nodes rather than its groups: carried over when a
cluster is rebuilt from its groups (`with_fabric`)."""


def with_fabric(cluster: Cluster, like: Cluster) -> Cluster:
    """`cluster` with the pods and islands of `like` (a rebuild from groups keeps them)."""
    return dataclasses.replace(cluster, **{f: getattr(like, f) for f in FABRIC_FIELDS})


def conservative_device(devices, inter_group_bw: float | None = None,
                        inter_group_latency: float | None = None) -> Device:
    """The field-wise worst of `devices`: a lower bound of each, so a plan sized and timed for it fits
    on every group and runs at least as fast there (up to the cost model's own error).

    Peaks, memory, bandwidths and efficiency take the minimum; latencies and reserved memory the
    maximum. With several groups the links between groups bound the off-node figures too.
    """
    devices = list(devices)
    if all(d == devices[0] for d in devices) and inter_group_bw is None and inter_group_latency is None:
        return devices[0]
    kw = {}
    for f in fields(Device):
        if f.name == "name":
            continue
        vals = [getattr(d, f.name) for d in devices]
        if f.name == "peak_flops":
            kw[f.name] = {k: min(v[k] for v in vals) for k in ("bf16", "fp32")}
        elif f.name in _SAME_OR_UNKNOWN:
            # the stack, generation and per-kernel curves of mixed groups are none of theirs: unknown, so
            # attention is priced by the field-wise worst attention_* fields
            kw[f.name] = vals[0] if all(v == vals[0] for v in vals) else _SAME_OR_UNKNOWN[f.name]
        elif f.name == "allocator_headroom":  # a flat headroom where any group states one (the largest)
            kw[f.name] = max((v for v in vals if v is not None), default=None)
        elif f.name == "attention_causal_block":
            kw[f.name] = 0.0 if 0 in vals else max(vals)  # 0: a kernel that computes the whole square
        else:
            kw[f.name] = max(vals) if f.name in _WORST_IS_MAX else min(vals)
    if inter_group_bw is not None:
        kw["inter_node_bw"] = min(kw["inter_node_bw"], inter_group_bw)
    if inter_group_latency is not None:
        kw["inter_node_latency"] = max(kw["inter_node_latency"], inter_group_latency)
    names = list(dict.fromkeys(d.name for d in devices))
    # One name keeps checks such as `device.name == "cpu"` meaningful when all groups share a kind.
    name = names[0] if len(names) == 1 else "min(" + ",".join(names) + ")"
    return Device(name=name, **kw)


def cluster_from_groups(groups, *, inter_group_bw: float | None = None,
                        inter_group_latency: float | None = None, spec: str = "") -> Cluster:
    """A Cluster over homogeneous `groups` (Clusters), with the conservative homogeneous view."""
    groups = tuple(groups)
    if not groups:
        raise PartitaError("a cluster needs at least one group of devices")
    total = sum(g.num_devices for g in groups)
    per_node = math.gcd(*(g.devices_per_node for g in groups))
    multi = len(groups) > 1
    device = conservative_device([g.device for g in groups], inter_group_bw if multi else None,
                                 inter_group_latency if multi else None)
    return Cluster(nodes=total // per_node, devices_per_node=per_node, device=device, spec=spec,
                   groups=groups, inter_group_bw=inter_group_bw, inter_group_latency=inter_group_latency)


_CLUSTER_RE = re.compile(r"^(?:(\d+)x)?(\d+)x([A-Za-z0-9][A-Za-z0-9.\-]*)$")
_ISLANDS_RE = re.compile(r"^(\d+)x(.+)@(?:(\d+)x)?(\d+(?:\.\d+)?)(Gbps|Gb/s|Mbps|Mb/s|GB/s)"
                         r"(?:,(\d+(?:\.\d+)?)(ms|us|s))?$")
_BITS_PER_S = {"Gbps": 1e9, "Gb/s": 1e9, "Mbps": 1e6, "Mb/s": 1e6, "GB/s": 8e9}
_SECONDS = {"ms": 1e-3, "us": 1e-6, "s": 1.0}
ISLANDS_FORMAT = "ISLANDSx<cluster>@[LINKSx]BANDWIDTH[,LATENCY], e.g. 2x8x8xH100-80GB@2x100Gbps,20ms"


def get_device(name: str) -> Device:
    try:
        return DEVICES[name]
    except KeyError:
        raise PartitaError(f"unknown device {name!r}{did_you_mean(name, DEVICES)}; presets: "
                           f"{', '.join(DEVICES)}") from None


GENERATION_PRESETS = {7: "V100-32GB", 8: "A100-80GB", 9: "H100-80GB"}
"""The preset standing for each CUDA compute-capability major (Volta/Turing, Ampere/Ada, Hopper): the links
and host of a GPU that has no preset of its own (`gpu_preset` returned None)."""


def gpu_preset(name: str, memory_bytes: float) -> str | None:
    """The preset of a local GPU, from the name the driver gives it (torch.cuda.get_device_name, e.g. "NVIDIA
    H200", "NVIDIA A100-SXM4-40GB") and its memory: a preset whose model ("H200", "A100") is in the name and
    whose memory is within 10% of the GPU's (an "H100 NVL" of 94 GB or a GH200 of 96 GB is not the H100-80GB or
    H200-141GB preset); the closest in memory where several match. None when no preset is this GPU."""
    upper = name.upper()
    found = [d for d in DEVICES.values() if d.name != "cpu" and d.name.split("-")[0] in upper
             and abs(d.memory_bytes - memory_bytes) <= 0.1 * d.memory_bytes]
    return min(found, key=lambda d: abs(d.memory_bytes - memory_bytes)).name if found else None


def generation_preset(capability: tuple[int, int]) -> str:
    """GENERATION_PRESETS' preset for a compute capability (newer than Hopper: Hopper's)."""
    major = capability[0]
    return GENERATION_PRESETS[min(max(major, min(GENERATION_PRESETS)), max(GENERATION_PRESETS))]


def parse_cluster_string(spec: str) -> Cluster:
    """'8xA100-80GB' -> 1 node of 8; '128x8xA100-80GB' -> 128 nodes of 8; '4xcpu' -> 4 processes; islands
    (`parse_islands`). A resource list's path is the package's parse_cluster's to read (costmodel.hardware)."""
    if "@" in spec:
        return parse_islands(spec)
    m = _CLUSTER_RE.match(spec.strip())
    if not m:
        raise PartitaError(f"malformed cluster {spec!r}; use DEVICESxNAME or NODESxDEVICESxNAME, "
                           f"e.g. 8xA100-80GB, 128x8xA100-80GB, 4xcpu (devices: {', '.join(DEVICES)}), "
                           f"or the path of a resource list (.json/.yaml, see `partita calibrate`)")
    nodes, per_node, name = int(m.group(1) or 1), int(m.group(2)), m.group(3)
    device = get_device(name)
    if nodes < 1 or per_node < 1:
        raise PartitaError(f"cluster {spec!r} must have at least one node and one device per node")
    return Cluster(nodes=nodes, devices_per_node=per_node, device=device, spec=spec)


def parse_islands(spec: str) -> Cluster:
    """'2x8x8xH100-80GB@2x100Gbps,20ms' -> 2 islands, each the cluster '8x8xH100-80GB' (8 nodes of 8), joined by
    a link of 2 x 100 Gb/s per direction (25e9 bytes/s each way for the whole island) with 20 ms latency.
    ISLANDS_FORMAT: the count of islands, `x`, one island as a CLUSTER string, `@`, the link between islands:
    [LINKSx]BANDWIDTH in Gbps, Gb/s, Mbps, Mb/s or GB/s, then optionally `,` and a latency in ms, us or s (0 if
    left out). '2x64xH100-80GB@2x100Gbps,20ms' reads as 2 islands of one 64-device node each."""
    m = _ISLANDS_RE.match(spec.strip())
    if not m:
        raise PartitaError(f"malformed island cluster {spec!r}; use {ISLANDS_FORMAT}")
    count, links = int(m.group(1)), int(m.group(3) or 1)
    if count < 2 or links < 1:
        raise PartitaError(f"island cluster {spec!r} needs 2 or more islands and 1 or more links; use {ISLANDS_FORMAT}")
    one = parse_cluster_string(m.group(2))
    if one.groups or one.islands > 1:
        raise PartitaError(f"island cluster {spec!r}: one island must be a CLUSTER string such as 8x8xH100-80GB")
    bw = links * float(m.group(4)) * _BITS_PER_S[m.group(5)] / 8
    latency = float(m.group(6)) * _SECONDS[m.group(7)] if m.group(6) else 0.0
    return dataclasses.replace(one, nodes=count * one.nodes, spec=spec, islands=count, island_bw=bw,
                               island_latency=latency)

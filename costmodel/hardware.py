"""Devices, links and clusters.

Device peaks are the dense bf16/fp16 tensor-core figures of REFERENCE.md (vendor datasheets); fp32
peaks are the vendors' non-tensor-core FP32 figures. Achievable efficiency is a property of the device
preset (one place), not scattered through the search; `partita calibrate` replaces it with a measurement.

CLUSTER strings (DESIGN.md): "8xA100-80GB" (one node of 8), "128x8xA100-80GB" (nodes x devices per
node), "4xcpu" (local processes), or the path of a resource list (JSON/YAML, `partita.costmodel.resources`, as
written by `partita calibrate`), which may hold several groups of different devices.

A heterogeneous cluster keeps the homogeneous view the planner uses today, chosen to be conservative:
`device` is the field-wise worst device of all groups (`conservative_device`), `devices_per_node` the
greatest common divisor of the groups' devices per node (so a group of that many ranks is inside one
node of every group), `nodes` = total devices / devices_per_node, so `num_devices` is exact. The groups
themselves are in `cluster.groups`, each a homogeneous `Cluster`, for a planner that places stages on
different groups.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, asdict, fields

from partita.costmodel.errors import PartitaError

GB = 1e9
GiB = 2**30


DEFAULT_ALLOCATOR_HEADROOM = 0.05
"""Device.allocator_headroom when none is given: 5% of the memory after the reserve (6.9 GiB of an H200,
3.9 GiB of an H100-80GB). From the first runs on a GPU (GPU-MEASUREMENTS.md, H200, torch 2.11): with
PyTorch's default allocator a 1.5B-parameter plan failed holding 12.55 GiB reserved but unallocated beside
114.12 GiB allocated (11% of what it held), which is why the runtime turns on expandable segments
(runtime/allocator.py); with them the same plan ran at 129.78 GiB allocated of 140.40, so what the
allocator kept beyond its peak, the CUDA context and NCCL fitted in 10.6 GiB (7.6%); and the plan the
search had filled to 138.38 of 138.40 usable GiB (llama3-8b) failed with 21 MiB free. 5%, half the
default allocator's fragmentation, keeps a plan clear of that edge and still admits the 129.78 GiB plan
that ran ((140.40 - 2) x 0.95 = 131.5 GiB usable). Not measured with expandable segments beyond that
run: a run that measures peak reserved against peak allocated (torch.cuda.max_memory_reserved) is what
would refine it."""


@dataclass(frozen=True, kw_only=True)
class Device:
    name: str
    peak_flops: dict
    """Dense peak FLOP/s by dtype ("bf16", "fp32")."""
    memory_bytes: float
    mem_bandwidth: float
    """HBM (or DRAM) bytes/s."""
    intra_node_bw: float
    """Bytes/s one device can send to its node peers, one direction (NVLink: the per-direction figure of
    REFERENCE.md, half the two-way total a datasheet headlines)."""
    inter_node_bw: float
    """Bytes/s one device can send off-node, one direction (its share of the node's NICs)."""
    matmul_efficiency: float = 0.75
    """Fraction of peak that large, aligned GEMMs reach (costmodel.kernels: e_max)."""
    gemm_half_dim: float = 0.0
    """GEMM dimension at which that dimension alone halves the efficiency (costmodel.kernels:
    s(x) = x / (x + gemm_half_dim)); 0: every GEMM at matmul_efficiency whatever its shape."""
    attention_efficiency: float = 0.0
    """Fraction of peak fused attention (FlashAttention-style SDPA) reaches, forward and backward
    together, on sequences far above `attention_half_seq`; 0: matmul_efficiency."""
    attention_half_seq: float = 0.0
    """Query length at which fused attention runs at half of attention_efficiency (costmodel.kernels:
    s(seq) = seq / (seq + attention_half_seq)); 0: every sequence at attention_efficiency."""
    mem_efficiency: float = 1.0
    """Fraction of mem_bandwidth memory-bound kernels achieve."""
    intra_link_efficiency: float = 1.0
    """Fraction of intra_node_bw a collective achieves (nccl-tests bus bandwidth / link peak)."""
    inter_link_efficiency: float = 1.0
    """Fraction of inter_node_bw a collective achieves across nodes."""
    overlap_slowdown: float = 0.0
    """Compute slows by this fraction of the time a collective runs beside it (costmodel.streams): NCCL
    kernels take SMs and HBM bandwidth from the GEMMs they overlap."""
    intra_node_latency: float = 5e-6
    inter_node_latency: float = 10e-6
    host_bw: float = 25 * GB
    """Device <-> host memory bytes/s (PCIe 4.0 x16 ~25 GB/s), for offload."""
    reserved_bytes: float = 2 * GiB
    """Device memory outside PyTorch's caching allocator, which no plan may use: the CUDA context (the
    driver's per-process state and the kernels of torch, cuBLAS, cuDNN and NCCL it loads: some hundreds of
    MiB under CUDA 12's lazy module loading) and NCCL's buffers (per communicator, channel and peer, one
    buffer per protocol -- NCCL_BUFFSIZE, 4 MiB by default, for the Simple protocol, NVIDIA's NCCL User
    Guide, "Environment Variables"; a rank opens a communicator for each process group it communicates
    in -- data, tensor, pipeline -- each some hundreds of MiB over NVLink's many channels). 2 GiB on the GPU
    presets. Measured bound (GPU-MEASUREMENTS.md, one H200, one rank): at the llama3-8b OOM 135.77 GiB were
    allocated and 21 MiB free of 140.40 GiB, so the context, NCCL and the allocator's cached blocks held
    4.61 GiB between them."""
    allocator_headroom: float = DEFAULT_ALLOCATOR_HEADROOM
    """Fraction of the memory after `reserved_bytes` that a plan leaves free for the caching allocator:
    blocks it has cached but not handed out (fragmentation, rounding to its block sizes). usable_memory()
    is what remains; `partita plan --memory-headroom` sets it (DEFAULT_ALLOCATOR_HEADROOM's docstring says
    where the default comes from)."""
    op_latency: float = 5e-6
    """Seconds every operator costs beyond its FLOPs and bytes: a CUDA kernel launch (~5 us), or PyTorch's
    eager dispatch on CPU (tens of us, measured by `partita calibrate`). Dominates small models."""
    host_memory_bytes: float = 0.0
    """Host DRAM this device may fill with offloaded activations and states (its share of the node's);
    0 where the device's memory already is host memory (a CPU), which rules offload out."""
    sync_latency: float = 0.0
    """Seconds each message step of a collective (each of a ring all-reduce's 2 (n-1) steps, a
    point-to-point transfer) costs inside a training step on top of the back-to-back latency alpha
    (costmodel.comm uses alpha + sync_latency): the ranks arrive from computing, so the peer's
    communication thread must be woken -- with more ranks than cores, scheduled -- before the message
    moves. `partita calibrate` measures it on CPU from what one small collective adds to a loop of
    compute bursts on all ranks (calibrate.measure_in_step, calibrate.sync_latency). 0 for the GPU
    presets: NCCL kernels queue on the stream behind the compute that precedes them."""
    sharded_op_latency: float = 0.0
    """Seconds an operator on DTensors costs beyond `op_latency`: DTensor's Python dispatch (sharding
    propagation lookup, unwrapping and wrapping local tensors), paid per operator the planner counts
    (planner.strategies: forward and backward launches of every node run on DTensors, and the optimizer's
    operators on DTensor parameters). `partita calibrate` measures it on CPU, where it is on the critical
    path. 0 for the GPU presets: the host dispatches ahead of the GPU, so it hides behind kernels that
    run longer than it does (large-model training)."""
    sharded_param_latency: float = 0.0
    """Seconds an optimizer step costs per parameter held as a DTensor, beyond its memory traffic: the
    runtime's AdamW (foreach=False) runs a handful of operators per parameter, each dispatched by DTensor
    (tensor-parallel weights; every parameter under FSDP). Measured by `partita calibrate` as above; 0
    for the GPU presets."""
    redistribute_latency: float = 0.0
    """Seconds each tensor-parallel collective costs the CPU beyond the collective itself: it is a DTensor
    redistribution (planning, functional-collective launch, wrapping the result, its autograd node),
    charged once per forward or backward collective of a tensor-parallel block (planner.strategies).
    Measured by `partita calibrate` (calibrate.measure_dtensor); 0 for the GPU presets."""

    def usable_memory(self) -> float:
        """Bytes a plan's peak may reach: the memory less the reserve (CUDA context, NCCL), less the
        allocator headroom of what is left."""
        return (self.memory_bytes - self.reserved_bytes) - self.headroom_bytes()

    def headroom_bytes(self) -> float:
        """The allocator headroom in bytes (`allocator_headroom` of the memory after the reserve)."""
        return (self.memory_bytes - self.reserved_bytes) * self.allocator_headroom

    def peak(self, dtype: str) -> float:
        return self.peak_flops["bf16" if dtype in ("bf16", "fp16") else "fp32"]


def _gpu(name, bf16_tflops, fp32_tflops, mem_mib, hbm_gbs, nvlink_gbs, nic_gbs, host_gb, host_link_gbs, kernels):
    return Device(name=name, peak_flops={"bf16": bf16_tflops * 1e12, "fp32": fp32_tflops * 1e12},
                  memory_bytes=mem_mib * 2**20, mem_bandwidth=hbm_gbs * GB, intra_node_bw=nvlink_gbs * GB,
                  inter_node_bw=nic_gbs * GB, host_memory_bytes=host_gb * GB, host_bw=host_link_gbs * GB, **kernels)


# How kernels and links run on each GPU generation: one set per generation, for every model and every
# configuration (benchmarks.published checks them against published runs; no per-model factor).
# - matmul_efficiency: cuBLAS bf16 on large aligned GEMMs as sustained in training (A100: ~80% of
#   312 TFLOP/s; H100 SXM: ~60-65% of 989 -- ~600-650 TFLOP/s at its 700 W power limit);
# - gemm_half_dim: the size at which one GEMM dimension halves that (tile and wave quantisation,
#   costmodel.kernels);
# - attention_efficiency: FlashAttention-2 (Dao 2023): ~50-70% of A100 peak forward, less backward;
#   ~35-45% of H100's (FlashAttention-3, Shah et al. 2024, reaches 75% with Hopper-specific code that
#   PyTorch's SDPA does not use by default), on long sequences;
# - attention_half_seq: the query length at which fused attention runs at half that -- a kernel's fixed
#   work per query block (loading it, rescaling, writing it out, the causal diagonal computed whole) is
#   amortised over the key blocks it streams, so throughput rises with sequence length (FlashAttention-2,
#   Dao 2023, its A100 and H100 benchmark figures over 512 to 16k tokens). Fitted, one value per
#   generation, to llm-foundry's sequence sweeps (512 to 65536 tokens of the same models on the same
#   GPUs, benchmarks.published); Volta has no published fused-attention run here and takes Ampere's curve;
# - mem_efficiency: achievable HBM bandwidth for elementwise kernels (~80% of the datasheet);
# - link efficiencies: nccl-tests bus bandwidth against the per-direction peak (NVLink ~75-80%,
#   InfiniBand/RoCE ~80-90% at training scale);
# - overlap_slowdown: compute stretch while NCCL kernels run beside it (T3, Pati et al. ASPLOS'24:
#   concurrent GEMMs and collectives slow each other by tens of percent).
GPU_OVERLAP_SLOWDOWN = 0.15
"""Device.overlap_slowdown of every GPU preset, and what `partita calibrate` keeps on a GPU (not measured)."""
_VOLTA = dict(matmul_efficiency=0.80, gemm_half_dim=96, attention_efficiency=0.45, attention_half_seq=1536,
              mem_efficiency=0.8, intra_link_efficiency=0.8, inter_link_efficiency=0.85,
              overlap_slowdown=GPU_OVERLAP_SLOWDOWN)
_AMPERE = dict(matmul_efficiency=0.80, gemm_half_dim=96, attention_efficiency=0.65, attention_half_seq=1536,
               mem_efficiency=0.8, intra_link_efficiency=0.8, inter_link_efficiency=0.85,
               overlap_slowdown=GPU_OVERLAP_SLOWDOWN)
_HOPPER = dict(matmul_efficiency=0.62, gemm_half_dim=128, attention_efficiency=0.42, attention_half_seq=1024,
               mem_efficiency=0.8, intra_link_efficiency=0.8, inter_link_efficiency=0.85,
               overlap_slowdown=GPU_OVERLAP_SLOWDOWN)

# REFERENCE.md "Hardware": NVLink per direction (150 / 300 / 450 GB/s). Memory as the driver reports it
# (nvidia-smi's total, MiB): the "80GB" of A100-80GB is 80 GiB (81920 MiB), H100-80GB 81559 MiB,
# H200 143771 MiB, A100-40GB 40960 MiB, V100 16160 / 32510 MiB. Host link per GPU (offload copies): the
# DGX/HGX boards pair two GPUs (and their NICs) behind one PCIe switch with one x16 uplink to the CPU,
# so when every GPU offloads each gets half of it: PCIe 3.0 (DGX-1) ~16 GB/s -> 8, PCIe 4.0 (A100)
# ~25 GB/s -> 12.5, PCIe 5.0 (H100/H200) ~50 GB/s -> 25. Off-node bandwidth per GPU:
# Selene has 8 HDR HCAs (200 Gb/s = 25 GB/s) per 8-GPU node; Llama 3's H100 cluster 400 Gb/s (50 GB/s)
# per GPU. Host memory per GPU: the DGX node's DRAM over its 8 GPUs (DGX-1 V100 512 GB, DGX A100 1 TB,
# DGX H100/H200 2 TB).
DEVICES: dict[str, Device] = {d.name: d for d in [
    _gpu("V100-16GB", 125, 15.7, 16160, 900, 150, 12.5, 64, 8, _VOLTA),
    _gpu("V100-32GB", 125, 15.7, 32510, 900, 150, 12.5, 64, 8, _VOLTA),
    _gpu("A100-40GB", 312, 19.5, 40960, 1555, 300, 25, 128, 12.5, _AMPERE),
    _gpu("A100-80GB", 312, 19.5, 81920, 2039, 300, 25, 128, 12.5, _AMPERE),
    _gpu("H100-80GB", 989, 67, 81559, 3350, 450, 50, 256, 25, _HOPPER),
    _gpu("H200-141GB", 989, 67, 143771, 4800, 450, 50, 256, 25, _HOPPER),
    # One CPU process of a small host, gloo over loopback. Rough defaults measured on the 2-core
    # development machine (TORCH-NOTES.md: 64 MB all_reduce ~72 ms on 2 ranks); `partita calibrate`
    # measures the real figures.
    Device(name="cpu", peak_flops={"bf16": 50e9, "fp32": 100e9}, memory_bytes=4 * GiB, mem_bandwidth=10 * GB,
           intra_node_bw=1 * GB, inter_node_bw=0.1 * GB, matmul_efficiency=0.5, intra_node_latency=5e-4,
           inter_node_latency=1e-3, host_bw=10 * GB, reserved_bytes=0.25 * GiB, op_latency=2e-5,
           # gloo's threads run on the cores that compute: what a collective overlaps, compute loses
           overlap_slowdown=1.0),
]}


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
    whose group spans pods runs its inter-node phase at inter_node_bw / this (costmodel.comm)."""

    @property
    def num_devices(self) -> int:
        return self.nodes * self.devices_per_node

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
        if self.groups:
            d["groups"] = [{"name": g.spec, "nodes": g.nodes, "devices_per_node": g.devices_per_node,
                            "device": asdict(g.device)} for g in self.groups]
            d["inter_group_bw"] = self.inter_group_bw
            d["inter_group_latency"] = self.inter_group_latency
        return d


# Fields of Device where the conservative value is the largest (the rest: the smallest).
_WORST_IS_MAX = {"gemm_half_dim", "overlap_slowdown", "intra_node_latency", "inter_node_latency", "reserved_bytes",
                 "allocator_headroom", "op_latency", "sync_latency",
                 "sharded_op_latency", "sharded_param_latency", "redistribute_latency"}


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


def get_device(name: str) -> Device:
    try:
        return DEVICES[name]
    except KeyError:
        raise PartitaError(f"unknown device {name!r}; presets: {', '.join(DEVICES)}") from None


def _is_resource_file(spec) -> bool:
    if isinstance(spec, os.PathLike):
        return True
    return os.path.isfile(spec) or spec.strip().lower().endswith((".json", ".yaml", ".yml"))


def parse_cluster(spec: str) -> Cluster:
    """'8xA100-80GB' -> 1 node of 8; '128x8xA100-80GB' -> 128 nodes of 8; '4xcpu' -> 4 processes;
    a path to a resource list (an existing file, or a name ending .json/.yaml/.yml) -> its Cluster."""
    if _is_resource_file(spec):
        from partita.costmodel.resources import load_resources  # resources imports this module
        return load_resources(spec)
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

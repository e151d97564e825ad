"""A device: its peaks, memory, links and achievable efficiencies; the GPU presets and the fitted kernel constants
they read (partita.costmodel.hardware's docstring says where the figures come from)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from partita.costmodel.errors import PartitaError
from partita.costmodel.hardware.stacks import get_stack

GB = 1e9
GiB = 2**30


DEFAULT_ALLOCATOR_HEADROOM = 0.05
"""The flat allocator headroom of devices without a CUDA caching allocator to model (the cpu preset) and of
paths that price no transients (the embedding-table planners): 5% of the memory after the reserve. From the
first runs on a GPU (GPU-MEASUREMENTS.md, H200, torch 2.11): with PyTorch's default allocator a
1.5B-parameter plan failed holding 12.55 GiB reserved but unallocated beside 114.12 GiB allocated, which is
why the runtime turns on expandable segments (runtime/loop/allocator.py). The GPU presets no longer use it
for dense plans: their headroom is the allocator's cache as ALLOCATOR_CACHE_FACTOR prices it, per stage."""

ALLOCATOR_CACHE_FACTOR = 1.1
"""The CUDA caching allocator's cache at a stage's peak (peak reserved less peak allocated), as a multiple of
the stage's largest transient: the largest tensor its matrix multiplications produce -- on the last stage the
head's output, the logits (micro-batch x sequence x vocabulary / the head's tensor-parallel split, in the
compute dtype), elsewhere a layer's widest projection. Measured on the H200 with expandable segments
(benchmarks/results/gpu.json): on the eight plans that recompute nothing -- a 1.5B Llama eager and compiled at
micro-batch 2 and 8 (2026-11-28), and four shapes no fit had seen, GPT 350M and 1.3B, a 16-layer llama3-8b
(2026-11-30) -- the cache was 1.03-1.10 x the logits (8.13 GiB beside 7.83 GiB; 2.14 beside 1.96), where the
flat 5% headroom it replaces (6.9 GiB) was below it. The factor is the upper envelope of those ratios, rounded up
to 0.01: `python -m benchmarks.allocator_cache` fits it from gpu.json (results/allocator_cache.json), and
tests/planner/test_allocator_cache.py fails when it is below a measured ratio. Not measured yet: stages
without the head (pipelines), tensor-parallel heads, other GPUs."""
RECOMPUTE_CACHE_FACTOR = 1.0
"""What a stage that recomputes caches beyond ALLOCATOR_CACHE_FACTOR's share, as a multiple of one re-run
layer's activations (what its recompute policy dropped, planner.estimate.phases). Measured on the same H200
(four plans): 5 selectively recomputed layers of a 3B Llama added 1.15 GiB beside a 1.16 GiB re-run layer
(0.99 x, 2026-11-30 at e51c587; 1.0 GiB, 0.86 x, the run before it: the same plan's cache moves that much
between runs); full recompute of every layer of the 1.5B added 1.4 GiB beside 3.80 GiB (0.38 x); llama3-8b
0.54 GiB beside 1.27 (0.43 x); a selective and an op-level layer at 32k tokens nothing beside 2.89 GiB. The
envelope, rounded up (`python -m benchmarks.allocator_cache`): one term per re-run layer does not describe all
four -- it covers them, and over-predicts the cache of the 32k plan by 2.7 GiB (31%) and of llama3-8b by 0.7 GiB
(45%). A model defect, stated in results/allocator_cache.json and kept to the plans that recompute."""


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
    stack: str = "pytorch"
    """The software stack whose kernel constants these are (costmodel.hardware.stacks): which attention kernel runs,
    whether TP collectives can overlap GEMMs."""
    generation: str = ""
    """GPU generation ("volta", "ampere", "hopper"; "" for a CPU or an unknown device): which kernels the
    stack dispatches (costmodel.price.kernels.sdpa_kernel)."""
    matmul_efficiency: float = 0.75
    """Fraction of peak that large GEMMs reach (costmodel.price.kernels: e_max)."""
    gemm_half_mn: float = 0.0
    """Output elements M N at which a GEMM's rate halves (costmodel.price.kernels: s(M N, h_mn)); 0: no curve."""
    gemm_split_k: float = 0.0
    """Inner-dimension slice of a split-K GEMM: a product with a deep K counts M N max(1, K / k_split)
    units of parallel work (costmodel.price.kernels); 0: no split."""
    gemm_unaligned_read_efficiency: float = 1.0
    """Fraction of its rate a Linear's GEMM product keeps when it reads rows that are no multiple of 16 bytes
    (cuBLAS runs other kernels: costmodel.price.kernels, Alignment); 1: not measured, priced as aligned."""
    gemm_unaligned_write_efficiency: float = 1.0
    """The same for a product that writes such rows (the forward of an LM head at vocabulary 50,257)."""
    gemm_half_dim: float = 0.0
    """Older per-dimension form s(M, x) s(N, x) s(K, x) (resource lists written before 2026-11-26); 0: none."""
    attention_efficiency: float = 0.0
    """Fraction of peak the stack's fused attention kernel reaches in its forward on long sequences
    (costmodel.price.kernels: e_fwd, on the work it does); 0: matmul_efficiency."""
    attention_bwd_efficiency: float = 0.0
    """The same for its backward (e_bwd); 0: attention_efficiency."""
    attention_half_seq: float = 0.0
    """Query length at which fused attention runs at half its efficiency (s(seq, h_seq)); 0: no curve."""
    attention_half_dim: float = 0.0
    """Head width at which fused attention runs at half its efficiency (s(d, h_d)); 0: no curve."""
    attention_causal_block: float = 0.0
    """Rows per block of a kernel that skips the blocks above a causal mask's diagonal (work share
    1/2 + B / 2s); 0: the whole s x s square is computed."""
    other_attention: dict | None = None
    """Curves of attention kernels other than the stack's own, by kernel name ("cudnn", "flash2",
    "efficient"), each {efficiency, bwd_efficiency, half_seq, half_dim, causal_block}: where torch
    dispatches another kernel for a dtype or head width (costmodel.price.kernels.sdpa_kernel)."""
    step_efficiency: float = 1.0
    """Fraction of their isolated rate (a large copy's, costmodel.hardware.kernel_fit) that memory-bound operators
    (elementwise, norms, casts, the loss) reach inside a training step; GEMMs and fused attention run at
    the rate timed alone (costmodel.price.kernels.node_time). Eager PyTorch's elementwise kernels move their
    bytes in several passes and strided views, far from a copy's rate; torch.compile fuses them
    (costmodel.price.fusion). Fitted to whole steps (benchmarks.fit): on the H200 (kernel-timed) its one-GPU
    steps tell the classes apart -- compiled layers (fewer memory-bound bytes) and a 32K-token step
    (attention half the time) against eager 4K-token steps; for a stack of published runs whose
    memory-bound operators run eager (costmodel.hardware.stacks `eager_elementwise`), the models' widths do. 1 for
    stacks that fuse them (apex, Transformer Engine)."""
    mem_efficiency: float = 1.0
    """Fraction of mem_bandwidth memory-bound kernels achieve."""
    intra_link_efficiency: float = 1.0
    """Fraction of intra_node_bw a collective achieves (nccl-tests bus bandwidth / link peak)."""
    inter_link_efficiency: float = 1.0
    """Fraction of inter_node_bw a collective achieves across nodes."""
    overlap_slowdown: float = 0.0
    """Compute slows by this fraction of the time a collective runs beside it (costmodel.price.streams): NCCL
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
    allocator_headroom: float | None = None
    """What a plan leaves free for the caching allocator: blocks it has cached but not handed out
    (fragmentation, rounding to its block sizes). None (the GPU presets): the cache each stage of the plan
    is predicted to hold, ALLOCATOR_CACHE_FACTOR x its largest transient (allocator_cache_bytes); a fraction
    in [0, 1): that flat share of the memory after `reserved_bytes` instead (`partita plan --memory-headroom`,
    a resource list's `allocator_headroom`; the cpu preset's DEFAULT_ALLOCATOR_HEADROOM)."""
    op_latency: float = 5e-6
    """Seconds every operator costs beyond its FLOPs and bytes: a CUDA kernel launch (~5 us), or PyTorch's
    eager dispatch on CPU (tens of us, measured by `partita calibrate`). Dominates small models."""
    host_memory_bytes: float = 0.0
    """Host DRAM this device may fill with offloaded activations and states (its share of the node's);
    0 where the device's memory already is host memory (a CPU), which rules offload out."""
    sync_latency: float = 0.0
    """Seconds each message step of a collective (each of a ring all-reduce's 2 (n-1) steps, a
    point-to-point transfer) costs inside a training step on top of the back-to-back latency alpha
    (costmodel.price.comm uses alpha + sync_latency): the ranks arrive from computing, so the peer's
    communication thread must be woken -- with more ranks than cores, scheduled -- before the message
    moves. `partita calibrate` measures it on CPU from what one small collective adds to a loop of
    compute bursts on all ranks (calibrate_links.measure_in_step, calibrate_fit.sync_latency). 0 for the GPU
    presets: NCCL kernels queue on the stream behind the compute that precedes them."""
    sharded_op_latency: float = 0.0
    """Seconds an operator on DTensors costs beyond `op_latency`: DTensor's Python dispatch (sharding
    propagation lookup, unwrapping and wrapping local tensors), paid per operator the planner counts
    (planner.enumerate.strategies: forward and backward launches of every node run on DTensors, and the optimizer's
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
    charged once per forward or backward collective of a tensor-parallel block (planner.enumerate.strategies).
    Measured by `partita calibrate` (calibrate_dtensor.measure_dtensor); 0 for the GPU presets."""

    def usable_memory(self, flat: bool = False) -> float:
        """Bytes a plan's peak may reach before the allocator's cache of its transients
        (allocator_cache_bytes, which the dense planner takes off per stage): the memory less the reserve
        (CUDA context, NCCL), less a flat headroom where one is set. `flat`: for paths that price no
        transients, a device without one keeps DEFAULT_ALLOCATOR_HEADROOM instead."""
        return (self.memory_bytes - self.reserved_bytes) - self.headroom_bytes(flat)

    def headroom_bytes(self, flat: bool = False) -> float:
        """The flat allocator headroom in bytes (`allocator_headroom` of the memory after the reserve); 0
        where the headroom is the predicted cache, unless `flat` (usable_memory)."""
        share = self.allocator_headroom
        if share is None:
            share = DEFAULT_ALLOCATOR_HEADROOM if flat else 0.0
        return (self.memory_bytes - self.reserved_bytes) * share

    def allocator_cache_bytes(self, transient, rebuilt=0.0):
        """The caching allocator's predicted cache beside a stage whose largest transient is `transient`
        bytes and whose largest re-run layer (when it recomputes) `rebuilt` bytes (ALLOCATOR_CACHE_FACTOR,
        RECOMPUTE_CACHE_FACTOR). A plan leaves it free where `charges_allocator_cache`; a flat headroom
        stands in for it otherwise."""
        return ALLOCATOR_CACHE_FACTOR * transient + RECOMPUTE_CACHE_FACTOR * rebuilt

    @property
    def allocator_cache_factors(self) -> tuple[float, float]:
        """(ALLOCATOR_CACHE_FACTOR, RECOMPUTE_CACHE_FACTOR) as `allocator_cache_bytes` reads them now (a plan records
        them: benchmarks.allocator_cache re-plans a measured case under those of its time)."""
        return ALLOCATOR_CACHE_FACTOR, RECOMPUTE_CACHE_FACTOR

    @property
    def charges_allocator_cache(self) -> bool:
        """True where the headroom a plan leaves is the allocator's predicted cache (no flat headroom set)."""
        return self.allocator_headroom is None

    def peak(self, dtype: str) -> float:
        return self.peak_flops["bf16" if dtype in ("bf16", "fp16") else "fp32"]


# How links run on each GPU generation (cited, not fitted: the published runs hardly test them):
# - link efficiencies: nccl-tests bus bandwidth against the per-direction peak (NVLink ~75-80%,
#   InfiniBand/RoCE ~80-90% at training scale);
# - overlap_slowdown: compute stretch while NCCL kernels run beside it (T3, Pati et al. ASPLOS'24:
#   concurrent GEMMs and collectives slow each other by tens of percent).
GPU_OVERLAP_SLOWDOWN = 0.15
"""Device.overlap_slowdown of every GPU preset, and what `partita calibrate` keeps on a GPU (not measured)."""
_GPU_LINKS = dict(intra_link_efficiency=0.8, inter_link_efficiency=0.85, overlap_slowdown=GPU_OVERLAP_SLOWDOWN)

# How kernels run: one set of constants per GPU generation and software stack (costmodel.hardware.stacks), for every
# model and configuration, written by the fitting program (`python -m benchmarks.fit`) into
# fitted_constants.json beside this file, each group with the measurements it was fitted to (or the rule
# it was derived by, where no measurement exists). Nothing here is set by hand.
UNALIGNED_FIELDS = ("gemm_unaligned_read_efficiency", "gemm_unaligned_write_efficiency")
"""The Device fields of an unaligned GEMM's rate (costmodel.price.kernels, Alignment): reading, writing; 1 each where
nothing measured them."""
KERNEL_FIELDS = ("matmul_efficiency", "gemm_half_mn", "gemm_split_k", *UNALIGNED_FIELDS, "gemm_half_dim", "attention_efficiency",
                 "attention_bwd_efficiency", "attention_half_seq", "attention_half_dim", "attention_causal_block",
                 "mem_efficiency", "other_attention", "op_latency", "step_efficiency")
FITTED_CONSTANTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fitted_constants.json")
"""Where the fitting program writes them in a checkout; an installed partita reads the copy its wheel ships
(package data of partita.costmodel) through importlib.resources."""


def fitted_constants() -> dict:
    """The fitting program's output: {"groups": {"hopper/pytorch": {"constants": {...}, "source": ...}}, ...}."""
    global _FITTED
    if _FITTED is None:
        import json
        from importlib.resources import files
        _FITTED = json.loads(files("partita.costmodel.hardware").joinpath("fitted_constants.json").read_text(encoding="utf-8"))
    return _FITTED


_FITTED = None


def kernel_constants(generation: str, stack: str) -> dict:
    """The Device kernel fields of `generation` under `stack` (fitted_constants.json; a stack that shares another's
    constants, `Stack.constants`, reads that one's group)."""
    family = get_stack(stack).constants_family  # an unknown stack is one line naming the known ones
    groups = fitted_constants()["groups"]
    key = f"{generation}/{family}"
    if key not in groups:
        raise PartitaError(f"no kernel constants for {key} in {FITTED_CONSTANTS}; run `python -m benchmarks.fit`")
    return {k: v for k, v in groups[key]["constants"].items() if k in KERNEL_FIELDS}


# REFERENCE.md "Hardware": NVLink per direction (150 / 300 / 450 GB/s). Memory as the driver reports it
# (nvidia-smi's total, MiB): the "80GB" of A100-80GB is 80 GiB (81920 MiB), H100-80GB 81559 MiB,
# H200 143771 MiB, A100-40GB 40960 MiB, V100 16160 / 32510 MiB. Host link per GPU (offload copies): the
# DGX/HGX boards pair two GPUs (and their NICs) behind one PCIe switch with one x16 uplink to the CPU,
# so when every GPU offloads each gets half of it: PCIe 3.0 (DGX-1) ~16 GB/s -> 8, PCIe 4.0 (A100)
# ~25 GB/s -> 12.5, PCIe 5.0 (H100/H200) ~50 GB/s -> 25. Off-node bandwidth per GPU:
# Selene has 8 HDR HCAs (200 Gb/s = 25 GB/s) per 8-GPU node; Llama 3's H100 cluster 400 Gb/s (50 GB/s)
# per GPU. Host memory per GPU: the DGX node's DRAM over its 8 GPUs (DGX-1 V100 512 GB, DGX A100 1 TB,
# DGX H100/H200 2 TB).
#          name: (generation, bf16 TFLOP/s, fp32 TFLOP/s, memory MiB, HBM GB/s, NVLink GB/s, NIC GB/s per GPU,
#                 host GB per GPU, host link GB/s per GPU)
GPUS = {
    "V100-16GB": ("volta", 125, 15.7, 16160, 900, 150, 12.5, 64, 8),
    "V100-32GB": ("volta", 125, 15.7, 32510, 900, 150, 12.5, 64, 8),
    "A100-40GB": ("ampere", 312, 19.5, 40960, 1555, 300, 25, 128, 12.5),
    "A100-80GB": ("ampere", 312, 19.5, 81920, 2039, 300, 25, 128, 12.5),
    "H100-80GB": ("hopper", 989, 67, 81559, 3350, 450, 50, 256, 25),
    "H200-141GB": ("hopper", 989, 67, 143771, 4800, 450, 50, 256, 25),
}


def gpu_device(name: str, stack: str = "pytorch", kernels: dict | None = None) -> Device:
    """The preset GPU `name` with the kernel constants of its generation under `stack` (or `kernels`,
    Device kernel fields given whole, as the fitting program tries them)."""
    if name not in GPUS:
        raise PartitaError(f"unknown GPU {name!r}; presets: {', '.join(GPUS)}")
    gen, bf16, fp32, mem_mib, hbm, nvlink, nic, host_gb, host_link = GPUS[name]
    return Device(name=name, peak_flops={"bf16": bf16 * 1e12, "fp32": fp32 * 1e12}, memory_bytes=mem_mib * 2**20,
                  mem_bandwidth=hbm * GB, intra_node_bw=nvlink * GB, inter_node_bw=nic * GB,
                  host_memory_bytes=host_gb * GB, host_bw=host_link * GB, stack=stack, generation=gen,
                  **_GPU_LINKS, **(kernel_constants(gen, stack) if kernels is None else kernels))


DEVICES: dict[str, Device] = {d.name: d for d in [
    *(gpu_device(name) for name in GPUS),
    # One CPU process of a small host, gloo over loopback. Rough defaults measured on the 2-core
    # development machine (TORCH-NOTES.md: 64 MB all_reduce ~72 ms on 2 ranks); `partita calibrate`
    # measures the real figures.
    Device(name="cpu", peak_flops={"bf16": 50e9, "fp32": 100e9}, memory_bytes=4 * GiB, mem_bandwidth=10 * GB,
           intra_node_bw=1 * GB, inter_node_bw=0.1 * GB, matmul_efficiency=0.5, intra_node_latency=5e-4,
           inter_node_latency=1e-3, host_bw=10 * GB, reserved_bytes=0.25 * GiB, op_latency=2e-5,
           allocator_headroom=DEFAULT_ALLOCATOR_HEADROOM,  # no caching allocator to model on a CPU
           # gloo's threads run on the cores that compute: what a collective overlaps, compute loses
           overlap_slowdown=1.0),
]}

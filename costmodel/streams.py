"""How overlap is priced: a layer's compute stream beside its communication streams.

The first cost model charged a layer max(compute, ZeRO traffic, offload traffic) + TP: every byte of
ZeRO and offload traffic hid behind the whole layer's compute, forward and backward pooled, at no cost
to the compute. Real overlap is narrower. For one layer and one micro-batch on one rank:

    forward window   compute  C_f  beside  NCCL lane: the next layer's prefetched all-gather G_f
                                           host lane: activation copies out O_out (+ NIC traffic N_f)
    backward window  compute  C_b  beside  NCCL lane: the previous layer's all-gather G_b and this
                                           layer's gradient reduce-scatter R (one network: they add)
                                           host lane: activation copies back O_in (+ NIC traffic N_b)

FSDP prefetches one layer ahead (FSDP2's default), so a layer's gather hides behind one layer's compute
in the same direction -- never behind the backward of another micro-batch. Activation offload copies go
out only during the forward and come back only during the backward (save_on_cpu). Where the NIC reaches
the GPU through the same PCIe switch as host copies (GPUDirect RDMA), its bytes share the host link:
the host lane carries O + N, with N = bytes the collective sends off-node / host-link bandwidth.

In each window, with busy = max(NCCL lane, host lane) and the device's `overlap_slowdown` kappa
(NCCL kernels take SMs and HBM bandwidth from the GEMMs they overlap, so compute stretches while a
collective runs beside it):

    window  = max(C, busy) + kappa min(C, busy)
    exposed = max(0, busy - C)                      (communication no compute covers)
    contention = kappa min(C, busy)                 (the time both streams run at once, slowed)
    hidden  = NCCL lane + host lane - exposed       (communication that cost no time but contention)

kappa = 0 is perfect overlap, max(C, busy); kappa = 1 is none, C + busy (a CPU, whose collectives run on
the cores that compute: the `cpu` preset and `partita calibrate` on a CPU).

and the layer costs  T = window_f + window_b + TP + CP + EP, where tensor-parallel collectives
(Megatron's all-reduces, sequence parallelism's gathers and scatters), context parallelism's K/V gathers
and expert parallelism's all-to-alls (planner.cp_ep) sit on the critical path: the next operator needs
their result.

Per stage and micro-batch, what no window covers (`edge_exposed`): the first layer's forward gather and
the first backward gather (nothing runs before them) and the last reduce-scatter (nothing runs after
it) -- one layer's G_f + G_b + R.

Data-parallel gradient all-reduce (DDP, ZeRO-0/1): buckets are reduced while the backward of the last
micro-batch continues, so per layer only what exceeds that layer's backward compute is exposed
(`bucketed_all_reduce`), plus the last bucket, which has nothing after it. Without bucketing (a
pipeline's flush, Megatron-LM 2021) the whole all-reduce is exposed.

The planner (planner.options) calls `layer_timing` per layer variant and uses `total` as that
variant's time: the mixed-integer program stays linear, this model only produces its coefficients.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class LayerStreams:
    """One layer's work for one micro-batch on one rank, in seconds per stream (module docstring)."""

    compute_fwd: float
    compute_bwd: float
    """Backward compute, a recompute re-run included."""
    tp: float = 0.0
    cp: float = 0.0
    """Context parallelism's K/V all-gathers and reduce-scatters (planner.cp_ep): critical path, like tp."""
    ep: float = 0.0
    """Expert parallelism's all-to-all dispatch and combine (planner.cp_ep): critical path, like tp."""
    gather_fwd: float = 0.0
    gather_bwd: float = 0.0
    scatter_bwd: float = 0.0
    offload_out: float = 0.0
    offload_in: float = 0.0
    nic_fwd: float = 0.0
    """Host-link seconds of the forward's off-node NCCL bytes (GPUDirect through the same PCIe switch)."""
    nic_bwd: float = 0.0


@dataclass(frozen=True)
class Window:
    seconds: float
    exposed: float
    contention: float
    hidden: float
    binding: str
    """"compute", "zero" (the NCCL lane) or "offload" (the host lane)."""


@dataclass(frozen=True)
class LayerTiming:
    total: float
    forward: Window
    backward: Window
    tp: float
    exposed: dict = field(default_factory=dict)
    """Exposed seconds by kind: "tp", "cp", "ep", "zero", "offload"."""
    lanes: LayerStreams | None = None
    """The work it was priced from."""

    @property
    def hidden(self) -> float:
        return self.forward.hidden + self.backward.hidden

    @property
    def contention(self) -> float:
        return self.forward.contention + self.backward.contention


def window(compute: float, nccl: float, host: float, slowdown: float) -> Window:
    """One direction's window: compute beside an NCCL lane and a host-link lane (module docstring)."""
    busy = max(nccl, host)
    contention = slowdown * min(compute, busy)
    seconds = max(compute, busy) + contention
    exposed = max(0.0, busy - compute)
    binding = "compute" if exposed <= 0 else ("zero" if nccl >= host else "offload")
    return Window(seconds, exposed, contention, max(0.0, nccl + host - exposed), binding)


def layer_timing(s: LayerStreams, slowdown: float) -> LayerTiming:
    """The layer's seconds per micro-batch and where they go (module docstring)."""
    f = window(s.compute_fwd, s.gather_fwd, s.offload_out + s.nic_fwd, slowdown)
    b = window(s.compute_bwd, s.gather_bwd + s.scatter_bwd, s.offload_in + s.nic_bwd, slowdown)
    exposed = {"tp": s.tp, "cp": s.cp, "ep": s.ep, "zero": 0.0, "offload": 0.0}
    for w in (f, b):
        if w.binding != "compute":
            exposed[w.binding] += w.exposed
    return LayerTiming(total=f.seconds + b.seconds + s.tp + s.cp + s.ep, forward=f, backward=b, tp=s.tp,
                       exposed=exposed, lanes=s)


def edge_exposed(s: LayerStreams) -> float:
    """Seconds per stage and micro-batch no window covers, for a stage of layers like `s`: the first
    layer's gathers and the last reduce-scatter."""
    return s.gather_fwd + s.gather_bwd + s.scatter_bwd


def bucketed_all_reduce(all_reduce: float, compute_bwd: float, slowdown: float) -> tuple[float, float]:
    """(exposed, contention) seconds of one layer's gradient all-reduce overlapped with its backward
    compute (DDP's buckets, module docstring): what the compute does not cover, and the compute's
    stretch while the all-reduce runs beside it."""
    contention = slowdown * min(compute_bwd, all_reduce)
    return max(0.0, all_reduce - compute_bwd), contention

"""How overlap is priced: a layer's compute stream beside its communication streams.

The first cost model charged a layer max(compute, ZeRO traffic, offload traffic) + TP: every byte of
ZeRO and offload traffic hid behind the whole layer's compute, forward and backward pooled, at no cost
to the compute. Real overlap is narrower. For one layer and one micro-batch on one rank:

    forward window   compute  C_f  beside  NCCL lane: the next layer's prefetched all-gather G_f
                                           host lane: offloaded states' copies up O_out (+ NIC traffic N_f)
    backward window  compute  C_b  beside  NCCL lane: the previous layer's all-gather G_b and this
                                           layer's gradient reduce-scatter R (one network: they add)
                                           host lane: offloaded states' copies O_in (+ NIC traffic N_b)

FSDP prefetches one layer ahead (FSDP2's default), so a layer's gather hides behind one layer's compute
in the same direction -- never behind the backward of another micro-batch; FSDP2's CPU offload copies a
unit's parameters up and its gradients down on its own streams (non_blocking), so they take the host lane.
Where the NIC reaches the GPU through the same PCIe switch as host copies (GPUDirect RDMA), its bytes share
the host link: the host lane carries O + N, with N = bytes the collective sends off-node / host-link
bandwidth.

Offloaded *activations* take no lane: they are copied on the compute stream (`offload_serial`, on the
critical path). runtime.parallel.offload runs torch.autograd.graph.save_on_cpu, whose pack is `packed.copy_(tensor,
non_blocking=True)` and whose unpack is `tensor.to(device, non_blocking=True)` on the current stream, and
HostStash's storage copies likewise: a stream runs in order, so the next kernel waits for each copy. (The
first cost model put them in the host lane, hidden behind the compute, which this runtime never does.)

In each window, with busy = max(NCCL lane, host lane) and the device's `overlap_slowdown` kappa
(NCCL kernels take SMs and HBM bandwidth from the GEMMs they overlap, so compute stretches while a
collective runs beside it):

    window  = max(C, busy) + kappa min(C, busy)
    exposed = max(0, busy - C)                      (communication no compute covers)
    contention = kappa min(C, busy)                 (the time both streams run at once, slowed)
    hidden  = NCCL lane + host lane - exposed       (communication that cost no time but contention)

kappa = 0 is perfect overlap, max(C, busy); kappa = 1 is none, C + busy (a CPU, whose collectives run on
the cores that compute: the `cpu` preset and `partita calibrate` on a CPU).

and the layer costs  T = window_f + window_b + TP + CP + EP + offload_serial, where tensor-parallel collectives
(Megatron's all-reduces, sequence parallelism's gathers and scatters), context parallelism's K/V gathers
and expert parallelism's all-to-alls (planner.enumerate.cp_ep) sit on the critical path: the next operator needs
their result.

Unless the plan overlaps the TP collectives with the GEMMs they feed (`tp_overlap`; a plan choice,
planner.enumerate.space.overlap_choices): Megatron-Core's --tp-comm-overlap (Transformer Engine's userbuffers) and
PyTorch's async TP (torch.compile with `_micro_pipeline_tp` and symmetric memory) split the all-gather
before a column-parallel GEMM and the reduce-scatter after a row-parallel one into k chunks and pipeline
them with the GEMM's own chunks -- the decomposition of Wang et al., "Overlap communication with
dependent computation via decomposition in large deep learning models", ASPLOS'23; in the backward the
data-gradient reduce-scatter runs beside the weight-gradient GEMM and the input gather beside the
data-gradient GEMM (TE's "bulk" overlaps). Sources: NeMo's "Communication Overlap" guide (pipelined TP
overlap replaces the all-gather by P2P ring exchanges and the reduce-scatter by ring exchanges of GEMM
outputs, or chunks of reduce-scatter "which exposes one reduce-scatter chunk"), Transformer Engine's
comm_gemm_overlap (SPLIT_PIPELINED_AG_P2P, SPLIT_PIPELINED_RS, BULK_OVERLAP_AG/RS), and PyTorch's
"[Distributed w/ TorchTitan] Introducing Async Tensor Parallelism in PyTorch" (discuss.pytorch.org,
2024). Both use k = t chunks, a ring of the t ranks (userbuffers' ring exchange, the default for
all-gathers; torch's micro-pipeline loops over the group's ranks). For one direction of a layer, with C
the seconds of its TP collectives and G of its tensor-parallel GEMMs:

    exposed    = C / k + max(0, C (1 - 1/k) - G)    (one chunk of each collective precedes its first GEMM
                                                     chunk, or follows the last: nothing covers it)
    contention = kappa min(C (1 - 1/k), G)          (the GEMMs slow while the other chunks run beside them)
    hidden     = C - exposed

so  TP = sum over the two directions of (exposed + contention)  replaces TP in T. A full recompute's
re-run forward repeats its collectives beside its GEMMs in the backward direction. Which collectives are
decomposed is the stack's (costmodel.hardware.stacks, Stack.tp_overlap_backward): Transformer Engine overlaps
the backward's too; torch's async TP fuses forward patterns only -- the forward and a full recompute's
re-run -- and the backward's own collectives stay whole on the critical path (`tp_serial`). PyTorch's
announcement measured what that leaves: forward passes up to 20-29% faster, about 8% end to end.

Per stage and micro-batch, what no window covers (`edge_exposed`): the first layer's forward gather and
the first backward gather (nothing runs before them) and the last reduce-scatter (nothing runs after
it) -- one layer's G_f + G_b + R.

Pipeline sends (planner.enumerate.candidates) are on the critical path of their stage -- torch.distributed.pipelining
waits for each step's sends and receives before the next compute -- unless the plan overlaps them
(`overlapped_sends`; Megatron-Core's --overlap-p2p-communication with interleaved 1F1B, which posts a
chunk's send and the next receive and computes another chunk meanwhile). In the steady 1F1B phase, per
micro-batch and chunk, each direction's transfer P runs beside one direction's compute W of another
chunk, a window as above: exposed max(0, P - W), contention kappa min(P, W). W is taken as one layer's
compute (the least a chunk holds), so the exposure is an upper bound. The sends of the pipeline's fill and
flush stay exposed (NeMo's communication-overlap guide: "The PP communications in pipeline fill and flush
are still exposed"): planner.enumerate.candidates charges the p - 1 of each once per step at their full cost.

Data-parallel gradient all-reduce (DDP, ZeRO-0/1): buckets are reduced while the backward of the last
micro-batch continues, so per layer only what exceeds that layer's backward compute is exposed
(`bucketed_all_reduce`), plus the last bucket, which has nothing after it. Without bucketing (a
pipeline's flush, Megatron-LM 2021) the whole all-reduce is exposed.

The planner (planner.enumerate.options) calls `layer_timing` per layer variant and uses `total` as that
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
    """Seconds of the tensor-parallel collectives, forward and backward."""
    tp_fwd: float = 0.0
    """Of `tp`, the forward's (with tp_chunks: what overlaps the forward GEMMs)."""
    tp_chunks: int = 0
    """0: the TP collectives are on the critical path; k > 1: each is split into k chunks overlapped with
    the tensor-parallel GEMMs (`tp_overlap`)."""
    tp_serial: float = 0.0
    """Of the backward direction's `tp - tp_fwd`, what stays on the critical path even with tp_chunks: the
    backward's own collectives where the stack decomposes only forward patterns (Stack.tp_overlap_backward
    False: torch's async TP); a full recompute's re-run forward still overlaps."""
    gemm_fwd: float = 0.0
    """Seconds of the tensor-parallel GEMMs the forward's TP collectives feed or follow (with tp_chunks)."""
    gemm_bwd: float = 0.0
    """Seconds of the GEMMs the backward direction's overlapped TP collectives (`tp - tp_fwd - tp_serial`) run
    beside."""
    cp: float = 0.0
    """Context parallelism's K/V all-gathers and reduce-scatters (planner.enumerate.cp_ep): critical path, like tp."""
    ep: float = 0.0
    """Expert parallelism's all-to-all dispatch and combine (planner.enumerate.cp_ep): critical path, like tp."""
    gather_fwd: float = 0.0
    gather_bwd: float = 0.0
    scatter_bwd: float = 0.0
    offload_out: float = 0.0
    """Host-link seconds of offloaded states going up in the forward (FSDP2's CPU offload, its own streams)."""
    offload_in: float = 0.0
    offload_serial: float = 0.0
    """Seconds of offloaded activations' copies out and back, on the compute stream (module docstring)."""
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
class Overlap:
    """Communication overlapped with the compute that depends on it (`tp_overlap`), in seconds."""

    exposed: float
    contention: float
    hidden: float


NO_OVERLAP = Overlap(0.0, 0.0, 0.0)


@dataclass(frozen=True)
class LayerTiming:
    total: float
    forward: Window
    backward: Window
    tp: float
    """Exposed tensor-parallel seconds (all of them, unless overlapped)."""
    exposed: dict = field(default_factory=dict)
    """Exposed seconds by kind: "tp", "cp", "ep", "zero", "offload"."""
    lanes: LayerStreams | None = None
    """The work it was priced from."""
    tp_overlap: Overlap = NO_OVERLAP
    """The overlapped TP collectives, both directions (`tp_overlap`)."""

    @property
    def hidden(self) -> float:
        return self.forward.hidden + self.backward.hidden + self.tp_overlap.hidden

    @property
    def contention(self) -> float:
        return self.forward.contention + self.backward.contention + self.tp_overlap.contention


def window(compute: float, nccl: float, host: float, slowdown: float) -> Window:
    """One direction's window: compute beside an NCCL lane and a host-link lane (module docstring)."""
    busy = max(nccl, host)
    contention = slowdown * min(compute, busy)
    seconds = max(compute, busy) + contention
    exposed = max(0.0, busy - compute)
    binding = "compute" if exposed <= 0 else ("zero" if nccl >= host else "offload")
    return Window(seconds, exposed, contention, max(0.0, nccl + host - exposed), binding)


def tp_overlap(comm: float, gemm: float, chunks: int, slowdown: float) -> Overlap:
    """One direction's TP collectives (`comm` seconds) split into `chunks` and pipelined with the GEMMs
    they feed (`gemm` seconds): one chunk exposed, the rest hidden as far as the GEMMs last, the GEMMs
    slowed by `slowdown` while they overlap (module docstring; Wang et al. ASPLOS'23)."""
    if comm <= 0:
        return NO_OVERLAP
    rest = comm * (1 - 1 / chunks)
    exposed = comm / chunks + max(0.0, rest - gemm)
    return Overlap(exposed, slowdown * min(rest, gemm), comm - exposed)


def _tp(s: LayerStreams, slowdown: float) -> Overlap:
    """The layer's TP collectives: on the critical path, or overlapped in each direction (tp_chunks)."""
    if s.tp_chunks <= 1:
        return Overlap(s.tp, 0.0, 0.0)
    f = tp_overlap(s.tp_fwd, s.gemm_fwd, s.tp_chunks, slowdown)
    b = tp_overlap(s.tp - s.tp_fwd - s.tp_serial, s.gemm_bwd, s.tp_chunks, slowdown)
    return Overlap(f.exposed + b.exposed + s.tp_serial, f.contention + b.contention, f.hidden + b.hidden)


def layer_timing(s: LayerStreams, slowdown: float) -> LayerTiming:
    """The layer's seconds per micro-batch and where they go (module docstring)."""
    f = window(s.compute_fwd, s.gather_fwd, s.offload_out + s.nic_fwd, slowdown)
    b = window(s.compute_bwd, s.gather_bwd + s.scatter_bwd, s.offload_in + s.nic_bwd, slowdown)
    tp = _tp(s, slowdown)
    exposed = {"tp": tp.exposed, "cp": s.cp, "ep": s.ep, "zero": 0.0, "offload": 0.0}
    for w in (f, b):
        if w.binding != "compute":
            exposed[w.binding] += w.exposed
    exposed["offload"] += s.offload_serial
    total = f.seconds + b.seconds + tp.exposed + tp.contention + s.cp + s.ep + s.offload_serial
    return LayerTiming(total=total, forward=f, backward=b, tp=tp.exposed, exposed=exposed, lanes=s,
                       tp_overlap=tp if s.tp_chunks > 1 else NO_OVERLAP)


def overlapped_sends(send: float, compute_fwd: float, compute_bwd: float, slowdown: float) -> Overlap:
    """A pipeline chunk's forward send and backward send (`send` seconds each) beside one direction's
    compute of another chunk (module docstring)."""
    f = window(compute_fwd, send, 0.0, slowdown)
    b = window(compute_bwd, send, 0.0, slowdown)
    return Overlap(f.exposed + b.exposed, f.contention + b.contention, f.hidden + b.hidden)


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

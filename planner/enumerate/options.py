"""Layer variants: a sharding option x a recompute policy x activation offload x optimizer offload,
costed per rank for one candidate (tp, dp, ZeRO stage, micro-batch b).

Per micro-batch time (seconds), the stream model of costmodel.price.streams:
    compute  = forward C_f and backward C_b (+ a recompute re-run), each b * per-sample seconds + the
               per-micro-batch GEMM and launch seconds (costmodel.price.kernels, Device.op_latency)
    T        = window_f + window_b + tensor-parallel collectives (on the critical path, as in Megatron-LM;
               or, under `tp_overlap`, pipelined with the layer's tensor-parallel GEMMs: costmodel.price.streams)
where each window runs its compute beside the ZeRO all-gathers / reduce-scatters of that direction and
the host-link copies of that direction, exposes what compute does not cover, and stretches compute
while they overlap (Device.overlap_slowdown).
ZeRO traffic per micro-batch over the data-parallel group (FSDP2 semantics, what the runtime runs):
    stage 2 (reshard after forward off): all-gather parameters before the forward + reduce-scatter
    stage 3 (FSDP):                      all-gather before the forward and again before the backward
                                         + reduce-scatter
In a pipeline (`pipelined`: pp > 1) the stage is an FSDP2 module driven by torch.distributed.pipelining,
which turns gradient sync and resharding after backward off for every micro-batch but the last
(PipelineStage.backward_maybe_with_nosync, perform_reduce_grad): gradients accumulate unsharded, in
FSDP2's reduce dtype (fp32), and are reduce-scattered once per step after the stage's last backward;
parameters a backward gathered stay gathered, so in steady 1F1B a forward (which follows a backward)
finds them gathered. Per micro-batch that leaves stage 3 one all-gather (before the backward; stage 2
none); once per step, in the flush D, the first forward's all-gather (its window: what that
forward's compute does not cover, and the contention) and the whole reduce-scatter (exposed: on the
first stage nothing runs after it). Memory: the stage's parameters gathered, p n, and its fp32
gradient accumulators, 4 n (absent until the first backward), + (o + c) n / d -- stage 3 saves no memory
over stage 2 here, and costs a gather per micro-batch more. (ZeRO-3's forward gathers during the
1F1B warm-up, up to pp - s of them, are not charged.)
Every micro-batch of such a stage adds its gradients into the fp32 accumulators, a memory-bound kernel
per parameter tensor on the compute stream (FSDPParam.accumulate_unsharded_grad_if_needed): it reads
the new gradient (p bytes) and reads and writes the accumulator (2 x 4) -- n (p + 8) bytes at the
achievable HBM bandwidth. Not charged: autograd's in-place accumulation of ZeRO-0/1 gradients over
micro-batches (Megatron-LM fuses it into the weight-gradient GEMM, gradient_accumulation_fusion, and
its published rows are priced so; partita's runtime does not fuse it).
Activation offload (save_on_cpu): the kept activations go to host during the forward (A / host link
bandwidth) and come back during the backward; the NIC's off-node bytes share that link.

Model-state bytes per rank (n parameters on this rank after tensor parallelism; ZeRO, Rajbhandari et al.
SC'20, with p, g, o bytes per parameter of parameters, gradients, optimizer state; d = dp degree):
    stage 0:  (p + g + o) n        stage 1:  (p + g) n + o n / d  (+ o E: `zero1_excess`)
    stage 2:  p n + (g + o + c) n / d  stage 3:  (p + g + o) n / d
(c: the sharded parameter beside the gathered one, in fp32 only: costmodel.price.memory's shard_copy)
In a ZeRO-3 candidate each layer may instead keep its parameters gathered from forward to backward
(stage 2 for that layer alone: p n (1 - 1/d) more bytes, one all-gather fewer per micro-batch), so the
program trades memory for exposed communication layer by layer.
State offload (FSDP2's CPUOffloadPolicy, so ZeRO-3 only) keeps the sharded parameters, gradients and
optimizer state in host memory: each micro-batch copies the parameter shard up and the gradient shard
down the host link (overlapped like the all-gathers), and the optimizer step runs on the CPU
(n / d * step traffic / HOST_MEMORY_BW). Offload is only offered on devices with their own memory
(`Device.host_memory_bytes > 0`; a `cpu` device's memory already is host memory).

After-flush time D (seconds): stages 0-1 all-reduce the gradients -- all of it after the flush, or (DDP,
`ddp_overlap`) in buckets during the last micro-batch's backward, exposed only where it outlasts the
layer's backward compute; stages 2-3 already reduced them per micro-batch (a pipeline: once per step,
above). Stage 1 then updates each rank's 1/d of the parameters and shares them, as its stack runs it
(`zero1_broadcast`): partita's runtime (torch's ZeroRedundancyOptimizer, runtime/parallel/zero1.py) broadcasts each
parameter tensor from the rank that stepped it after the step, exposed --
    S = (tensors) x broadcast(p n / tensors)   over the dp group (about an all-gather of the parameters:
                                               3 Psi moved per step against DDP's 2 Psi);
Megatron's distributed optimizer reduce-scatters the gradients and all-gathers the parameters instead of
the all-reduce, the same 2 Psi as the all-reduce priced above (Rajbhandari et al. SC'20, stage P_os), so
S = 0 there. Then the optimizer step over the rank's
optimizer shard, memory-bound: n_opt * step traffic / achievable memory bandwidth, plus
Device.sharded_param_latency per parameter tensor held as a DTensor.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from partita.costmodel.price import comm, streams
from partita.costmodel.hardware import Cluster
from partita.costmodel.hardware.stacks import get_stack
from partita.costmodel.price.memory import StateBytes
from partita.planner.enumerate.cp_ep import EP_IMBALANCE, cp_comm, ep_comm
from partita.planner.plan.executable import offload_refusal
from partita.planner.plan import RECOMPUTE
from partita.planner.enumerate.strategies import BlockOption

HOST_MEMORY_BW = 50e9
"""Host DRAM bytes/s available to one device's CPU optimizer step (a DDR4/5 server socket shared by its
GPUs); used only for optimizer offload."""


@dataclass
class Variant:
    base: BlockOption
    recompute: str = "none"
    offload_activations: bool = False
    offload_states: bool = False
    zero: int | None = None
    """The block's own ZeRO stage in a sharded candidate (2 beside a candidate's 3: FSDP2's
    reshard_after_forward=False for this block alone); None: the candidate's."""
    # costs, filled by cost_variant
    time: float = 0.0
    state: float = 0.0
    grad: float = 0.0              # of `state`, the gradient bytes (absent until the first backward)
    act: float = 0.0
    flush: float = 0.0
    compute: float = 0.0
    tp_comm: float = 0.0           # exposed tensor-parallel seconds (all of them unless overlapped: costmodel.price.streams)
    cp_comm: float = 0.0           # context parallelism's K/V gathers (planner.enumerate.cp_ep), on the critical path
    ep_comm: float = 0.0           # expert parallelism's all-to-alls (planner.enumerate.cp_ep), on the critical path
    zero_comm: float = 0.0
    offload_traffic: float = 0.0
    dp_comm: float = 0.0
    host_state: float = 0.0        # bytes of optimizer state offloaded to host memory
    host_act: float = 0.0          # bytes of activations offloaded per micro-batch
    timing: "streams.LayerTiming | None" = None  # where `time` goes (costmodel.price.streams)
    dp_exposed: float = 0.0        # of `flush`: the data-parallel all-reduce no backward compute covers
    dp_contention: float = 0.0     # of `flush`: compute slowed by the all-reduce it overlaps
    step: float = 0.0              # of `flush`: the optimizer step
    accumulate: float = 0.0        # of `compute` (pipelined FSDP): adding a micro-batch's gradients into fp32 ones
    zero_first: "streams.Window | None" = None  # of `flush` (pipelined): the step's first forward gather
    zero_scatter: float = 0.0      # of `flush` (pipelined): the step's one reduce-scatter, exposed
    zero1_sync: float = 0.0        # of `flush` (ZeRO-1 as torch runs it): the parameters' broadcast, exposed

    @property
    def zero_flush(self) -> float:
        """Of `flush`: a pipelined stage's once-per-step ZeRO traffic, exposed and contention."""
        return self.zero_flush_exposed + self.zero_flush_contention

    @property
    def zero_flush_exposed(self) -> float:
        """Of `flush`: the ZeRO traffic issued once per step that no compute covers (a pipelined stage's
        gather and reduce-scatter, ZeRO-1's parameter broadcast)."""
        return (self.zero_first.exposed if self.zero_first else 0.0) + self.zero_scatter + self.zero1_sync

    @property
    def zero_flush_contention(self) -> float:
        return self.zero_first.contention if self.zero_first else 0.0

    @property
    def zero_flush_hidden(self) -> float:
        return self.zero_first.hidden if self.zero_first else 0.0

    @property
    def sharding(self) -> str:
        return self.base.name

    @property
    def complexity(self) -> int:
        """How much machinery the variant needs; breaks ties between equally fast plans toward the plainest."""
        return (RECOMPUTE.index(self.recompute) + 2 * self.offload_activations + 2 * self.offload_states
                + (self.zero is not None))

    @property
    def label(self) -> str:
        parts = [self.sharding, f"recompute={self.recompute}"]
        if self.offload_activations:
            parts.append("offload-activations")
        if self.offload_states:
            parts.append("offload-states")
        if self.zero is not None:
            parts.append(f"zero-{self.zero}")
        return " ".join(parts)


def pipelined_fsdp(in_pipeline: bool, zero: int, dp: int) -> bool:
    """True where torch.distributed.pipelining drives an FSDP stage (ZeRO-2/3 over more than one
    data-parallel rank): gradients synced once per step, parameters kept gathered (module docstring)."""
    return in_pipeline and zero >= 2 and dp > 1


def zero_state_bytes(n: float, sb: StateBytes, zero: int, dp: int, offload_states: bool = False) -> float:
    """Device bytes of model state for n parameters under a ZeRO stage (module docstring)."""
    if offload_states:
        assert zero == 3, "state offload is FSDP2's CPUOffloadPolicy: ZeRO-3 only"
        return 0.0
    o = sb.optimizer
    if zero == 0:
        return (sb.param + sb.grad + o) * n
    if zero == 1:
        return (sb.param + sb.grad) * n + o * n / dp
    if zero == 2:  # (the sharded parameter stays beside the gathered one: costmodel.price.memory)
        return sb.param * n + (sb.grad + o + (sb.shard_copy if dp > 1 else 0)) * n / dp
    if zero == 3:
        return (sb.param + sb.grad + o) * n / dp
    raise ValueError(f"ZeRO stage must be 0-3, got {zero}")


def zero1_excess(numels: list[int], d: int) -> float:
    """E: parameters the busiest of d ranks steps beyond numel / d under torch's ZeroRedundancyOptimizer,
    which hands out whole tensors, largest first, each to the rank holding the fewest elements so far
    (runtime/parallel/zero1.py): that rank holds o (numel / d + E) bytes of optimizer state. Megatron's distributed
    optimizer shards a flat buffer evenly (E = 0)."""
    if d <= 1 or not numels:
        return 0.0
    loads = [(0, rank) for rank in range(d)]  # (elements, rank): the first least-loaded rank takes the next
    for n in sorted(numels, reverse=True):
        load, rank = heapq.heappop(loads)
        heapq.heappush(loads, (load + n, rank))
    return max(load for load, _ in loads) - sum(numels) / d


def _expert_split(o: BlockOption, dp: int, ep: int) -> tuple[float, float, int]:
    """(dense parameters, expert parameters on this rank, ranks holding the same experts): with ep > 1 a
    rank holds 1/ep of a MoE layer's experts, shared with the dp / ep ranks of the same ep index."""
    if ep <= 1 or o.experts is None:
        return float(o.param_numel), 0.0, dp
    return float(o.param_numel - o.experts.numel), o.experts.numel / ep, dp // ep


@dataclass(frozen=True)
class _Rank:
    """One layer on one rank of a candidate: what every step of `cost_variant` reads."""

    o: BlockOption
    cluster: Cluster
    sb: StateBytes
    zero: int
    """The variant's own ZeRO stage (Variant.zero, else the candidate's)."""
    dp: int
    tp: int
    b: float
    n_dense: float
    n_expert: float
    """Expert parameters on this rank (_expert_split), held by `edp` ranks alike."""
    edp: int
    dp_group: object
    edp_group: object
    """The data-parallel groups of the dense parameters and of the experts (costmodel.price.comm.group_for)."""
    pipe_fsdp: bool

    @property
    def dev(self):
        return self.cluster.device

    @property
    def shard(self) -> float:
        """Parameters this rank holds fully sharded."""
        return self.n_dense / self.dp + self.n_expert / self.edp


def cost_variant(v: Variant, cluster: Cluster, sb: StateBytes, zero: int, dp: int, tp: int, b: float,
                 ddp_overlap: bool = False, cp: int = 1, ep: int = 1, pipelined: bool = False,
                 tp_overlap: bool = False, zero1_broadcast: bool = True) -> Variant:
    """Cost one variant for one micro-batch of b samples on one rank (module docstring); the time is the
    stream model's (costmodel.price.streams). `ddp_overlap`: the data-parallel all-reduce (ZeRO-0/1) runs in
    buckets during the last micro-batch's backward (the runtime's DDP), rather than after the flush.
    Context parallelism (`cp`, planner.enumerate.cp_ep): the caller passes dp x cp as `dp` and b / cp as `b` (a
    rank's share of the samples); this adds the K/V gathers. Expert parallelism (`ep`): expert
    parameters 1/ep per rank, their all-to-alls and the busiest rank's imbalance. `pipelined`: the layer
    sits in a pipeline stage (pp > 1), whose ZeRO traffic and gradients follow torch.distributed.pipelining
    (module docstring). `tp_overlap`: the TP collectives run in tp chunks beside the tensor-parallel GEMMs
    (costmodel.price.streams.tp_overlap). `zero1_broadcast`: ZeRO-1 broadcasts the parameters after the step
    (torch's ZeroRedundancyOptimizer) rather than Megatron's reduce-scatter + all-gather (module docstring)."""
    o = v.base
    n_dense, n_expert, edp = _expert_split(o, dp, ep)
    zero = zero if v.zero is None else v.zero
    r = _Rank(o=o, cluster=cluster, sb=sb, zero=zero, dp=dp, tp=tp, b=b, n_dense=n_dense, n_expert=n_expert,
              edp=edp, dp_group=comm.group_for(cluster, dp, tp), edp_group=comm.group_for(cluster, edp, ep * tp),
              pipe_fsdp=pipelined_fsdp(pipelined, zero, dp))
    fwd, bwd = _compute_seconds(v, r, o.layout_copy_s(cluster, b, b * cp))
    tp_all, tp_fwd = o.tp_comm_s(cluster, b), o.tp_fwd_comm_s(cluster, b)
    gemm_fwd, gemm_bwd = o.gemm_s(b)
    tp_serial = 0.0
    if tp_overlap and not get_stack(cluster.device.stack).tp_overlap_backward:
        # only forward patterns decompose: the backward's own collectives stay whole, and what the backward
        # direction can still overlap is a full recompute's re-run forward, beside its own GEMMs
        tp_serial, gemm_bwd = tp_all - tp_fwd, 0.0
    if v.recompute == "full":  # the re-run forward repeats its collectives (beside its GEMMs) in the backward
        tp_all, gemm_bwd = tp_all + tp_fwd, gemm_bwd + gemm_fwd
    kv = o.kv_bytes * b * cp  # the K and V of the rank's whole sequences
    v.cp_comm = cp_comm(cluster, kv, cp, tp, v.recompute)
    v.ep_comm = ep_comm(cluster, o.experts.dispatch_bytes * b, ep, tp, cp, v.recompute) if n_expert else 0.0
    kept = _kept_bytes(v, r, kv, cp)
    v.act = 0.0 if v.offload_activations else float(kept)
    v.host_act = float(kept) if v.offload_activations else 0.0
    ag, rs, gather_fwd, gather_bwd, scatter = _zero_traffic(r, zero1_broadcast)
    out, back, serial, nic_f, nic_b = _host_traffic(v, r, kept, gather_fwd, gather_bwd, scatter)
    v.zero_first, v.zero_scatter = None, 0.0
    if r.pipe_fsdp:  # once per step: the first forward's gathers, then one reduce-scatter after the last backward
        v.zero_first = streams.window(fwd, ag, r.shard * sb.param / r.dev.host_bw if v.offload_states else 0.0,
                                      r.dev.overlap_slowdown)
        v.zero_scatter = rs + (r.shard * sb.grad / r.dev.host_bw if v.offload_states else 0.0)
    timing = streams.layer_timing(streams.LayerStreams(
        compute_fwd=fwd, compute_bwd=bwd, tp=tp_all, tp_fwd=tp_fwd, tp_chunks=tp if tp_overlap and tp > 1 else 0,
        tp_serial=tp_serial,
        gemm_fwd=gemm_fwd, gemm_bwd=gemm_bwd, cp=v.cp_comm, ep=v.ep_comm, gather_fwd=gather_fwd,
        gather_bwd=gather_bwd, scatter_bwd=scatter, offload_out=out, offload_in=back, offload_serial=serial,
        nic_fwd=nic_f, nic_bwd=nic_b), r.dev.overlap_slowdown)
    v.timing = timing
    v.time = timing.total
    v.tp_comm = timing.tp
    v.zero_comm = gather_fwd + gather_bwd + scatter
    v.offload_traffic = out + back + serial
    v.state, v.grad, v.host_state = _state_bytes(r.sb, zero, n_dense, n_expert, dp, edp, r.pipe_fsdp, v.offload_states)
    _charge_flush(v, r, bwd, ddp_overlap, zero1_broadcast)
    return v


def _compute_seconds(v: Variant, r: _Rank, copies: tuple[float, float]) -> tuple[float, float]:
    """(forward, backward) compute seconds per micro-batch: b x per-sample seconds + the per-micro-batch
    GEMM and launch seconds split like them, the recompute re-run in the backward, the busiest expert rank's
    imbalance, (pipelined FSDP) the gradient accumulation kernel, and `copies` (forward, backward: the
    re-layouts around batch-first sequence-parallel collectives, repeated by a full recompute's re-run, as its
    collectives are); sets v.accumulate and v.compute."""
    o, b, dev = r.o, r.b, r.dev
    flops = o.fwd_s + o.bwd_s
    per_mb = o.fixed_s + o.launch_s  # per micro-batch seconds, split like the per-sample ones
    fwd = o.fwd_s * b + (per_mb * o.fwd_s / flops if flops else per_mb / 3)
    rerun = o.refwd_by_policy[v.recompute] * b + o.refixed_by_policy.get(v.recompute, 0.0) \
        + o.relaunch_by_policy.get(v.recompute, 0.0)
    bwd = o.bwd_s * b + per_mb - (fwd - o.fwd_s * b) + rerun
    if r.n_expert and o.experts.flops_share:  # the busiest rank's experts pace the all-to-all
        fwd, bwd = (x * (1 + (EP_IMBALANCE - 1) * o.experts.flops_share) for x in (fwd, bwd))
    fwd, bwd = fwd + copies[0], bwd + copies[1] + (copies[0] if v.recompute == "full" else 0.0)
    v.accumulate = 0.0
    if r.pipe_fsdp:  # each micro-batch's gradients are added into the fp32 accumulators: a memory-bound kernel
        v.accumulate = (r.n_dense + r.n_expert) * (r.sb.grad + 2 * r.sb.grad_comm) \
            / (dev.mem_bandwidth * dev.mem_efficiency) + o.param_tensors * dev.op_latency
        bwd += v.accumulate
    v.compute = fwd + bwd
    return fwd, bwd


def _kept_bytes(v: Variant, r: _Rank, kv: float, cp: int) -> float:
    """What the block keeps for its backward: activations, and without recompute the weight copies autograd
    saves (autocast's bf16 casts: one per micro-batch, whatever its size; strategies module docstring), and
    under context parallelism the gathered K and V."""
    kept = r.o.saved_by_policy[v.recompute] * r.b + (r.o.weight_saved if v.recompute == "none" else 0)
    if cp > 1 and v.recompute != "full":  # the gathered K and V are saved for the backward
        kept += kv * (cp - 1) / cp
    return kept


def _collectives(r: _Rank, zero1_broadcast: bool) -> tuple[float, float, float, float]:
    """The layer's data-parallel collectives on this rank: (parameter all-gather, gradient reduce-scatter,
    gradient all-reduce (ZeRO-0/1), ZeRO-1's parameter broadcast). The same for every variant of an option
    (recompute, offload), so they are computed once per option, cluster and rank shape (BlockOption._comm_memo)."""
    key = (id(r.cluster), id(r.sb), r.zero, r.dp, r.edp, r.tp, r.b, zero1_broadcast)  # dp and edp: the ep split
    hit = r.o._comm_memo.get(key)
    if hit is not None and hit[0] is r.cluster and hit[1] is r.sb:
        return hit[2]
    sb, cluster, o, zero, dp, edp = r.sb, r.cluster, r.o, r.zero, r.dp, r.edp
    ag = (comm.all_gather(cluster, r.dp_group, r.n_dense * sb.param) if r.dp > 1 else 0.0) \
        + (comm.all_gather(cluster, r.edp_group, r.n_expert * sb.param) if r.edp > 1 else 0.0)
    rs = (comm.reduce_scatter(cluster, r.dp_group, r.n_dense * sb.grad_comm) if r.dp > 1 else 0.0) \
        + (comm.reduce_scatter(cluster, r.edp_group, r.n_expert * sb.grad_comm) if r.edp > 1 else 0.0)
    ar = 0.0
    if zero <= 1 and dp > 1:
        ar = r.n_dense * sb.grad_comm * comm.affine(comm.all_reduce, cluster, r.dp_group)[1]
        if edp > 1:
            ar += r.n_expert * sb.grad_comm * comm.affine(comm.all_reduce, cluster, r.edp_group)[1]
    sync = 0.0
    if zero == 1 and zero1_broadcast:  # each parameter tensor broadcast from the rank that stepped it
        tensors = max(1, o.param_tensors)
        sync = sum(tensors * comm.broadcast(cluster, group, n * sb.param / tensors)
                   for n, group, size in ((r.n_dense, r.dp_group, dp), (r.n_expert, r.edp_group, edp))
                   if n and size > 1)
    r.o._comm_memo[key] = (cluster, sb, (ag, rs, ar, sync))  # both kept alive: their ids stay theirs
    return ag, rs, ar, sync


def _zero_traffic(r: _Rank, zero1_broadcast: bool) -> tuple[float, float, float, float, float]:
    """(all-gather, reduce-scatter of the layer's parameters and gradients over their data-parallel groups,
    and per micro-batch: the forward gather, the backward gather, the backward reduce-scatter)."""
    ag, rs, _, _ = _collectives(r, zero1_broadcast)
    gather_fwd = ag if r.zero >= 2 and not r.pipe_fsdp else 0.0  # ZeRO-2 (reshard_after_forward off): once
    gather_bwd = ag if r.zero == 3 else 0.0          # ZeRO-3: again before the backward
    scatter = rs if r.zero >= 2 and not r.pipe_fsdp else 0.0
    return ag, rs, gather_fwd, gather_bwd, scatter


def _host_traffic(v: Variant, r: _Rank, kept: float, gather_fwd: float, gather_bwd: float,
                  scatter: float) -> tuple[float, float, float, float, float]:
    """Host-link seconds per micro-batch: (out in the forward, back in the backward, serial on the compute
    stream, the NIC's off-node bytes in the forward and in the backward, which cross the same PCIe switch)."""
    sb, dev, shard = r.sb, r.dev, r.shard
    out = back = 0.0
    serial = 2 * kept / dev.host_bw if v.offload_activations else 0.0  # out and back, on the compute stream
    if v.offload_states and not r.pipe_fsdp:  # parameter shard up before the forward, gradient shard down after
        out += shard * sb.param / dev.host_bw
        back += shard * sb.grad / dev.host_bw
    elif v.offload_states and gather_bwd:  # pipelined ZeRO-3: the shard goes up before each backward's gather
        back += shard * sb.param / dev.host_bw
    nic_f = nic_b = 0.0
    if out or back or serial:  # the NIC's off-node bytes cross the same PCIe switch as the host copies
        off = lambda nbytes: (comm.off_node_bytes(r.cluster, r.dp_group, r.n_dense * nbytes)
                              + comm.off_node_bytes(r.cluster, r.edp_group, r.n_expert * nbytes)) / dev.host_bw
        nic_f = off(sb.param) if gather_fwd else 0.0
        nic_b = off(sb.param) * (gather_bwd > 0) + off(sb.grad_comm) * (scatter > 0)
    return out, back, serial, nic_f, nic_b


def _state_bytes(sb: StateBytes, zero: int, n_dense: float, n_expert: float, dp: int, edp: int, pipe_fsdp: bool,
                 offload_states: bool) -> tuple[float, float, float]:
    """(device state, of it the gradients, host state) of one layer on one rank (module docstring's per-stage
    formulas; pipelined FSDP: parameters gathered and fp32 accumulators, whole)."""
    full = zero_state_bytes(n_dense, sb, zero, dp) + zero_state_bytes(n_expert, sb, zero, edp)
    state = 0.0 if offload_states else full
    grad = 0.0 if offload_states else sb.grad * (n_dense / (dp if zero >= 2 else 1)
                                                 + n_expert / (edp if zero >= 2 else 1))
    host = full if offload_states else 0.0
    if pipe_fsdp:  # parameters gathered and fp32 gradient accumulators, whole, beside the sharded optimizer
        shard = n_dense / dp + n_expert / edp
        grad = sb.grad_comm * (n_dense + n_expert)
        state = sb.param * (n_dense + n_expert) + grad + (0.0 if offload_states else (sb.optimizer + sb.shard_copy) * shard)
    return state, grad, host


def least_state(bases: list[BlockOption], sb: StateBytes, zero: int, dp: int, ep: int, pipelined: bool,
                allow_offload: bool) -> float:
    """The fewest device bytes of model state any variant of these options holds per layer (`variants`' own
    formulas: a variant kept gathered holds more, recompute and offloaded activations change no state), 0 where
    state offload is offered (ZeRO-3 on a device with host memory). No variant priced on (dp, ep) holds less."""
    if not bases or (allow_offload and zero == 3):
        return 0.0
    pipe = pipelined_fsdp(pipelined, zero, dp)
    least = float("inf")
    for o in bases:
        n_dense, n_expert, edp = _expert_split(o, dp, ep)
        least = min(least, _state_bytes(sb, zero, n_dense, n_expert, dp, edp, pipe, False)[0])
    return least


def _charge_flush(v: Variant, r: _Rank, bwd: float, ddp_overlap: bool, zero1_broadcast: bool) -> None:
    """The variant's after-flush seconds (module docstring's D): the data-parallel all-reduce (exposed, or
    bucketed beside the backward under DDP), ZeRO-1's parameter broadcast, the optimizer step."""
    o, sb, zero, dp, dev = r.o, r.sb, r.zero, r.dp, r.dev
    _, _, ar, v.zero1_sync = _collectives(r, zero1_broadcast)
    v.dp_comm = ar
    v.dp_exposed, v.dp_contention = ar, 0.0
    if ddp_overlap and ar:
        # buckets overlap the last micro-batch's backward of this layer (costmodel.price.streams)
        v.dp_exposed, v.dp_contention = streams.bucketed_all_reduce(ar, bwd, dev.overlap_slowdown)
    n_opt = r.shard if zero >= 1 else r.n_dense + r.n_expert
    if v.offload_states:
        step = n_opt * sb.step_traffic / HOST_MEMORY_BW
    else:
        step = n_opt * sb.step_traffic / (dev.mem_bandwidth * dev.mem_efficiency)
    # each parameter held as a DTensor (tensor-parallel ones; all of them under FSDP) costs the optimizer
    # DTensor's dispatch of its per-parameter operators: Device.sharded_param_latency
    dtensors = o.param_tensors if zero >= 2 and dp > 1 else o.dtensor_params
    v.step = step + dtensors * dev.sharded_param_latency
    v.flush = v.dp_exposed + v.dp_contention + v.step + v.zero_flush


def variants(bases: list[BlockOption], cluster: Cluster, sb: StateBytes, zero: int, dp: int, tp: int, b: float,
             allow_recompute=RECOMPUTE, allow_offload: bool = True, prune: bool = True,
             ddp_overlap: bool = False, cp: int = 1, ep: int = 1, pipelined: bool = False,
             keep_gathered: bool = True, kernels: str = "eager", tp_overlap: bool = False,
             zero1_broadcast: bool = True) -> list[Variant]:
    """Every variant of every sharding option, costed, with dominated ones removed (`keep_gathered`:
    SearchSpace.keep_gathered), leaving out what the runtime does not run under `kernels`
    (planner.plan.executable.offload_refusal); `tp_overlap`, `zero1_broadcast`: as cost_variant's.

    With tp > 1 a replicated variant is usually dominated by a tensor-parallel one (slower, more memory)
    and disappears; if every tensor-parallel variant is dominated instead, the mesh's tp ranks would
    only duplicate work and the caller drops the candidate (no tensor variant is returned).
    """
    allow_offload = allow_offload and cluster.device.host_memory_bytes > 0
    out: list[Variant] = []
    for base in bases:
        for r in allow_recompute:
            for off_a in ((False, True) if allow_offload else (False,)):
                if offload_refusal(r, off_a, kernels):
                    continue  # not run (e.g. full recompute keeps the layer input alone: nothing to offload)
                cost = lambda var: cost_variant(var, cluster, sb, zero, dp, tp, b, ddp_overlap, cp, ep, pipelined,
                                                tp_overlap and base.name == "sequence", zero1_broadcast)
                for off_o in ((False, True) if allow_offload and zero == 3 else (False,)):
                    out.append(cost(Variant(base, r, off_a, off_o)))
                if zero == 3 and dp > 1 and keep_gathered:  # this block alone kept gathered from forward to backward
                    out.append(cost(Variant(base, r, off_a, zero=2)))
    return pareto(out) if prune else out


def pareto(vs: list[Variant]) -> list[Variant]:
    """Drop variants no better than another in every cost (ties: keep the first)."""
    return [vs[i] for i in pareto_indices(vs)]


def pareto_indices(vs: list[Variant]) -> list[int]:
    """Indices of the variants no other variant dominates (ties: the first is kept).

    A variant dominates another when it is no worse in every cost the stage program charges per layer
    (planner.solve.milp) and better in one: time T, state W, state less gradients W - G (the forward/backward
    peak of a stage that reaches its first backward before any gradient exists charges W - G + k A,
    planner.estimate.phases), activations A, flush D, host state V and host activations U. W - G is compared, not
    G: at the same W, more gradient bytes mean less memory at that peak. A variant that recomputes, or
    reshards after its forward, also makes the gated phases of planner.estimate.phases bind on its stage (the
    rebuild, the forward end with autocast's weight casts, the ZeRO-3 gathers): it counts as one more cost,
    so that it never prunes a variant free of them. (Without it, op recompute with offload removed plain
    offload, and llama3-8b at global batch 4 was refused on one H200 with a plan that fits: the forward end
    charges op's weight casts, 0.4 GiB a layer, that plain offload does not hold.)
    """
    if not vs:
        return []
    c = np.array([[v.time, v.state, v.state - v.grad, v.act, v.flush, v.host_state, v.host_act,
                   float(v.recompute != "none"), float(v.zero in (None, 3))] for v in vs])
    # no_worse[j, i]: j is no worse than i in every cost; better[j, i]: strictly better in one
    no_worse = (c[:, None, :] <= c[None, :, :] * (1 + 1e-12)).all(axis=2)
    better = (c[:, None, :] < c[None, :, :] * (1 - 1e-12)).any(axis=2)
    n = len(vs)
    earlier = np.tri(n, n, -1, dtype=bool).T  # earlier[j, i]: j < i (a tie keeps the first)
    dominates = no_worse & (better | earlier)
    np.fill_diagonal(dominates, False)
    return [i for i in range(n) if not dominates[:, i].any()]

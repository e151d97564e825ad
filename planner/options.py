"""Layer variants: a sharding option x a recompute policy x activation offload x optimizer offload,
costed per rank for one candidate (tp, dp, ZeRO stage, micro-batch b).

Per micro-batch time (seconds):
    compute  = (forward + backward + recompute re-run) * b + operator launches (Device.op_latency each)
    overlap  = max(compute, ZeRO traffic, activation offload traffic)     (prefetched / async copies)
    T        = overlap + tensor-parallel all-reduces (on the critical path, as in Megatron-LM)
ZeRO traffic per micro-batch over the data-parallel group (FSDP2 semantics, what the runtime runs):
    stage 2 (reshard after forward off): all-gather parameters once + reduce-scatter gradients
    stage 3 (FSDP):                      all-gather in forward and again in backward + reduce-scatter
Activation offload (save_on_cpu): the kept activations go to host in forward and back in backward,
2 * A / host link bandwidth.

Model-state bytes per rank (n parameters on this rank after tensor parallelism; ZeRO, Rajbhandari et al.
SC'20, with p, g, o bytes per parameter of parameters, gradients, optimizer state; d = dp degree):
    stage 0:  (p + g + o) n        stage 1:  (p + g) n + o n / d
    stage 2:  p n + (g + o) n / d  stage 3:  (p + g + o) n / d
In a ZeRO-3 candidate each layer may instead keep its parameters gathered from forward to backward
(stage 2 for that layer alone: p n (1 - 1/d) more bytes, one all-gather fewer per micro-batch), so the
program trades memory for exposed communication layer by layer.
State offload (FSDP2's CPUOffloadPolicy, so ZeRO-3 only) keeps the sharded parameters, gradients and
optimizer state in host memory: each micro-batch copies the parameter shard up and the gradient shard
down the host link (overlapped like the all-gathers), and the optimizer step runs on the CPU
(n / d * step traffic / HOST_MEMORY_BW). Offload is only offered on devices with their own memory
(`Device.host_memory_bytes > 0`; a `cpu` device's memory already is host memory).

After-flush time D (seconds): stages 0-1 all-reduce the gradients (stage 1 as reduce-scatter + all-gather,
the same volume, 2 Psi); stages 2-3 already reduced them per micro-batch. Then the optimizer step over the
rank's optimizer shard, memory-bound: n_opt * step traffic / memory bandwidth, plus
Device.sharded_param_latency per parameter tensor held as a DTensor.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel import comm
from costmodel.hardware import Cluster
from costmodel.memory import StateBytes
from planner.strategies import BlockOption

RECOMPUTE = ("none", "selective", "full")
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
    tp_comm: float = 0.0
    zero_comm: float = 0.0
    offload_traffic: float = 0.0
    dp_comm: float = 0.0
    host_state: float = 0.0        # bytes of optimizer state offloaded to host memory
    host_act: float = 0.0          # bytes of activations offloaded per micro-batch

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
    if zero == 2:
        return sb.param * n + (sb.grad + o) * n / dp
    if zero == 3:
        return (sb.param + sb.grad + o) * n / dp
    raise ValueError(f"ZeRO stage must be 0-3, got {zero}")


def cost_variant(v: Variant, cluster: Cluster, sb: StateBytes, zero: int, dp: int, tp: int, b: int) -> Variant:
    o, dev = v.base, cluster.device
    n = o.param_numel
    zero = zero if v.zero is None else v.zero
    dp_group = comm.group_for(cluster, dp, tp)
    v.compute = (o.fwd_s + o.bwd_s + o.refwd_by_policy[v.recompute]) * b \
        + o.launch_s + o.relaunch_by_policy.get(v.recompute, 0.0)
    v.tp_comm = o.tp_comm_s(cluster, b)
    if v.recompute == "full":  # the re-run forward repeats its collectives
        v.tp_comm += o.tp_fwd_comm_s(cluster, b)
    kept = o.saved_by_policy[v.recompute] * b
    v.offload_traffic = 2 * kept / dev.host_bw if v.offload_activations else 0.0
    v.act = 0.0 if v.offload_activations else float(kept)
    v.host_act = float(kept) if v.offload_activations else 0.0
    ag = comm.all_gather(cluster, dp_group, n * sb.param)
    rs = comm.reduce_scatter(cluster, dp_group, n * sb.grad)
    v.zero_comm = {0: 0.0, 1: 0.0, 2: ag + rs, 3: 2 * ag + rs}[zero] if dp > 1 else 0.0
    if v.offload_states:  # parameter shard up, gradient shard down, every micro-batch
        v.zero_comm += n / dp * (sb.param + sb.grad) / dev.host_bw
    v.time = max(v.compute, v.zero_comm, v.offload_traffic) + v.tp_comm
    v.state = zero_state_bytes(n, sb, zero, dp, v.offload_states)
    v.grad = 0.0 if v.offload_states else sb.grad * n / (dp if zero >= 2 else 1)
    v.host_state = (zero_state_bytes(n, sb, zero, dp) - v.state) if v.offload_states else 0.0
    _, per_byte = comm.affine(comm.all_reduce, cluster, dp_group)
    v.dp_comm = n * sb.grad * per_byte if zero <= 1 else 0.0
    n_opt = n / dp if zero >= 1 else n
    if v.offload_states:
        step = n_opt * sb.step_traffic / HOST_MEMORY_BW
    else:
        step = n_opt * sb.step_traffic / dev.mem_bandwidth
    # each parameter held as a DTensor (tensor-parallel ones; all of them under FSDP) costs the optimizer
    # DTensor's dispatch of its per-parameter operators: Device.sharded_param_latency
    dtensors = o.param_tensors if zero >= 2 and dp > 1 else o.dtensor_params
    v.flush = v.dp_comm + step + dtensors * dev.sharded_param_latency
    return v


def variants(bases: list[BlockOption], cluster: Cluster, sb: StateBytes, zero: int, dp: int, tp: int, b: int,
             allow_recompute=RECOMPUTE, allow_offload: bool = True, prune: bool = True) -> list[Variant]:
    """Every variant of every sharding option, costed, with dominated ones removed.

    With tp > 1 a replicated variant is usually dominated by a tensor-parallel one (slower, more memory)
    and disappears; if every tensor-parallel variant is dominated instead, the mesh's tp ranks would
    only duplicate work and the caller drops the candidate (no tensor variant is returned).
    """
    allow_offload = allow_offload and cluster.device.host_memory_bytes > 0
    out: list[Variant] = []
    for base in bases:
        for r in allow_recompute:
            for off_a in ((False, True) if allow_offload else (False,)):
                if off_a and r == "full":
                    continue  # the layer input alone: nothing worth the host link
                for off_o in ((False, True) if allow_offload and zero == 3 else (False,)):
                    out.append(cost_variant(Variant(base, r, off_a, off_o), cluster, sb, zero, dp, tp, b))
                if zero == 3 and dp > 1:  # this block alone kept gathered from forward to backward
                    out.append(cost_variant(Variant(base, r, off_a, zero=2), cluster, sb, zero, dp, tp, b))
    return pareto(out) if prune else out


def pareto(vs: list[Variant]) -> list[Variant]:
    """Drop variants no better than another in every cost (ties: keep the first)."""
    return [vs[i] for i in pareto_indices(vs)]


def pareto_indices(vs: list[Variant]) -> list[int]:
    keep: list[int] = []
    for i, v in enumerate(vs):
        a = np.array([v.time, v.state, v.act, v.flush, v.host_state, v.host_act])
        dominated = False
        for j, w in enumerate(vs):
            if i == j:
                continue
            bvec = np.array([w.time, w.state, w.act, w.flush, w.host_state, w.host_act])
            if (bvec <= a * (1 + 1e-12)).all() and ((bvec < a * (1 - 1e-12)).any() or j < i):
                dominated = True
                break
        if not dominated:
            keep.append(i)
    return keep

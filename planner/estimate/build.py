"""Turn a solved search candidate into a Plan: stages, per-block choices, placements, predictions."""
from __future__ import annotations

import dataclasses

import numpy as np

from partita.costmodel.hardware import UNALIGNED_FIELDS, kernel_constants
from partita.costmodel.price.kernels import ALIGN_BYTES, ELEMENT_BYTES, node_time, unaligned_linears

from partita.planner.plan import BlockChoice, Mesh, Plan, Schedule, Stage
from partita.planner.plan.schedules import SCHEDULES
from partita.planner.plan.sync import has_outer_step
from partita.planner.enumerate.base import model_state_bytes
from partita.planner.enumerate.candidates import Candidate
from partita.planner.enumerate.cp_ep import EP_IMBALANCE
from partita.planner.plan.executable import (composition_refusal, cp_refusal_for, overlap_refusal, pipeline_refusal_for,
                                       sync_refusal, zero_refusal)
from partita.planner.enumerate.options import pipelined_fsdp
from partita.planner.search import SearchResult
from partita.planner.estimate.phases import stage_host_memory, stage_memory
from partita.planner.plan import SPLIT
from partita.planner.estimate import sync as sync_price


def predicted(result: SearchResult, c: Candidate) -> dict:
    """Step time, throughput, FLOP/s and memory of a solved candidate, with their breakdown.

    The breakdown follows the objective: the bottleneck stage s* paces m micro-batches (its compute, the
    compute's slowdown while collectives overlap it ("contention"), and the communication no compute
    covers: tensor-parallel, ZeRO, offload, point-to-point -- costmodel.price.streams), the other stages' fill
    and drain are the bubble, and the slowest stage's flush (the data-parallel all-reduce's exposed part,
    the optimizer step) follows; the breakdown adds up to the step time. `exposed_comm_s` sums its exposed
    kinds; `hidden_comm_s` (not part of the step) is communication that ran beside compute, costing
    only its contention.
    """
    sol, prob = c.solution, c.problem
    train, cluster = result.train, result.cluster
    m = c.num_microbatches
    paced = _paced_seconds(c, int(np.argmax(sol.stage_time)))
    # objective = m tau* + (sum tau - tau*) / v + flush: fill and drain shrink v-fold when interleaved
    bubble = SCHEDULES[c.schedule].bubble_s(sol.stage_time, c.virtual_stages)
    flush = _flush_seconds(c, int(np.argmax(sol.stage_flush)))
    step = sol.objective
    tokens = train.global_batch * (result.graph.seq_len or 1)
    # Model FLOPs (Korthikanti et al. 2022): forward + backward = 3x the forward FLOPs, recomputation
    # not counted, so plans with and without recompute compare fairly.
    model_flops = 3 * result.graph.totals()["fwd_flops"] * train.global_batch
    tflops = model_flops / step / cluster.num_devices / 1e12
    memory = [stage_memory(c, s) for s in range(c.pp)]
    breakdown = _step_breakdown(m, step, paced, bubble, flush)
    exposed_comm = sum(breakdown[k] for k in ("tp_comm_s", "cp_comm_s", "ep_comm_s", "zero_comm_s", "offload_s",
                                              "p2p_s", "dp_comm_s"))
    return {
        "step_time_s": step,
        "tokens_per_s": tokens / step,
        "tflops_per_device": tflops,
        # against the cluster's own peaks (on a heterogeneous list: the sum over its groups)
        "mfu": model_flops / step / sum(g.num_devices * g.device.peak(train.dtype) for g in cluster.group_list()),
        "peak_memory_bytes": max(r["total"] for r in memory),
        "memory_capacity_bytes": int(np.min(prob.capacity)),
        # what the capacity leaves out (costmodel.hardware.Device): the reserve for the CUDA context and NCCL,
        # and the allocator's share: its predicted cache per stage, or a flat fraction of what is left after
        # the reserve, on the conservative device
        "memory_reserved_bytes": int(cluster.device.reserved_bytes),
        **allocator_share(c, cluster.device),
        "exposed_comm_s": exposed_comm,
        "hidden_comm_s": max(0.0, float(m * paced["hidden"] + flush["dp_hidden"] + flush["zero_flush_hidden"])),
        "assumptions": (assumptions(cluster, train.dtype, c.tp_overlap, c.p2p_overlap)
                        + kernel_assumptions(result.space.kernels)
                        + alignment_assumptions(result.graph, cluster.device, train.dtype)
                        + parallelism_assumptions(c, cluster.device.stack)),
        # operators that compute but have no FLOP formula (costmodel.price.flops): priced by their bytes only
        "uncosted_ops": result.graph.uncosted_ops(),
        "breakdown": breakdown,
        "memory_per_stage": memory,
        **({"host_memory_per_stage": host} if any(host := [stage_host_memory(c, s) for s in range(c.pp)]) else {}),
        **tied_charges(c),
        **({"memory_capacity_per_stage": [int(x) for x in np.broadcast_to(prob.capacity, (c.pp,))]}
           if np.ndim(prob.capacity) else {}),
    }


def _stage_column(c: Candidate, attr: str, s: int) -> np.ndarray:
    """Per option: `attr` of stage s's variants (heterogeneous clusters: each stage has its own costs)."""
    stage_opts = c.parts.get("stage_options")
    opts = stage_opts[s] if stage_opts is not None else c.options
    return np.array([getattr(v, attr) for v in opts] or [0.0])


def _stage_timing(c: Candidate, kind: str, s: int) -> np.ndarray:
    """Per option: seconds of `kind` in its stream timing (costmodel.price.streams), on stage s."""
    stage_opts = c.parts.get("stage_options")
    opts = stage_opts[s] if stage_opts is not None else c.options
    get = {"contention": lambda t: t.contention, "hidden": lambda t: t.hidden,
           "zero": lambda t: t.exposed["zero"], "offload": lambda t: t.exposed["offload"]}[kind]
    return np.array([get(v.timing) if v.timing is not None else 0.0 for v in opts] or [0.0])


def _paced_seconds(c: Candidate, s_star: int) -> dict:
    """One micro-batch's seconds on the bottleneck stage s*, by kind (m of them pace the step)."""
    parts, n = c.parts, c.solution.counts[s_star]
    col = lambda attr: _stage_column(c, attr, s_star)
    timing = lambda kind: _stage_timing(c, kind, s_star)
    # overlapped pipeline sends (costmodel.price.streams.overlapped_sends): their contention and hidden seconds
    p2p_contention = parts.get("e_p2p_contention", np.zeros(c.pp))[s_star]
    return dict(
        compute=n @ col("compute") + parts["e_compute"][s_star],
        tp_comm=n @ col("tp_comm") + parts["e_tp"][s_star],
        cp_comm=n @ col("cp_comm"), ep_comm=n @ col("ep_comm"),
        p2p=parts["e_p2p"][s_star],
        contention=n @ timing("contention") + p2p_contention,
        # the blocks outside the layers (embeddings, head) and each stage's first gathers / last
        # reduce-scatter are in e_zero: exposed ZeRO traffic (and their small contention)
        zero_exposed=n @ timing("zero") + parts["e_zero"][s_star],
        exposed_offload=n @ timing("offload"),
        hidden=n @ timing("hidden") + parts.get("e_p2p_hidden", np.zeros(c.pp))[s_star])


def _flush_seconds(c: Candidate, f_star: int) -> dict:
    """The slowest flush's seconds (stage f*), by kind: what follows the last micro-batch."""
    parts, fn = c.parts, c.solution.counts[f_star]
    col = lambda attr: _stage_column(c, attr, f_star)
    out = dict(
        dp_comm=float(fn @ col("dp_exposed") + parts["e_dp"][f_star]),
        dp_contention=float(fn @ col("dp_contention")),
        dp_hidden=float(fn @ (col("dp_comm") - col("dp_exposed"))),
        # a pipelined stage's once-per-step ZeRO traffic (planner.enumerate.options): exposed, and its contention
        zero_flush=float(fn @ col("zero_flush_exposed") + parts.get("e_zero_flush", np.zeros(c.pp))[f_star]),
        zero_flush_contention=float(fn @ col("zero_flush_contention")),
        zero_flush_hidden=float(fn @ col("zero_flush_hidden")),
        p2p_fill=float(parts.get("e_p2p_fill", np.zeros(c.pp))[f_star]))  # overlapped sends' fill and flush
    out["optimizer"] = float(c.solution.stage_flush[f_star] - out["dp_comm"] - out["dp_contention"]
                             - out["zero_flush"] - out["zero_flush_contention"] - out["p2p_fill"])
    return out


def _step_breakdown(m: int, step: float, paced: dict, bubble: float, flush: dict) -> dict:
    """The step time by kind: m x the bottleneck's micro-batch, the bubble and the flush; adds up to `step`
    (a term within 1e-12 of it reads 0)."""
    p, f = paced, flush
    breakdown = {"compute_s": m * p["compute"],
                 "contention_s": m * p["contention"] + f["dp_contention"] + f["zero_flush_contention"],
                 "tp_comm_s": m * p["tp_comm"], "cp_comm_s": m * p["cp_comm"], "ep_comm_s": m * p["ep_comm"],
                 "zero_comm_s": m * p["zero_exposed"] + f["zero_flush"], "offload_s": m * p["exposed_offload"],
                 "p2p_s": m * p["p2p"] + f["p2p_fill"], "bubble_s": bubble, "dp_comm_s": f["dp_comm"],
                 "optimizer_s": f["optimizer"]}
    return {k: max(0.0, float(v)) if abs(v) > 1e-12 * step else 0.0 for k, v in breakdown.items()}


def allocator_share(c: Candidate, device) -> dict:
    """The memory a plan leaves to the caching allocator: a flat headroom (`memory_headroom`, its fraction),
    or the cache predicted per stage (`memory_allocator_cache_per_stage`: ALLOCATOR_CACHE_FACTOR x the stage's
    largest transient, and on a stage holding a recomputed layer the re-run layer's too; planner.estimate.
    phases.memory_phases) with the two factors it was predicted with (`memory_allocator_cache_factors`: a later
    fit moves them, and benchmarks.allocator_cache re-plans a measured case under its own); `memory_headroom_bytes`
    is the largest of either."""
    cache = c.parts.get("allocator_cache")
    if not device.charges_allocator_cache:
        return {"memory_headroom": device.allocator_headroom, "memory_headroom_bytes": int(device.headroom_bytes())}
    if cache is None:  # (the per-block and heterogeneous programs: one transient on every stage)
        cache = np.broadcast_to(device.usable_memory() - c.problem.capacity, (c.pp,))
    else:
        cache = predicted_cache(c, cache, device)
    return {"memory_headroom_bytes": int(np.max(cache)), "memory_allocator_cache_per_stage": [int(x) for x in cache],
            "memory_allocator_cache_factors": list(device.allocator_cache_factors)}


def cache_terms(c: Candidate) -> tuple[np.ndarray, np.ndarray]:
    """Per stage, under the candidate's solution: its largest transient and its largest re-run layer among
    the recompute policies it uses (0 where it recomputes nothing): planner.estimate.phases.memory_phases."""
    cache, counts = c.parts["allocator_cache"], c.solution.counts
    rebuilt = np.zeros(c.pp)
    for policy, bytes_ in cache["recompute"].items():
        uses = counts[:, [o.recompute == policy for o in c.options]].sum(axis=1) > 0
        rebuilt = np.maximum(rebuilt, uses * bytes_)
    return np.broadcast_to(cache["stages"], (c.pp,)), rebuilt


def predicted_cache(c: Candidate, cache: dict, device) -> list[int]:
    """Each stage's predicted allocator cache (costmodel.hardware.Device.allocator_cache_bytes)."""
    return [int(x) for x in device.allocator_cache_bytes(*cache_terms(c))]


def kernel_assumptions(kernels: str) -> list[str]:
    """How the operators are taken to run (costmodel.price.fusion), when not as partita's runtime runs them."""
    if kernels == "eager":
        return []
    return ["kernels: compiled (torch.compile per block): each connected run of elementwise ops and reductions "
            "is one kernel moving only the bytes it reads and writes outside the run, and saves for backward no "
            "tensor that stays inside the run (AOTAutograd recomputes it); partita's runtime compiles each layer, "
            "the embedding and head run eager"]


def alignment_assumptions(graph, device, dtype: str) -> list[str]:
    """The model's Linears cuBLAS runs unaligned (costmodel.price.kernels, Alignment), what they are priced at on
    `device`, their share of its compute, and the padding that removes them; [] when there are none."""
    found = unaligned_linears(graph, dtype)
    if not found:
        return []
    step = ALIGN_BYTES // ELEMENT_BYTES.get(dtype, 2)
    names = ", ".join(f"{m or 'the model'} (K x N = {k} x {n})" for m, k, n in found[:3])
    names += f" and {len(found) - 3} more" if len(found) > 3 else ""
    has = "has" if len(found) == 1 else "have"
    odd = next((x for x in found[0][1:] if x % step), found[0][2])
    pad = f"padding {odd} to {-(-odd // 64) * 64} (a multiple of 64, as nanoGPT pads GPT-2's vocabulary) removes it"
    read, write = device.gemm_unaligned_read_efficiency, device.gemm_unaligned_write_efficiency
    if read == write == 1.0 and not device.generation:
        return []  # a CPU or a measured device without the term: no cuBLAS to speak of
    if read == write == 1.0:
        timed = kernel_constants("hopper", "pytorch")  # the generation whose kernel timings measure the term
        slower = "-".join(f"{1 / timed.get(k, 1.0):.1f}" for k in UNALIGNED_FIELDS) + "x"
        return [f"unaligned GEMMs: {names} {has} a dimension no multiple of {step}; priced as aligned, since no "
                f"kernel timing of {device.name} measures cuBLAS's unaligned kernels (Hopper's, fitted to an H200's "
                f"timings, run {slower} slower): expect the step slower than predicted; {pad}"]

    def seconds(dev) -> float:
        times = [node_time(d, dev, dtype) for _, d in graph.g.nodes(data=True)]
        return sum(t.fwd + t.bwd + t.fixed_fwd + t.fixed_bwd for t in times)
    priced = seconds(device)
    extra = priced - seconds(dataclasses.replace(device, **dict.fromkeys(UNALIGNED_FIELDS, 1.0)))
    return [f"unaligned GEMMs: {names} {has} a dimension no multiple of {step}, so cuBLAS runs slower kernels: "
            f"priced at {write:.2f} of the aligned rate where they write such rows and {read:.2f} where they read "
            f"them (kernel timings of {device.name}'s generation), {100 * extra / priced:.0f}% of the model's "
            f"compute; {pad}"]


def parallelism_assumptions(c: Candidate, stack: str | None = None) -> list[str]:
    """What the plan's pipelined ZeRO, ZeRO-1, overlaps, context and expert parallelism are priced by
    (planner.enumerate.options, costmodel.price.streams, planner.enumerate.cp_ep), in words; `stack`: the one the
    plan is priced for (which TP collectives it overlaps)."""
    from partita.costmodel.hardware.stacks import get_stack
    out = []
    if c.zero == 1 and c.dp * c.cp > 1:
        broadcast = c.options and any(v.zero1_sync for v in c.options)
        out.append("ZeRO-1: gradients all-reduced whole, each rank steps 1/dp of the parameters"
                   + (" and broadcasts them after the step, exposed (torch's ZeroRedundancyOptimizer)" if broadcast
                      else " (Megatron's distributed optimizer: reduce-scatter and all-gather, the all-reduce's "
                           "bytes)"))
    if c.tp_overlap and get_stack(stack).tp_overlap_backward:
        out.append(f"tensor-parallel overlap: each all-gather / reduce-scatter of sequence parallelism in {c.tp} "
                   "chunks pipelined with the GEMMs it feeds or follows (Megatron-Core --tp-comm-overlap; Wang et al. "
                   "ASPLOS'23), the backward's beside the gradient GEMMs: one chunk exposed, the rest hidden as far "
                   "as the GEMMs last")
    elif c.tp_overlap:
        out.append(f"tensor-parallel overlap (torch async TP): the forward's all-gathers / reduce-scatters, and a "
                   f"full recompute's re-run, in {c.tp} chunks pipelined with the GEMMs they feed or follow (Wang et "
                   "al. ASPLOS'23): one chunk exposed, the rest hidden as far as the GEMMs last; the backward's own "
                   "collectives exposed (torch's micro-pipeline TP fuses forward patterns only)")
    if c.p2p_overlap:
        out.append("pipeline sends overlapped with another chunk's compute in the steady 1F1B phase (Megatron-Core "
                   "--overlap-p2p-communication): exposed only where a send outlasts one layer's compute; the "
                   "fill's and flush's sends exposed")
    if pipelined_fsdp(c.pp > 1, c.zero, c.dp * c.cp):
        out.append("pipeline with FSDP (torch.distributed.pipelining): each stage keeps its parameters gathered and "
                   "accumulates whole fp32 gradients over the micro-batches, reduce-scattered once per step after its "
                   "last backward (exposed)" + ("; ZeRO-3 re-gathers before each backward" if c.zero == 3 else ""))
    if c.cp > 1:
        out.append(f"context parallelism: each sequence in {2 * c.cp} chunks, a head and a tail chunk per cp rank "
                   "(balanced causal attention); every layer all-gathers K and V over its cp ranks and "
                   "reduce-scatters their gradients, exposed (Llama 3's all-gather form)")
    if c.ep > 1:
        out.append(f"expert parallelism: all-to-all dispatch and combine of every MoE layer, exposed; the busiest "
                   f"rank's expert GEMMs take {EP_IMBALANCE:g}x their balanced time (load-imbalance factor: the "
                   "Switch Transformer's capacity factor)")
    return out


def assumptions(cluster, dtype: str, tp_overlap: bool = False, p2p_overlap: bool = False) -> list[str]:
    """The cost model's parameters in force for this cluster, in words (explain prints them); which of the
    tensor-parallel collectives and pipeline sends are exposed depends on the plan's overlaps."""
    d = cluster.device
    exposed = [what for what, overlapped in (("tensor-parallel collectives", tp_overlap),
                                             ("pipeline sends", p2p_overlap)) if not overlapped]
    peak = d.peak(dtype) / 1e12
    if d.gemm_half_mn:
        split = f"max(1, K / {d.gemm_split_k:.0f})" if d.gemm_split_k else "1"
        shape = f", W / (W + {d.gemm_half_mn:.3g}) of that for an M x K x N GEMM, W = M N {split}"
    elif d.gemm_half_dim:
        shape = f", each GEMM dimension x scaling that by x / (x + {d.gemm_half_dim:g})"
    else:
        shape = ", whatever their shape"
    out = [f"{d.name}: {peak:g} TFLOP/s dense {dtype} peak; large GEMMs at {100 * d.matmul_efficiency:.0f}% of it"
           + shape,
           f"fused attention at {100 * (d.attention_efficiency or d.matmul_efficiency):.0f}% of peak"
           + (f" on long sequences, s / (s + {d.attention_half_seq:.0f}) of that at s tokens"
              if d.attention_half_seq else "")
           + "; memory-bound "
           f"ops at {100 * d.mem_efficiency:.0f}% of {d.mem_bandwidth / 1e9:g} GB/s; {d.op_latency * 1e6:.3g} us per "
           "kernel launch"
           + (f"; inside a training step, memory-bound operators at {100 * d.step_efficiency:.0f}% of the rate "
              "timed alone (GEMMs and attention at theirs)"
              if d.step_efficiency != 1.0 else ""),
           f"links per direction: {d.intra_node_bw / 1e9:g} GB/s in a node at {100 * d.intra_link_efficiency:.0f}%, "
           f"{d.inter_node_bw / 1e9:g} GB/s per device across nodes at {100 * d.inter_link_efficiency:.0f}%"
           + (f", / {cluster.pod_oversubscription:g} beyond a pod of {cluster.nodes_per_pod} nodes"
              if cluster.nodes_per_pod else "")
           + "; ring or tree all-reduce, whichever is faster; hierarchical across nodes",
           "overlap: FSDP gathers prefetch one layer ahead and hide behind that layer's compute in the same "
           "direction; each stage's first gathers and last reduce-scatter are exposed; DDP buckets overlap the "
           "backward (one stage, no TP) but the last"
           + (f"; {' and '.join(exposed)} are exposed" if exposed else ""),
           f"compute slows by {100 * d.overlap_slowdown:.0f}% of the time a collective overlaps it"]
    return out


def _layer_choices(c: Candidate, counts_s: np.ndarray) -> list:
    """The variants of a stage's layers in order: the first counts[0] take option 0, and so on."""
    return [c.options[o] for o in range(len(c.options)) for _ in range(int(counts_s[o]))]


def build_plan(result: SearchResult, model_name: str, fingerprint: str, config: dict,
               candidate: Candidate | None = None) -> Plan:
    c = candidate or result.best
    assert c is not None and c.solution is not None and c.solution.feasible
    if c.formulation == "blocks":
        stages, blocks, placements = _block_layout(result, c)
    else:
        stages, blocks, placements = _counts_layout(result, c)
    train = result.train
    solved = [x for x in result.candidates if x.solution is not None]
    sync, predicted_step = choose_sync(result, c)
    return Plan(
        model={"name": model_name, "fingerprint": fingerprint, "config": config,
               "parameters": int(result.graph.totals()["param_numel"])},
        cluster={"spec": result.cluster.spec, "num_devices": result.cluster.num_devices,
                 "devices_per_node": result.cluster.devices_per_node, "device": result.cluster.device.name,
                 **({"groups": [{"name": g.spec, "num_devices": g.num_devices, "device": g.device.name}
                                for g in result.cluster.groups], "stage_groups": c.parts["stage_groups"]}
                    if "stage_groups" in c.parts else {})},
        train={"global_batch": train.global_batch, "seq_len": result.graph.seq_len, "dtype": train.dtype,
               "optimizer": train.optimizer,
               **({"master_weights": train.master_weights} if train.master_weights != "fp32" else {})},
        mesh=Mesh(pp=c.pp, dp=c.dp, cp=c.cp, tp=c.tp, ep=c.ep),
        schedule=Schedule(name=c.schedule, num_microbatches=c.num_microbatches, micro_batch_size=c.micro_batch,
                          virtual_stages=c.virtual_stages),
        stages=stages, blocks=blocks, placements=placements, zero_stage=c.zero,
        overlap={"tp_comm": c.tp_overlap, "p2p": c.p2p_overlap},
        sync=sync,
        predicted=predicted_step,
        solver={"status": c.solution.status, "wall_time_s": result.wall_time_s, "mip_gap": c.solution.mip_gap,
                "backend": "cvxpy+HiGHS", "formulation": c.formulation, "candidates": result.considered,
                "candidates_solved": len(solved), "capture_s": result.graph.capture_seconds,
                "graph_nodes": len(result.graph), **pipeline_note(result, c, sync.mode)},
    )


def sync_setting(result: SearchResult, c: Candidate) -> sync_price.SyncSetting:
    """Where candidate `c`'s replicas synchronise (planner.estimate.sync): ranks are laid out pp-major, so its
    data-parallel group spans dp x cp x tp consecutive ranks."""
    train = result.train
    pure_half = train.master_weights == "none" and train.dtype in ("bf16", "fp16")
    matrices, vectors = sync_price.gradient_shapes(result.graph)
    parameters = int(result.graph.totals()["param_numel"])
    sharded = 0.0
    if c.zero >= 2:  # what ZeRO shards over dp: gradients, optimizer state, and at stage 3 the parameters
        sb = model_state_bytes(train, c.zero)
        sharded = (sb.grad + sb.optimizer + (sb.param if c.zero == 3 else 0)) * parameters / (c.tp * c.pp * c.dp)
    return sync_price.SyncSetting(cluster=result.cluster, parameters=parameters,
                                  dp=c.dp, model_parallel=c.tp * c.pp, dp_span=c.dp * c.cp * c.tp, zero=c.zero,
                                  grad_bytes=2 if pure_half else 4, matrices=matrices, vectors=vectors,
                                  sharded_state_bytes=sharded)


def choose_sync(result: SearchResult, c: Candidate):
    """The sync mode of the plan (the fastest SearchSpace.sync allows: planner.estimate.sync.choose) and the
    candidate's prediction with its cross-island time and memory."""
    space, base, setting = result.space, predicted(result, c), sync_setting(result, c)
    sync, price, priced = sync_price.choose(base, setting, space.sync, every=space.sync_every, bits=space.sync_bits,
                                            allow_any_every=space.sync_allow_any_every,
                                            fragments=space.sync_fragments, delay=space.sync_delay)
    if has_outer_step(sync.mode) and setting.islands != setting.dp:  # the runtime's islands
        sync = type(sync)(mode=sync.mode, options={**sync.options, "islands": setting.islands})
    return sync, sync_price.with_sync(base, sync, price, priced, setting.islands)


def tied_charges(c: Candidate) -> dict:
    """{"tied_weights": [...]}: the tied weights the candidate holds on two stages (planner.enumerate.candidates
    `_charge_tied`): names, stages, gradient bytes and the all-reduce seconds charged per step; {} if none."""
    tied = c.parts.get("tied") or []
    return {"tied_weights": [{k: (float(v) if isinstance(v, (float, np.floating)) else v) for k, v in t.items()}
                             for t in tied]} if tied else {}


def pipeline_note(result: SearchResult, c: Candidate, sync_mode: str = "synchronous") -> dict:
    """What planner.plan.executable says of the plan: {"pipeline": why} when a one-stage plan was not allowed
    pipeline stages, {"not_executed": why} for a choice priced (what-if, or for another stack) that the
    runtime does not run."""
    why = pipeline_refusal_for(result.graph.name) if c.pp == 1 else None
    out = {"pipeline": f"not planned: {why}"} if why else {}
    why = (composition_refusal(c.pp, c.tp, c.cp, c.ep) or (cp_refusal_for(result.graph.name) if c.cp > 1 else None)
           or zero_refusal(c.zero, c.tp, c.cp, c.ep) or overlap_refusal(c.tp_overlap, c.p2p_overlap)
           or sync_refusal(sync_mode, c.pp, c.tp, c.cp, c.ep, c.zero))
    if why:  # a what-if the user fixed, or a stack partita does not run (planner.enumerate.candidates, planner.enumerate.space)
        out["not_executed"] = f"priced as asked but not executed: {why}"
    return out


def _block_layout(result: SearchResult, c: Candidate):
    """Stages, block choices and placements from the general program's one-hot assignment."""
    from partita.planner.solve.milp_blocks import assignment
    stage_of, option_of = assignment(c.problem, c.solution.counts)
    stages, blocks, placements = [], [], {}
    for s in range(c.pp):
        mine = [g for g, st in zip(result.graph.groups, stage_of) if st == s]
        stages.append(Stage(index=s, modules=mine, split_at=None if s == 0 else mine[0]))
    for grp, s, j in zip(result.graph.groups, stage_of, option_of):
        var = c.options[j]
        blocks.append(BlockChoice(fqn=grp, stage=int(s), sharding=var.sharding, recompute=var.recompute,
                                  offload_activations=var.offload_activations, offload_states=var.offload_states,
                                  zero_stage=var.zero))
        if var.sharding in SPLIT:
            placements.update(var.base.placements)
    return stages, blocks, placements


def _counts_layout(result: SearchResult, c: Candidate):
    """Stages, block choices and placements from the counting program (identical layers)."""
    counts = c.solution.counts
    p, v = c.pp, c.virtual_stages
    # device s holds counts[s] layers in v chunks (sizes differ by at most one); virtual stage
    # chunk * p + s runs on device s, and layers flow through virtual stages in model order
    per_device = [_layer_choices(c, counts[s]) if result.layers else [] for s in range(p)]
    chunks = [[len(per_device[s]) // v + (1 if k < len(per_device[s]) % v else 0) for k in range(v)]
              for s in range(p)]
    taken = [0] * p
    stages, blocks, placements = [], [], {}
    start = 0
    for index in range(p * v):
        k, s = divmod(index, p)
        n = chunks[s][k]
        mine = result.layers[start:start + n]
        choices = per_device[s][taken[s]:taken[s] + n]
        taken[s] += n
        modules = (result.prefix if index == 0 else []) + mine + (result.suffix if index == p * v - 1 else [])
        stages.append(Stage(index=index, modules=modules, split_at=None if index == 0 else mine[0]))
        for grp, var in zip(mine, choices):
            blocks.append(BlockChoice(fqn=grp, stage=index, sharding=var.sharding, recompute=var.recompute,
                                      offload_activations=var.offload_activations,
                                      offload_states=var.offload_states, zero_stage=var.zero))
            if var.sharding in SPLIT:
                ref = result.layers[0]
                placements.update({f"{grp}.{key[len(ref) + 1:]}": st for key, st in var.base.placements.items()})
        start += n
    extra_options = c.parts.get("extra_options", {})
    for s, extra in ((0, result.prefix), (p * v - 1, result.suffix)):
        for grp in extra:
            option = extra_options.get(grp)  # embeddings, head: the option the candidate was costed with
            sharding = option.name if option is not None else "replicate"
            blocks.append(BlockChoice(fqn=grp, stage=s, sharding=sharding))
            if sharding in SPLIT:
                placements.update(option.placements)
    blocks.sort(key=lambda b: result.graph.groups.index(b.fqn))
    return stages, blocks, placements

"""Turn the best search candidate into a Plan: stages, per-block choices, placements, predictions."""
from __future__ import annotations

import numpy as np

from costmodel.fingerprint import model_fingerprint
from costmodel.memory import state_bytes
from planner.plan import BlockChoice, Mesh, Plan, Schedule, Stage
from planner.search import Candidate, SearchResult


def _relative(placements: dict[str, str], group: str) -> dict[str, str]:
    return {k[len(group) + 1:]: v for k, v in placements.items()}


def predicted(result: SearchResult, c: Candidate) -> dict:
    """Step time, throughput, FLOP/s and memory of a solved candidate, with their breakdown."""
    sol, prob, parts = c.solution, c.problem, c.parts
    train, cluster = result.train, result.cluster
    counts = sol.counts
    s_star = int(np.argmax(sol.stage_time))
    m = c.num_microbatches
    compute = counts[s_star] @ parts["compute"] + parts["e_compute"][s_star]
    tp_comm = counts[s_star] @ parts["tpcomm"] + parts["e_tp"][s_star]
    p2p = parts["e_p2p"][s_star]
    bubble = float(sol.stage_time.sum() - sol.stage_time[s_star])
    f_star = int(np.argmax(sol.stage_flush))
    pre_dp, suf_dp = parts["e_dp_comm"]
    latency = min(pre_dp, suf_dp)  # both include the per-stage latency once
    dp_comm = counts[f_star] @ parts["dp_comm"] + latency
    dp_comm += (pre_dp - latency if f_star == 0 else 0) + (suf_dp - latency if f_star == c.pp - 1 else 0)
    optimizer = float(sol.stage_flush[f_star] - dp_comm)
    step = sol.objective
    tokens = train.global_batch * (result.graph.seq_len or 1)
    # Model FLOPs (Korthikanti et al. 2022): forward + backward = 3x the forward FLOPs, recomputation
    # not counted, so plans with and without recompute compare fairly.
    model_flops = 3 * result.graph.totals()["fwd_flops"] * train.global_batch
    tflops = model_flops / step / cluster.num_devices / 1e12
    p, g, o = parts["state_split"]
    memory = []
    for s in range(c.pp):
        numel = float(counts[s] @ np.array([opt.param_numel for opt in c.options] or [0.0]))
        numel += (prob.extra_mem[s] - prob.in_flight[s] * parts["e_act"][s] - parts["workspace"]) / (p + g + o)
        act = float(counts[s] @ (prob.option_act * prob.in_flight[s]) + prob.in_flight[s] * parts["e_act"][s])
        row = {"parameters": numel * p, "gradients": numel * g, "optimizer": numel * o,
               "activations": act, "workspace": parts["workspace"]}
        row = {k: int(round(v)) for k, v in row.items()}
        row["total"] = sum(row.values())
        memory.append(row)
    return {
        "step_time_s": step,
        "tokens_per_s": tokens / step,
        "tflops_per_device": tflops,
        "mfu": tflops * 1e12 / cluster.device.peak(train.dtype),
        "peak_memory_bytes": max(r["total"] for r in memory),
        "memory_capacity_bytes": int(cluster.device.usable_memory()),
        "breakdown": {"compute_s": m * compute, "tp_comm_s": m * tp_comm, "p2p_s": m * p2p,
                      "bubble_s": bubble, "dp_comm_s": float(dp_comm), "optimizer_s": optimizer,
                      "offload_s": 0.0},
        "memory_per_stage": memory,
    }


def build_plan(result: SearchResult, model_name: str, fingerprint: str, config: dict) -> Plan:
    c = result.best
    assert c is not None and c.solution is not None
    counts = c.solution.counts
    names = [o.name for o in c.options]
    stages, blocks, placements = [], [], {}
    start = 0
    for s in range(c.pp):
        n_s = int(counts[s].sum()) if result.layers else 0
        mine = result.layers[start:start + n_s]
        # options in stage order: the first counts[s][0] layers take option 0, and so on
        kinds = [names[o] for o in range(len(names)) for _ in range(int(counts[s][o]))] if result.layers else []
        modules = (result.prefix if s == 0 else []) + mine + (result.suffix if s == c.pp - 1 else [])
        stages.append(Stage(index=s, modules=modules, split_at=None if s == 0 else mine[0]))
        for grp, kind in zip(mine, kinds):
            blocks.append(BlockChoice(fqn=grp, stage=s, sharding=kind))
            if kind == "tensor":
                rel = _relative(next(o for o in c.options if o.name == "tensor").placements, result.layers[0])
                placements.update({f"{grp}.{k}": v for k, v in rel.items()})
        start += n_s
    for s, extra in ((0, result.prefix), (c.pp - 1, result.suffix)):
        for grp in extra:
            blocks.append(BlockChoice(fqn=grp, stage=s, sharding="replicate"))
    blocks.sort(key=lambda b: result.graph.groups.index(b.fqn))
    train = result.train
    solved = [x for x in result.candidates if x.solution is not None]
    return Plan(
        model={"name": model_name, "fingerprint": fingerprint, "config": config,
               "parameters": int(result.graph.totals()["param_numel"])},
        cluster={"spec": result.cluster.spec, "num_devices": result.cluster.num_devices,
                 "devices_per_node": result.cluster.devices_per_node, "device": result.cluster.device.name},
        train={"global_batch": train.global_batch, "seq_len": result.graph.seq_len, "dtype": train.dtype,
               "optimizer": train.optimizer},
        mesh=Mesh(pp=c.pp, dp=c.dp, tp=c.tp),
        schedule=Schedule(name=train.schedule, num_microbatches=c.num_microbatches, micro_batch_size=c.micro_batch),
        stages=stages, blocks=blocks, placements=placements,
        predicted=predicted(result, c),
        solver={"status": c.solution.status, "wall_time_s": result.wall_time_s, "mip_gap": c.solution.mip_gap,
                "backend": "cvxpy+HiGHS", "candidates": len(result.candidates), "candidates_solved": len(solved),
                "capture_s": result.graph.capture_seconds, "graph_nodes": len(result.graph)},
    )

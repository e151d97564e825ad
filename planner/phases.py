"""A stage's memory at each moment it can peak (planner.milp's phases), and its breakdown by category.

Measured against this machine's allocator (runtime.memory.AllocatorTrace; benchmarks/fidelity.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from partita.planner.milp import MemoryPhase, per_stage, phase_memory
from partita.planner.strategies import SPLIT, BlockOption

if TYPE_CHECKING:
    from partita.planner.candidates import Candidate, _Bases
    from partita.planner.options import Variant


def grads_absent(m: int, in_flight: np.ndarray, zero: int, dp: int, tp: int) -> np.ndarray:
    """chi_s = 1 where stage s peaks before any gradient exists: its first backward comes before its
    micro-batches run out (m <= k_s) and a step starts with none -- but not under DDP (the runtime's
    choice for zero <= 1, dp > 1, tp = 1 and one stage), whose gradient buckets, the gradients'
    storage, live on."""
    if zero <= 1 and dp > 1 and tp == 1 and len(in_flight) == 1:
        return np.zeros(len(in_flight))
    return (m <= in_flight).astype(float)


def memory_phases(bases: _Bases, opts: list[Variant], e: dict, in_flight: np.ndarray, m: int, b: int, pp: int,
                  tp: int, zero: int, dp: int, sb, sp: bool, suf: list[BlockOption],
                  gathered: float) -> tuple[np.ndarray, list[MemoryPhase], np.ndarray]:
    """Each stage's memory at the moments it can peak (planner.milp's phases); returns the main phase's
    constant per stage, the other phases, and the main phase's transient workspace per stage.

    forward/backward (main): model states, less the gradients while none exist yet (chi_s = 1 when the
        stage's first backward comes before its micro-batches run out, m <= k_s: a step starts with
        none; but never under DDP, whose gradient buckets live through the run), + k_s micro-batches of activations + the gradient arriving at the stage's output: on the
        last stage the logits and their gradient (2 x the largest output, / tp when the head is split
        over the vocabulary); elsewhere the gradient of the boundary activation (/ tp when
        sequence-sharded); + ZeRO-3's two gathered layers; + once gradients exist, a second gradient
        of the stage's largest parameter (computed whole, then accumulated into the one held).
    rebuild (binds only on stages holding a recomputed layer): all model states + activations + the
        boundary gradient + one layer's re-run activations (its "none" saved bytes less its policy's).
    optimizer step: all model states + 2 x the largest parameter's local shard (the step's fp32
        temporaries, a per-tensor step as the runtime's optimizers take on CPU; foreach steps on GPUs
        hold more).
    Measured on this machine's allocator (runtime.memory.AllocatorTrace; benchmarks/fidelity.py).
    """
    graph = bases.graph
    g = graph.g
    if "memory" not in bases._cache:  # per-graph constants, computed once per search
        big = lambda groups: max([max(g.nodes[n]["params"].values(), default=0)
                                  for grp in groups for n in graph.nodes_of(grp)] or [0])
        bases._cache["memory"] = dict(
            out=max([d["out_bytes"] for _, d in g.nodes(data=True)] or [0]),
            param=max([max(d["params"].values(), default=0) for _, d in g.nodes(data=True)] or [0]),
            layer=big(bases.layers[:1]), prefix=big(bases.prefix), suffix=big(bases.suffix),
            boundary=graph.boundary_bytes(bases.layers[0]) if bases.layers else 0)
    k = bases._cache["memory"]
    logits = k["out"] * b
    head_split = any(st == "vocab" for o in suf for st in o.placements.values() if o.name in SPLIT)
    logits_per_rank = logits / (tp if head_split else 1)
    boundary = k["boundary"] * b / (tp if sp else 1)
    arriving = np.full(pp, float(boundary))
    arriving[-1] = 2 * logits_per_rank
    chi = grads_absent(m, in_flight, zero, dp, tp)
    # a weight's gradient is computed whole, then added to the one held: once gradients exist, the
    # stage's largest parameter has a second, transient gradient (first stage: the embedding; last: the
    # head; between: a layer's largest weight)
    per_stage_param = np.full(pp, float(k["layer"]))
    per_stage_param[0] = max(k["layer"], k["prefix"])
    per_stage_param[-1] = max(per_stage_param[-1], k["suffix"])
    accumulate = (1 - chi) * sb.grad * per_stage_param / tp
    workspace = arriving + gathered + accumulate
    main = e["state"] - chi * e["grad"] + in_flight * e["act"] + workspace
    states = np.array([o.state for o in opts] or [0.0])
    act = np.array([o.act for o in opts] or [0.0])
    largest = k["param"]
    # (the largest parameters -- embeddings, head, layer weights -- are the ones tensor parallelism splits)
    step_tmp = 2 * 4 * largest / (dp if zero >= 2 else 1) / tp
    phases = [MemoryPhase("optimizer step", states, e["state"] + step_tmp,
                          parts={"model_states": e["state"], "activations": np.zeros(pp),
                                 "workspace": np.full(pp, step_tmp)})]
    rec = np.array([o.recompute != "none" for o in opts] or [False])
    if rec.any():
        rebuild = max((o.base.saved_by_policy["none"] - o.base.saved_by_policy[o.recompute]) * b
                      for o in opts if o.recompute != "none")
        ws = boundary + rebuild + gathered
        phases.append(MemoryPhase("recompute", states + in_flight[:, None] * act[None, :],
                                  e["state"] + in_flight * e["act"] + ws, gate=rec,
                                  parts={"model_states": e["state"], "activations": in_flight * e["act"],
                                         "workspace": np.full(pp, ws)}))
    return main, phases, workspace


def stage_memory(c: Candidate, s: int, counts: np.ndarray | None = None) -> dict:
    """Stage s's predicted peak by category, at the phase where it peaks (memory_phases), for the
    candidate's solution or for `counts`."""
    prob, parts = c.problem, c.parts
    counts = c.solution.counts if counts is None else counts
    if c.formulation == "blocks":  # one phase: model states, activations in flight, a fixed workspace
        states = float(counts[s] @ prob.state + parts["e_state"][s])
        act = float(counts[s] @ (prob.act * prob.in_flight[s]) + prob.in_flight[s] * parts["e_act"][s])
        row = {k: int(round(v)) for k, v in (("model_states", states), ("activations", act),
                                              ("workspace", prob.workspace))}
        return {**row, "total": sum(row.values()), "phase": "forward/backward"}
    phases = phase_memory(prob, counts)[:, s]
    q = int(np.argmax(phases))
    total = float(phases[q])
    workspace = np.broadcast_to(parts["workspace"], (c.pp,))[s] if q == 0 else prob.phases[q - 1].parts["workspace"][s]
    state = per_stage(prob, prob.option_state)[s]
    if q == 0:
        act = float(counts[s] @ (per_stage(prob, prob.option_act)[s] * prob.in_flight[s])
                    + prob.in_flight[s] * parts["e_act"][s])
        states = total - act - workspace
    else:
        states = float(counts[s] @ state + parts["e_state"][s])
        act = total - states - workspace
    row = {k: int(round(v)) for k, v in (("model_states", states), ("activations", act), ("workspace", workspace))}
    row["total"] = sum(row.values())
    row["phase"] = "forward/backward" if q == 0 else prob.phases[q - 1].name
    return row

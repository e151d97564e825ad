"""The stage program: how many layers of each option each pipeline stage holds.

For one candidate (mesh pp x dp x tp, micro-batch size b, m micro-batches) the model is a prefix (the
groups before the repeated layers: embeddings), L identical layers, and a suffix (final norm, head, loss).
The prefix lives on the first stage and the suffix on the last (as in Megatron-LM). Every layer has
options o (replicate, tensor-parallel ...), each costed per rank: time T_o per micro-batch (forward +
backward + TP communication), model-state bytes W_o, activation bytes A_o per micro-batch, and
after-flush time D_o (its share of the data-parallel gradient all-reduce and the optimizer step).

Because layers are identical only *how many* layers of each option a stage holds matters
(PLANNER-MATH.md, level 2), so the decisions are integers

    h[s, o] >= 0        layers of option o on stage s,  s = 0..p-1

and the program (all linear; HiGHS via cvxpy) is

    minimise   (m - 1) * t_max + sum_s tau_s + d_max                    (1F1B / GPipe step time)
    subject to sum_{s,o} h[s,o] = L                                      add_layer_count_constraint
               sum_o h[s,o] >= 1                         for all s       add_nonempty_stage_constraint
               tau_s = sum_o h[s,o] T_o + E_s + P_s      for all s       (stage time per micro-batch)
               t_max >= tau_s                            for all s       add_bottleneck_constraint
               sum_o h[s,o] (W_o + k_s A_o) + M_s <= C   for all s       add_memory_constraint
               d_max >= sum_o h[s,o] D_o + F_s           for all s       add_flush_constraint
               sum_s h[s,o] >= R_o                       for all o       add_option_use_constraint

E_s, M_s, F_s are the prefix/suffix costs on the first/last stage (plus each stage's transient
workspace in M_s), P_s the point-to-point send of a stage boundary, k_s the micro-batches stage s keeps
in flight (1F1B: min(p - s, m); GPipe: m), C the usable memory of a device. R_o is 1 for the
tensor-parallel option on a mesh with tp > 1 (else 0): a mesh whose tp ranks split no layer would
only duplicate work, which a smaller tp with more data parallelism does strictly better. The objective is the 1F1B
critical path: the slowest stage paces the m - 1 steady-state micro-batches and every stage's own time
is paid once in fill and drain, so the bubble is sum_s tau_s - t_max; the gradient all-reduce and
optimizer step follow the pipeline flush (not overlapped, as in Megatron-LM's pipeline schedule).

The program is exact for identical layers: any order of layers inside a stage has the same cost, and any
counts can be laid out contiguously. With p = 1 it reduces to choosing options under the memory cap.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import cvxpy as cp
import numpy as np


@dataclass
class StageProblem:
    """A framework-neutral stage program; all arrays per option o or per stage s."""

    num_stages: int
    num_layers: int
    num_microbatches: int
    option_time: np.ndarray        # T_o, seconds per micro-batch
    option_state: np.ndarray       # W_o, bytes
    option_act: np.ndarray         # A_o, bytes per micro-batch
    option_flush: np.ndarray       # D_o, seconds
    extra_time: np.ndarray         # E_s (+ P_s)
    extra_mem: np.ndarray          # M_s
    extra_flush: np.ndarray        # F_s
    in_flight: np.ndarray          # k_s
    capacity: float                # C
    option_min_use: np.ndarray | None = None   # R_o
    time_limit_s: float = 10.0


@dataclass
class StageSolution:
    status: str                    # "optimal" | "infeasible" | "time_limit" | ...
    objective: float = float("inf")
    counts: np.ndarray | None = None       # h[s, o]
    stage_time: np.ndarray | None = None   # tau_s
    stage_mem: np.ndarray | None = None
    stage_flush: np.ndarray | None = None
    wall_time_s: float = 0.0
    mip_gap: float | None = None

    @property
    def feasible(self) -> bool:
        return self.counts is not None


def add_layer_count_constraint(h, prob: StageProblem) -> list:
    return [cp.sum(h) == prob.num_layers]


def add_nonempty_stage_constraint(h, prob: StageProblem) -> list:
    return [cp.sum(h, axis=1) >= 1]


def stage_time_expr(h, prob: StageProblem):
    return h @ prob.option_time + prob.extra_time


def add_bottleneck_constraint(h, t_max, prob: StageProblem) -> list:
    return [t_max >= stage_time_expr(h, prob)]


def stage_mem_expr(h, prob: StageProblem):
    # per-stage coefficient W_o + k_s A_o: an (s, o) matrix
    coeff = prob.option_state[None, :] + prob.in_flight[:, None] * prob.option_act[None, :]
    return cp.sum(cp.multiply(h, coeff), axis=1) + prob.extra_mem


def add_memory_constraint(h, prob: StageProblem) -> list:
    return [stage_mem_expr(h, prob) <= prob.capacity]


def add_flush_constraint(h, d_max, prob: StageProblem) -> list:
    return [d_max >= h @ prob.option_flush + prob.extra_flush]


def add_option_use_constraint(h, prob: StageProblem) -> list:
    if prob.option_min_use is None or not prob.option_min_use.any():
        return []
    return [cp.sum(h, axis=0) >= prob.option_min_use]


def solve_stages(prob: StageProblem) -> StageSolution:
    """Solve the stage program with HiGHS; returns counts and per-stage figures, or an infeasible status."""
    p, n_opt = prob.num_stages, len(prob.option_time)
    h = cp.Variable((p, n_opt), integer=True, name="h")
    t_max = cp.Variable(nonneg=True, name="t_max")
    d_max = cp.Variable(nonneg=True, name="d_max")
    constraints = [h >= 0]
    constraints += add_layer_count_constraint(h, prob)
    constraints += add_nonempty_stage_constraint(h, prob)
    constraints += add_bottleneck_constraint(h, t_max, prob)
    constraints += add_memory_constraint(h, prob)
    constraints += add_flush_constraint(h, d_max, prob)
    constraints += add_option_use_constraint(h, prob)
    objective = (prob.num_microbatches - 1) * t_max + cp.sum(stage_time_expr(h, prob)) + d_max
    problem = cp.Problem(cp.Minimize(objective), constraints)
    t0 = time.perf_counter()
    try:
        problem.solve(solver=cp.HIGHS, time_limit=prob.time_limit_s)
    except cp.error.SolverError as e:  # pragma: no cover - solver crash is not a user error
        return StageSolution(status=f"solver_error: {e}", wall_time_s=time.perf_counter() - t0)
    wall = time.perf_counter() - t0
    if h.value is None or problem.status in ("infeasible", "infeasible_inaccurate"):
        return StageSolution(status="infeasible", wall_time_s=wall)
    counts = np.rint(h.value).astype(int)
    stage_time = counts @ prob.option_time + prob.extra_time
    coeff = prob.option_state[None, :] + prob.in_flight[:, None] * prob.option_act[None, :]
    stage_mem = (counts * coeff).sum(axis=1) + prob.extra_mem
    stage_flush = counts @ prob.option_flush + prob.extra_flush
    objective = evaluate(prob, counts)
    gap = _mip_gap(problem)
    status = "optimal" if problem.status == "optimal" else problem.status
    return StageSolution(status=status, objective=objective, counts=counts, stage_time=stage_time,
                         stage_mem=stage_mem, stage_flush=stage_flush, wall_time_s=wall, mip_gap=gap)


def evaluate(prob: StageProblem, counts: np.ndarray) -> float:
    """The objective for given counts (used to check solutions and by brute-force tests)."""
    tau = counts @ prob.option_time + prob.extra_time
    flush = counts @ prob.option_flush + prob.extra_flush
    return float((prob.num_microbatches - 1) * tau.max() + tau.sum() + flush.max())


def fits(prob: StageProblem, counts: np.ndarray) -> bool:
    coeff = prob.option_state[None, :] + prob.in_flight[:, None] * prob.option_act[None, :]
    mem = (counts * coeff).sum(axis=1) + prob.extra_mem
    used = counts.sum(axis=0) >= (prob.option_min_use if prob.option_min_use is not None else 0)
    return bool((mem <= prob.capacity * (1 + 1e-9)).all() and used.all())


def min_memory(prob: StageProblem) -> tuple[float, np.ndarray | None]:
    """The least per-device memory any assignment needs, and the counts that achieve it."""
    p, n_opt = prob.num_stages, len(prob.option_time)
    h = cp.Variable((p, n_opt), integer=True)
    m_max = cp.Variable()
    cons = [h >= 0, *add_layer_count_constraint(h, prob), *add_nonempty_stage_constraint(h, prob),
            m_max >= stage_mem_expr(h, prob), *add_option_use_constraint(h, prob)]
    problem = cp.Problem(cp.Minimize(m_max), cons)
    problem.solve(solver=cp.HIGHS, time_limit=prob.time_limit_s)
    if m_max.value is None:
        return float("inf"), None
    return float(m_max.value), np.rint(h.value).astype(int)


def _mip_gap(problem: cp.Problem) -> float | None:
    stats = problem.solver_stats
    extra = getattr(stats, "extra_stats", None)
    try:
        gap = extra.getInfo().mip_gap if extra is not None else None
    except Exception:
        gap = None
    if gap is None or not np.isfinite(gap):
        return 0.0 if problem.status == "optimal" else None
    return float(gap)

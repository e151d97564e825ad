"""The general stage program: any chain of blocks, each with its own options (PLANNER-MATH.md fallback).

Used when the model is not "a prefix, L identical layers, a suffix" (encoder-decoder models, CNNs, custom
modules): blocks i = 0..B-1 are the OpGraph's groups in topological order (a linear extension of the
DAG, so a contiguous split never sends a tensor backwards), and each block has its own options j
(sharding x recompute x offload, costed like the layer variants). With one-hot binaries

    z[j, s] = 1   block blk(j) runs option j on stage s

the program is

    minimise   (m - 1) t_max + sum_s tau_s + d_max + eps * sum rank_j z[j,s]
    subject to sum_{j in i} sum_s z[j,s] = 1                  for all i    add_assignment_constraint
               x[i,s] = sum_{j in i} z[j,s]
               sum_{s' <= s} x[i+1,s'] <= sum_{s' <= s} x[i,s']  for all i, s (stages never go back:
                                                                          add_contiguity_constraint)
               sum_i x[i,s] >= 1                                for all s    add_nonempty_constraint
               c[i,s] >= x[i,s] - x[i+1,s],  c >= 0             (block i ends stage s: its output is sent)
               tau_s = sum_j z[j,s] T_j + sum_i c[i,s] P_i;  t_max >= tau_s
               sum_j z[j,s] (W_j + k_s A_j) + M <= C            for all s    add_block_memory_constraint
               d_max >= sum_j z[j,s] D_j + F                    for all s
               sum_j z[j,s] (V_j + k_s U_j) <= H                for all s    (host memory)
               sum_{j in R} sum_s z[j,s] >= 1                                (tp > 1 must split a block)
               sum_{j in N} sum_s z[j,s] = n                                 (optional: n blocks fully
                                                                              recomputed, planner.solve.milp)

with P_i the point-to-point time of block i's output (forward and backward), and the other symbols as
in planner.solve.milp. It is exact over its choices (tests compare it with brute-force enumeration); it is
larger than the counting program (B x options x p binaries), so it is used only where that one cannot be.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import numpy as np

from partita.planner.solve.milp import (CUTOFF, FEASIBILITY_RTOL, NODE_LIMIT, SAFETY_TIME_LIMIT_S, StageSolution,
                                  counted_use_errors, has_incumbent, no_solution_status, option_count_constraint)


@dataclass
class BlockProblem:
    num_stages: int
    num_microbatches: int
    block_of: np.ndarray       # blk(j) for every option j
    time: np.ndarray           # T_j, seconds per micro-batch
    state: np.ndarray          # W_j, bytes
    act: np.ndarray            # A_j, bytes per micro-batch
    flush: np.ndarray          # D_j, seconds
    boundary_time: np.ndarray  # P_i for i = 0..B-2
    in_flight: np.ndarray      # k_s
    capacity: float            # C
    workspace: float = 0.0     # M
    flush_latency: float = 0.0  # F
    host_state: np.ndarray | None = None
    host_act: np.ndarray | None = None
    host_capacity: float = float("inf")
    must_use: np.ndarray | None = None
    count_use: tuple[np.ndarray, int] | None = None   # (N, n): exactly n blocks take an option in N
    rank: np.ndarray | None = None
    time_limit_s: float = SAFETY_TIME_LIMIT_S
    mip_rel_gap: float = 5e-3
    node_limit: int = NODE_LIMIT
    """Work and wall-clock limits as planner.solve.milp.StageProblem's (the same plan at any load)."""

    @property
    def num_blocks(self) -> int:
        return int(self.block_of.max()) + 1 if len(self.block_of) else 0


def _selector(prob: BlockProblem) -> np.ndarray:
    sel = np.zeros((prob.num_blocks, len(prob.block_of)))
    sel[prob.block_of, np.arange(len(prob.block_of))] = 1.0
    return sel


def solve_blocks(prob: BlockProblem, cutoff: float | None = None) -> StageSolution:
    """Solve with HiGHS. `counts` in the result is z transposed: (stages x options), 0/1.

    As planner.solve.milp.solve_stages: only a complete assignment within every bound is returned
    (`block_plan_errors`); a solve stopped by its time limit before any incumbent ends as
    TIME_LIMIT_NO_INCUMBENT, and one with nothing better than `cutoff` as CUTOFF, both without counts.
    (The objective has no constant term, so the cutoff is HiGHS's objective_bound as it is, plus the
    largest tie-break term so that no faster plan is cut by it.)
    """
    import cvxpy as cp  # only this program (models without identical layers) is built with cvxpy

    problem, z, t_scale = _block_program(prob)
    opts = {"time_limit": prob.time_limit_s, "mip_rel_gap": prob.mip_rel_gap, "mip_max_nodes": prob.node_limit}
    bounded = cutoff is not None and bool(np.isfinite(cutoff))
    if bounded:
        tie_break = 1e-7 * float(prob.rank.max()) if prob.rank is not None and prob.rank.any() else 0.0
        opts["objective_bound"] = cutoff / t_scale + tie_break
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        problem.solve(solver=cp.HIGHS, **opts)
    wall = time.perf_counter() - t0
    counts = np.rint(z.value).astype(int).T if z.value is not None and has_incumbent(problem) else None
    if counts is None or block_plan_errors(prob, counts):
        return StageSolution(status=no_solution_status(problem.status, bounded), wall_time_s=wall)
    if bounded and evaluate_blocks(prob, counts) >= cutoff * (1 - 1e-9):  # no better than the incumbent
        return StageSolution(status=CUTOFF, wall_time_s=wall)
    extra = getattr(problem.solver_stats, "extra_stats", None)
    gap = getattr(extra, "mip_gap", None)
    gap = float(gap) if gap is not None and np.isfinite(gap) else (0.0 if problem.status == "optimal" else None)
    return StageSolution(status="optimal" if problem.status == "optimal" else "time_limit",
                         objective=evaluate_blocks(prob, counts), counts=counts,
                         stage_time=stage_times(prob, counts), stage_mem=stage_memory(prob, counts),
                         stage_flush=counts @ prob.flush + prob.flush_latency, wall_time_s=wall, mip_gap=gap)


def _block_program(prob: BlockProblem):
    """(the cvxpy problem of the module docstring, scaled: times by the largest, memory by the capacity; its z
    variable; the time scale)."""
    import cvxpy as cp

    p, J, B = prob.num_stages, len(prob.block_of), prob.num_blocks
    t_scale = max(float(prob.time.max(initial=0)), float(prob.boundary_time.max(initial=0)), 1e-30)
    m_scale = prob.capacity if prob.capacity > 0 else 1.0
    h_scale = prob.host_capacity if np.isfinite(prob.host_capacity) and prob.host_capacity > 0 else 1.0
    T, W, A, D = prob.time / t_scale, prob.state / m_scale, prob.act / m_scale, prob.flush / t_scale
    P = prob.boundary_time / t_scale
    k = prob.in_flight
    z = cp.Variable((J, p), boolean=True)
    x = _selector(prob) @ z                       # (B, p)
    t_max, d_max = cp.Variable(nonneg=True), cp.Variable(nonneg=True)
    cons = [cp.sum(x, axis=1) == 1, cp.sum(x, axis=0) >= 1]           # assignment, nonempty stages
    cut = None
    if B > 1 and p > 1:
        upper = np.triu(np.ones((p, p)))          # y = x @ upper: y[i, s] = sum_{s' <= s} x[i, s']
        y = x @ upper
        cons.append(y[1:, :] <= y[:-1, :])        # contiguity
        cut = cp.Variable((B - 1, p), nonneg=True)
        cons.append(cut >= x[:-1, :] - x[1:, :])
    tau = z.T @ T + (cut.T @ P if cut is not None else 0)
    cons.append(t_max >= tau)
    coeff_mem = W[:, None] + A[:, None] * k[None, :]                  # (J, p)
    cons.append(cp.sum(cp.multiply(z, coeff_mem), axis=0) + prob.workspace / m_scale <= prob.capacity / m_scale)
    cons.append(d_max >= z.T @ D + prob.flush_latency / t_scale)
    if prob.host_state is not None and np.isfinite(prob.host_capacity):
        coeff_host = prob.host_state[:, None] / h_scale + prob.host_act[:, None] * k[None, :] / h_scale
        cons.append(cp.sum(cp.multiply(z, coeff_host), axis=0) <= prob.host_capacity / h_scale)
    if prob.must_use is not None and prob.must_use.any():
        cons.append(cp.sum(z[np.flatnonzero(prob.must_use), :]) >= 1)
    cons += option_count_constraint(prob.count_use, lambda idx: cp.sum(z[idx, :]))
    objective = (prob.num_microbatches - 1) * t_max + cp.sum(tau) + d_max
    if prob.rank is not None and prob.rank.any():
        objective = objective + 1e-7 * cp.sum(z.T @ prob.rank) / max(1, B)
    return cp.Problem(cp.Minimize(objective), cons), z, t_scale


def assignment(prob: BlockProblem, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(stage of each block, option of each block) from a (stages x options) 0/1 matrix."""
    stage = np.zeros(prob.num_blocks, dtype=int)
    option = np.zeros(prob.num_blocks, dtype=int)
    for s, j in zip(*np.nonzero(counts)):
        stage[prob.block_of[j]], option[prob.block_of[j]] = s, j
    return stage, option


def stage_p2p(prob: BlockProblem, counts: np.ndarray) -> np.ndarray:
    stage, _ = assignment(prob, counts)
    out = np.zeros(prob.num_stages)
    for i in range(prob.num_blocks - 1):
        if stage[i + 1] != stage[i]:
            out[stage[i]] += prob.boundary_time[i]
    return out


def stage_times(prob: BlockProblem, counts: np.ndarray) -> np.ndarray:
    return counts @ prob.time + stage_p2p(prob, counts)


def stage_memory(prob: BlockProblem, counts: np.ndarray) -> np.ndarray:
    return (counts * (prob.state[None, :] + prob.in_flight[:, None] * prob.act[None, :])).sum(1) + prob.workspace


def evaluate_blocks(prob: BlockProblem, counts: np.ndarray) -> float:
    tau = stage_times(prob, counts)
    flush = counts @ prob.flush + prob.flush_latency
    return float((prob.num_microbatches - 1) * tau.max() + tau.sum() + flush.max())


def host_bytes_blocks(prob: BlockProblem, counts: np.ndarray) -> np.ndarray:
    """Per stage, the host memory of `counts`: sum_j z[j,s] (V_j + k_s U_j) (zeros without host options)."""
    if prob.host_state is None:
        return np.zeros(len(counts))
    return (counts * (prob.host_state[None, :] + prob.in_flight[:, None] * prob.host_act[None, :])).sum(1)


def fits_blocks(prob: BlockProblem, counts: np.ndarray, rtol: float = 1e-9) -> bool:
    if (stage_memory(prob, counts) > prob.capacity * (1 + rtol)).any():
        return False
    if prob.host_state is not None and np.isfinite(prob.host_capacity):
        if (host_bytes_blocks(prob, counts) > prob.host_capacity * (1 + rtol)).any():
            return False
    if prob.must_use is not None and prob.must_use.any() and counts[:, prob.must_use].sum() < 1:
        return False
    return True


def block_plan_errors(prob: BlockProblem, counts: np.ndarray) -> list[str]:
    """Why a (stages x options) 0/1 matrix is not a plan of the block program; empty when it is one.
    A plan runs every block i on exactly one option and stage (sum_{j in i} sum_s z[j,s] = 1), leaves
    no stage empty, keeps stages in order along the chain (contiguity), and `fits_blocks` (memory and
    host memory within capacity up to FEASIBILITY_RTOL, a tensor-parallel option used where required)."""
    shape = (prob.num_stages, len(prob.block_of))
    if counts.shape != shape:
        return [f"counts have shape {counts.shape}, not (stages, options) = {shape}"]
    if ((counts != 0) & (counts != 1)).any():
        return ["assignment entries other than 0 and 1"]
    per_block = counts.sum(axis=0) @ _selector(prob).T
    errors = []
    if (per_block != 1).any():
        errors.append(f"{int((per_block == 1).sum())} of {prob.num_blocks} blocks placed exactly once")
        return errors  # stage order below needs one stage per block
    if (counts.sum(axis=1) < 1).any():
        errors.append(f"stage(s) {', '.join(map(str, np.flatnonzero(counts.sum(axis=1) < 1)))} hold no block")
    stage, _ = assignment(prob, counts)
    if (np.diff(stage) < 0).any():
        errors.append("a block runs on an earlier stage than the block before it")
    if not fits_blocks(prob, counts, rtol=FEASIBILITY_RTOL):
        errors.append("memory over capacity (device or host), or no tensor-parallel block on a tp > 1 mesh")
    return errors + counted_use_errors(prob.count_use, counts)

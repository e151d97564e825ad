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

and the program (all linear; HiGHS solves it, planner.solve.stage_matrix writes it as one sparse matrix) is

    minimise   (m - 1/v) * t_max + sum_s tau_s / v + d_max               (pipeline step time)
    subject to sum_{s,o} h[s,o] = L
               sum_o h[s,o] >= v                         for all s
               tau_s = sum_o h[s,o] T_o + E_s + P_s      for all s       (stage time per micro-batch)
               t_max >= tau_s                            for all s
               sum_o h[s,o] (W_o + k_s A_o) + M_s <= C   for all s
               sum_o h[s,o] X^q_so + Y^q_s <= C          for all s, q    (the other memory phases q)
               d_max >= sum_o h[s,o] D_o + F_s           for all s
               sum_s sum_{o in R} h[s,o] >= 1
               sum_s sum_{o in N} h[s,o] = n
               sum_o h[s,o] (V_o + k_s U_o) <= H         for all s
               sum_o h[s,o] = n_s                        for all s       (optional: a pinned split)

E_s, M_s, F_s are the prefix/suffix costs on the first/last stage (plus each stage's transient
workspace in M_s), P_s the point-to-point send of a stage boundary, k_s the micro-batches stage s keeps
in flight (each schedule's `in_flight` in planner/plan/schedules.py, which also says where each count comes
from), C the usable memory of a device; V_o, U_o and H the
same for host memory (offloaded optimizer state, offloaded activations per micro-batch, the host memory
per device). R is the set of
tensor-parallel options on a mesh with tp > 1 (empty otherwise): a mesh whose tp ranks split no layer
would only duplicate work, which a smaller tp with more data parallelism does strictly better. N and n
(optional) fix how many layers take the options in N: the layers with full recompute when a user fixes
their number (SearchSpace.full_recompute_layers, Megatron-LM's --recompute-num-layers). n_s (optional) pins
the layers of each stage (SearchSpace.stage_layers, Megatron-LM's --decoder-first-pipeline-num-layers): the
options within each stage are still chosen. The objective is the 1F1B
critical path: the slowest stage paces the m - 1 steady-state micro-batches and every stage's own time
is paid once in fill and drain, so the bubble is sum_s tau_s - t_max; the gradient all-reduce and
optimizer step follow the pipeline flush (not overlapped, as in Megatron-LM's pipeline schedule).

With the interleaved 1F1B schedule (Narayanan et al. SC'21) each device runs v model chunks and the
fill/drain shrinks v-fold: the step is m t_max + (sum_s tau_s - t_max) / v; every device needs at least
v layers (one per chunk). v = 1 is plain 1F1B.

Heterogeneous clusters (resource lists with groups of different devices): stage s runs on the devices
of one group, so T, W, A, D may be given per stage (arrays of shape (p, options)) and C per stage; the
program is otherwise unchanged.

Memory is checked at each moment a peak can occur (the phases q of a step; planner.search builds them).
The main constraint above is the forward/backward peak, where W_o leaves out the gradients when a stage
reaches its first backward before any gradient exists; other phases (the optimizer step; a recomputed
layer being rebuilt) have coefficients X^q and constants Y^q of their own. A phase may be *gated* by a
set of options G^q (recompute): it binds on stage s only if s holds one of them, through a binary
y_s >= h[s,o] / L for o in G^q and a big-M relaxation  sum_o h X^q + Y^q <= C + (1 - y_s) M^q.
A stage's predicted memory is the largest phase that applies to it.

The program is exact for identical layers: any order of layers inside a stage has the same cost, and any
counts can be laid out contiguously. With p = 1 it reduces to choosing options under the memory cap.
"""
from __future__ import annotations

import dataclasses
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from partita.planner.solve.highs import silence_banner
from partita.planner.solve.bounds import stage_bound
from partita.planner.solve.stage_matrix import (
    GOOD_ENOUGH, TIE_BREAK, mem_coeff, per_stage, solve_cvxpy, solve_highs, stage_matrix,
)

HIGHS, CBC = "HIGHS", "CBC"
"""Solver names as cvxpy spells them (cvxpy.HIGHS, cvxpy.CBC): the stage program goes to HiGHS directly, and
cvxpy is imported only for another backend (planner.solve.stage_matrix.solve_cvxpy) -- a plan does not pay its ~1 s
import."""

silence_banner()  # before any solve: the banner would land on `partita plan --json`'s stdout


@dataclass
class MemoryPhase:
    """Another moment of the step at which a stage's memory peaks (module docstring)."""

    name: str
    coeff: np.ndarray              # X[s, o] (or X[o]): bytes per layer of option o
    const: np.ndarray              # Y[s]: bytes
    gate: np.ndarray | None = None # options whose presence on a stage makes the phase bind there
    parts: dict = field(default_factory=dict)   # per-stage constants by category, for the report
    reserved_only: bool = False
    """A bound on what the allocator reserves beside an allocation (its cache), not an allocation: it
    constrains the stage like any phase, but the predicted peak (planner.estimate.phases.stage_memory) is the
    largest of the others."""

    def scaled(self, m: float) -> "MemoryPhase":
        return MemoryPhase(self.name, np.asarray(self.coeff) / m, np.asarray(self.const) / m, self.gate, self.parts,
                           self.reserved_only)


NODE_LIMIT = 2000
"""Branch-and-bound nodes one stage program may take (HiGHS's mip_max_nodes): the limit by work that makes a
plan the same on any machine at any load. The programs of benchmarks.planner_speed's cases take at most 7
(measured with a 60 s wall-clock limit: every one then ends within its gap, the slowest in 2.7 s on a loaded
2-core machine); a program that reaches this many returns its incumbent ("time_limit" status, its gap said)."""
SAFETY_TIME_LIMIT_S = 60.0
"""The wall-clock limit of one stage program: only a guard against a stuck solve. It was the limit (3 s) until
issue 44: llama3-405b on 8,192 GPUs solved 70 candidates at load 12 and 53 at load 4, and llama3-70b on 64
GPUs changed in the fifth digit between runs. A plan that meets it says so (solver.load_dependent)."""


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
    virtual_stages: int = 1        # v (interleaved 1F1B); 1 for 1F1B and GPipe
    must_use: np.ndarray | None = None   # R, a boolean mask over options
    count_use: tuple[np.ndarray, int] | None = None   # (N, n): exactly n layers take an option in N
    stage_layers: np.ndarray | None = None   # n_s: stage s holds exactly n_s layers (a pinned split)
    option_host_state: np.ndarray | None = None   # V_o, bytes
    option_host_act: np.ndarray | None = None     # U_o, bytes per micro-batch
    host_capacity: float = float("inf")           # H
    phases: list = field(default_factory=list)     # MemoryPhase, beyond the main one
    option_grad: np.ndarray | None = None          # G_o: the gradient bytes within W_o
    grads_absent: np.ndarray | None = None         # chi_s = 1: no gradient yet at stage s's main peak
    option_rank: np.ndarray | None = None
    """Tie-break weights (recompute / offload machinery): epsilon * sum h * rank is added to the objective
    so that among equally fast plans the plainest wins; epsilon is far below the mip gap."""

    def scaled(self) -> "StageProblem":
        """The same program in units where the capacity and the largest time are 1 (HiGHS is sensitive
        to coefficients spanning 1e-4 s to 1e11 bytes: unscaled it reports inaccurate solutions)."""
        t = max(float(self.option_time.max(initial=0)), float(self.extra_time.max(initial=0)),
                float(self.option_flush.max(initial=0)), 1e-30)
        m = float(np.max(self.capacity)) if np.max(self.capacity) > 0 else 1.0
        hmax = float(np.max(self.host_capacity))
        hm = hmax if np.isfinite(hmax) and hmax > 0 else 1.0
        return StageProblem(
            num_stages=self.num_stages, num_layers=self.num_layers, num_microbatches=self.num_microbatches,
            virtual_stages=self.virtual_stages,
            option_time=self.option_time / t, option_state=self.option_state / m, option_act=self.option_act / m,
            option_flush=self.option_flush / t, extra_time=self.extra_time / t, extra_mem=self.extra_mem / m,
            extra_flush=self.extra_flush / t, in_flight=self.in_flight, capacity=self.capacity / m,
            time_limit_s=self.time_limit_s, mip_rel_gap=self.mip_rel_gap, node_limit=self.node_limit,
            must_use=self.must_use,
            count_use=self.count_use, stage_layers=self.stage_layers,
            option_host_state=None if self.option_host_state is None else self.option_host_state / hm,
            option_host_act=None if self.option_host_act is None else self.option_host_act / hm,
            host_capacity=self.host_capacity / hm, option_rank=self.option_rank,
            phases=[q.scaled(m) for q in self.phases],
            option_grad=None if self.option_grad is None else self.option_grad / m, grads_absent=self.grads_absent)
    time_limit_s: float = SAFETY_TIME_LIMIT_S
    mip_rel_gap: float = 5e-3
    """Stop when the incumbent is proven within this fraction of the optimum (0: exact). 0.5% is well
    inside the cost model's own error and keeps deep pipelines with many layer variants at ~0.1 s."""
    node_limit: int = NODE_LIMIT


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
        """True only for a complete assignment within every bound (the solvers check it: `plan_errors`)."""
        return self.counts is not None


TIME_LIMIT_NO_INCUMBENT = "time_limit_no_incumbent"
"""Status of a solve stopped by a limit (its NODE_LIMIT, or the SAFETY_TIME_LIMIT_S guard) before it found any
assignment; "time_limit" names a solve stopped by either with an incumbent. (HiGHS then still hands
back values for the variables, which are not a solution: all zeros, no layer placed.)"""
CUTOFF = "cutoff"
"""Status of a solve with a cutoff that found no assignment better than it (not better than the
incumbent plan; infeasible programs solved with a cutoff end here too)."""
FEASIBILITY_RTOL = 1e-6
"""Relative slack when checking a solver's rounded assignment against the memory capacities: HiGHS
meets each row to a feasibility tolerance of 1e-7 on the scaled program (capacity 1), and rounding
counts that are integral to 1e-6 moves a row by about as much; 1e-6 of 80 GB is 80 kB."""


def no_solution_status(solver_status: str, cutoff_given: bool) -> str:
    """The status of a solve whose result is not a plan (no assignment, or one that `is_plan` rejects).

    cvxpy reports HiGHS's kTimeLimit as "user_limit" (so are the solution limit, which the node limit
    raises, and the iteration and objective limits) and hands back whatever the variables hold: the time limit with
    no incumbent. HiGHS ends a program with nothing below its objective bound as "infeasible", which
    with a cutoff means no assignment beats the incumbent. An "optimal" assignment that breaks a bound
    after rounding is a numerically inaccurate solve.
    """
    if solver_status == "user_limit":
        return TIME_LIMIT_NO_INCUMBENT
    if solver_status in ("infeasible", "infeasible_inaccurate"):
        return CUTOFF if cutoff_given else "infeasible"
    return "inaccurate" if solver_status in ("optimal", "optimal_inaccurate") else solver_status


def option_count_constraint(count_use: tuple[np.ndarray, int] | None, total_of) -> list:
    """sum_{o in N} (layers or blocks taking o) = n, for both stage programs: `total_of(indices)` sums the
    program's assignment variables over those options. With no option in N the sum is empty (0)."""
    if count_use is None:
        return []
    mask, n = count_use
    if mask.any():
        return [total_of(np.flatnonzero(mask)) == n]
    import cvxpy as cp  # the programs built with cvxpy (planner.solve.milp_blocks) are the only callers
    return [cp.Constant(0) == n]


def counted_use_errors(count_use: tuple[np.ndarray, int] | None, counts: np.ndarray) -> list[str]:
    """Why `counts` (stages x options) breaks the count fixed by `count_use`; empty when it keeps it."""
    if count_use is None:
        return []
    mask, n = count_use
    used = int(counts[:, mask].sum()) if mask.any() else 0
    return [] if used == n else [f"{used} layers take the counted options, not {n}"]


def solve_stages(original: StageProblem, cutoff: float | None = None, solver: str = HIGHS) -> StageSolution:
    """Solve the stage program with HiGHS; returns counts and per-stage figures, or a status saying why not.

    `cutoff` (seconds) is the best step time already known: branches that cannot beat it are pruned
    (HiGHS's objective_bound, in HiGHS's own units: `highs_objective_bound`), and a program with no
    solution better than it ends as "cutoff" (CUTOFF), never as "optimal" with a worse one.
    Only a complete assignment within every bound is returned (`plan_errors`); a solve stopped by its
    time limit before any incumbent is TIME_LIMIT_NO_INCUMBENT with no counts. Otherwise the status is
    the solver's: "optimal" (within mip_rel_gap) or "time_limit" (an incumbent; its gap in mip_gap).
    "Within mip_rel_gap" is proven either by HiGHS's own dual bound or by planner.solve.bounds' whole-layer bound
    on a pipeline: HiGHS stops at the first incumbent within the gap of the latter (solve_highs's `good_enough`).
    HiGHS's relaxation is weaker on deep pipelines: on llama3-405b / 8,192 H100s it found the plan at node 0 and
    took 1,332 nodes (1.5 s) to prove it within 0.5%, which the whole-layer bound (0.09% below) proves at once.
    The program goes to HiGHS as one sparse matrix (planner.solve.stage_matrix); `solver` is a cvxpy solver name
    for another backend (`CBC`, which benchmarks/solver.py compares): it gets the same matrices, time
    limit and relative gap, and no cutoff (its result is still checked against it).
    """
    bounded = cutoff is not None and bool(np.isfinite(cutoff))
    if cannot_fit(original):  # as HiGHS would end it, without building the program
        return StageSolution(status=no_solution_status("infeasible", bounded))
    prob = original.scaled()
    t_scale = float(original.option_time.max(initial=0)) / float(prob.option_time.max(initial=0)) \
        if prob.option_time.max(initial=0) > 0 else 1.0
    m = stage_matrix(prob)
    t0 = time.perf_counter()
    if solver == HIGHS:
        bound = None
        if bounded:
            rank = prob.option_rank if prob.option_rank is not None and prob.option_rank.any() else np.zeros(1)
            bound = highs_objective_bound(cutoff / t_scale, m.offset, TIE_BREAK * float(rank.max()))
        proven = stage_bound(original, whole=True) if original.num_stages > 1 else 0.0
        enough = proven / (1 - prob.mip_rel_gap) / t_scale - m.offset if 0 < proven < np.inf else None
        result = solve_highs(m, prob.time_limit_s, prob.mip_rel_gap, bound, prob.node_limit, enough)
    else:
        import cvxpy as cp
        with warnings.catch_warnings():  # a time-limited incumbent is expected; its gap is reported
            warnings.simplefilter("ignore", UserWarning)
            try:
                result = solve_cvxpy(m, solver, _solver_options(solver, prob))
            except cp.error.SolverError as e:  # pragma: no cover - solver crash is not a user error
                return StageSolution(status=f"solver_error: {e}", wall_time_s=time.perf_counter() - t0)
    wall = time.perf_counter() - t0
    counts = m.counts(result.x) if result.x is not None else None
    if counts is None or plan_errors(original, counts):
        return StageSolution(status=no_solution_status(result.status, bounded), wall_time_s=wall)
    prob = original
    objective = evaluate(prob, counts)
    if bounded and objective >= cutoff * (1 - 1e-9):  # found, but no better than the incumbent
        return StageSolution(status=CUTOFF, wall_time_s=wall)
    stage_time, stage_mem, stage_flush = stage_figures(prob, counts)
    status, gap = ("optimal", result.mip_gap) if result.status == "optimal" else ("time_limit", result.mip_gap)
    if result.status == GOOD_ENOUGH:  # within the gap of planner.solve.bounds' whole-layer bound
        status, gap = "optimal", max(0.0, 1 - proven / objective)
    return StageSolution(status=status, objective=objective, counts=counts, stage_time=stage_time,
                         stage_mem=stage_mem, stage_flush=stage_flush, wall_time_s=wall, mip_gap=gap)


POLISH_NODE_LIMIT = 200
"""The tie-breaking solve only simplifies a plan already found (its incumbent is checked no slower): it gets
a small node limit, and on a deep pipeline with many options returns the best simplification found. (It had a
0.5 s wall-clock limit, which it met at the root on a loaded machine: the plan depended on the load.)"""


def polish(original: StageProblem, solution: StageSolution) -> StageSolution:
    """Among assignments no slower than `solution`, the one with the least recompute/offload machinery.

    The main solve stops within mip_rel_gap and only breaks ties by a tiny epsilon, so it may keep an
    offload or recompute that buys nothing; this second, lexicographic solve removes it. It keeps the solution's
    split of layers over stages and re-chooses the options within each stage: so held, it solves at the root.
    Free to move layers too, it took 200 branch-and-bound nodes and 2 s on llama3-405b / 8,192 H100s without
    finding even the solution it started from, and changed no plan of benchmarks.planner_speed that the held one
    does not (the held one also simplifies llama3-405b on 8,192 and 16,384 GPUs, which the free one did not).
    """
    if original.option_rank is None or not original.option_rank.any() or not solution.feasible:
        return solution
    held = original if original.stage_layers is not None else \
        dataclasses.replace(original, stage_layers=solution.counts.sum(axis=1))
    prob = held.scaled()
    t_scale = float(original.option_time.max(initial=0)) / float(prob.option_time.max(initial=0)) \
        if prob.option_time.max(initial=0) > 0 else 1.0
    m = stage_matrix(prob, step_bound=solution.objective / t_scale * (1 + 1e-9), objective="rank")
    # the tie-break solve at HiGHS's default gap
    result = solve_highs(m, prob.time_limit_s, None, node_limit=POLISH_NODE_LIMIT)
    if result.x is None:
        return solution
    counts = m.counts(result.x)
    if plan_errors(original, counts) or evaluate(original, counts) > solution.objective * (1 + 1e-9):
        return solution
    o = original
    tau, mem, flush = stage_figures(o, counts)
    return StageSolution(status=solution.status, objective=evaluate(o, counts), counts=counts,
                         stage_time=tau, stage_mem=mem, stage_flush=flush,
                         wall_time_s=solution.wall_time_s, mip_gap=solution.mip_gap)


def highs_objective_bound(cutoff: float, constant: float, tie_break: float) -> float:
    """HiGHS's objective_bound for a cutoff, all in the scaled program's time units.

    HiGHS is handed the objective without its constant term (planner.solve.stage_matrix adds it back, as cvxpy
    does: an offset), while HiGHS compares objective_bound with its own objective. The stage program's constant is
    sum_s E_s / v (each stage's fixed time, paid once in fill and drain), so a cutoff
    c on the step time is the bound c - sum_s E_s / v; passing c itself let through assignments up to
    sum_s E_s / v slower than the incumbent, which then ended "optimal". The tie-break term
    eps * sum h rank <= `tie_break` is added so that a plan faster than c is never cut by it.
    """
    return cutoff - constant + tie_break


def has_incumbent(problem) -> bool:
    """False when the solver says it has no primal solution (HiGHS's primal_solution_status: 2 is
    feasible); cvxpy still fills the variables then. True when the solver does not say (CBC)."""
    extra = getattr(problem.solver_stats, "extra_stats", None)
    status = getattr(extra, "primal_solution_status", None)
    return status is None or int(status) == 2


def _solver_options(solver: str, prob: StageProblem) -> dict:
    """The time limit and relative gap in the option names of each backend."""
    if solver == HIGHS:
        return {"time_limit": prob.time_limit_s, "mip_rel_gap": prob.mip_rel_gap}
    if solver == CBC:
        return {"maximumSeconds": prob.time_limit_s, "allowableFractionGap": prob.mip_rel_gap}
    return {}


def stage_figures(prob: StageProblem, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(stage time, stage memory, stage flush) of an assignment."""
    tau = (counts * per_stage(prob, prob.option_time)).sum(1) + prob.extra_time
    mem = phase_memory(prob, counts).max(axis=0)
    flush = (counts * per_stage(prob, prob.option_flush)).sum(1) + prob.extra_flush
    return tau, mem, flush


def phase_memory(prob: StageProblem, counts: np.ndarray) -> np.ndarray:
    """Memory of each stage in each phase (main phase first), -inf where a gated phase does not apply."""
    rows = [(counts * mem_coeff(prob)).sum(1) + prob.extra_mem]
    for q in prob.phases:
        mem = (counts * per_stage(prob, q.coeff)).sum(1) + q.const
        if q.gate is not None:
            mem = np.where(counts[:, q.gate].sum(1) > 0 if q.gate.any() else False, mem, -np.inf)
        rows.append(mem)
    return np.array(rows)


def cannot_fit(prob: StageProblem) -> bool:
    """True when no assignment can meet the memory rows, by a bound that needs no solver: on each stage s
    every layer costs at least the cheapest option's coefficient in each ungated memory phase (the main one
    and the others), so stage s holds at most floor((C_s - constant) / that) layers by each phase; if those
    most-layers add up to fewer than L, or a stage cannot hold the v layers it must, nothing fits. A necessary
    condition only (it drops the gated phases, host memory and the counted options): a program it refuses is
    infeasible, one it lets through is solved. On GPT-3 175B over 64 A100s 1,695 of the 1,802 programs the
    search solved were infeasible, each a HiGHS run of ~20 ms; this check takes ~0.1 ms."""
    if prob.num_layers <= 0:
        return False
    cap = np.broadcast_to(np.asarray(prob.capacity, dtype=float), (prob.num_stages,)) * (1 + 1e-6)
    rows = [(mem_coeff(prob), np.asarray(prob.extra_mem, dtype=float))]
    rows += [(per_stage(prob, q.coeff), np.asarray(q.const, dtype=float)) for q in prob.phases if q.gate is None]
    most = np.full(prob.num_stages, float(prob.num_layers))
    for coeff, const in rows:
        room = cap - np.broadcast_to(const, (prob.num_stages,))
        least = coeff.min(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            by_phase = np.where(least > 0, np.floor(room / np.where(least > 0, least, 1.0) + 1e-9),
                                np.where(room >= 0, np.inf, -1.0))
        most = np.minimum(most, by_phase)
    least_held = prob.virtual_stages if prob.stage_layers is None else np.asarray(prob.stage_layers)
    return bool((most < least_held).any() or most.sum() < prob.num_layers)


def evaluate(prob: StageProblem, counts: np.ndarray) -> float:
    """The objective for given counts (used to check solutions and by brute-force tests)."""
    tau, _, flush = stage_figures(prob, counts)
    v = prob.virtual_stages
    return float((prob.num_microbatches - 1 / v) * tau.max() + tau.sum() / v + flush.max())


def host_bytes(prob: StageProblem, counts: np.ndarray) -> np.ndarray:
    """Per stage, the host memory of `counts`: sum_o h[s,o] (V_o + k_s U_o) (zeros without host options)."""
    if prob.option_host_state is None:
        return np.zeros(len(counts))
    return (counts * (per_stage(prob, prob.option_host_state)
                      + prob.in_flight[:, None] * per_stage(prob, prob.option_host_act))).sum(1)


def fits(prob: StageProblem, counts: np.ndarray, rtol: float = 1e-9) -> bool:
    """Every memory phase and the host memory within capacity (to a relative `rtol`), and a
    tensor-parallel option used where one must be."""
    _, mem, _ = stage_figures(prob, counts)
    if prob.option_host_state is not None and np.all(np.isfinite(prob.host_capacity)):
        if (host_bytes(prob, counts) > prob.host_capacity * (1 + rtol)).any():
            return False
    used = prob.must_use is None or not prob.must_use.any() or counts[:, prob.must_use].sum() >= 1
    return bool((mem <= prob.capacity * (1 + rtol)).all() and used)


def assignment_errors(prob: StageProblem, counts: np.ndarray) -> list[str]:
    """Why `counts` is not a complete assignment; empty when it is one: h >= 0 of shape (stages,
    options) placing every layer, sum_{s,o} h[s,o] = L, with no stage holding fewer than v layers
    (when L > 0), and the count fixed by `count_use` kept."""
    shape = (prob.num_stages, prob.option_time.shape[-1])
    if counts.shape != shape:
        return [f"counts have shape {counts.shape}, not (stages, options) = {shape}"]
    errors = []
    if (counts < 0).any():
        errors.append("negative layer counts")
    if int(counts.sum()) != prob.num_layers:
        errors.append(f"{int(counts.sum())} of {prob.num_layers} layers placed")
    short = np.flatnonzero(counts.sum(axis=1) < prob.virtual_stages) if prob.num_layers else []
    if len(short):
        errors.append(f"stage(s) {', '.join(map(str, short))} hold fewer than {prob.virtual_stages} layer(s)")
    if prob.stage_layers is not None and not np.array_equal(counts.sum(axis=1), prob.stage_layers):
        errors.append(f"stages hold {counts.sum(axis=1).tolist()} layers, not the pinned {list(prob.stage_layers)}")
    return errors + counted_use_errors(prob.count_use, counts)


def plan_errors(prob: StageProblem, counts: np.ndarray) -> list[str]:
    """Why `counts` is not a plan of the stage program; empty when it is one: a complete assignment
    (`assignment_errors`) that `fits` (every memory phase and the host memory within capacity, up to
    FEASIBILITY_RTOL, and a tensor-parallel option used on a tp > 1 mesh)."""
    errors = assignment_errors(prob, counts)
    if not errors and not fits(prob, counts, rtol=FEASIBILITY_RTOL):
        errors.append("memory over capacity (device or host), or no tensor-parallel layer on a tp > 1 mesh")
    return errors


def min_memory(original: StageProblem) -> tuple[float, np.ndarray | None]:
    """The least per-device memory any assignment needs, and the counts that achieve it."""
    prob = original.scaled()
    m = stage_matrix(prob, memory_bound=True, objective="memory")
    result = solve_highs(m, prob.time_limit_s, prob.mip_rel_gap, node_limit=prob.node_limit)
    if result.x is None or assignment_errors(original, m.counts(result.x)):
        return float("inf"), None
    return float(result.x[m.m_max]) * float(np.max(original.capacity)) / float(np.max(prob.capacity)), \
        m.counts(result.x)

"""The stage program of planner.solve.milp as one sparse matrix, the form HiGHS takes: every row of milp's module
docstring written out once, here, and handed to HiGHS directly (or to cvxpy as A x within bounds, for CBC).

Why not build it with cvxpy expressions: the search solves this program for every candidate that survives
its lower bound (about 1,800 times for GPT-3 175B on 64 A100s), and cvxpy's canonicalisation of the
expression tree took about 85% of each solve's time (31 of 36 ms; HiGHS itself 3 ms).

Columns, in this order (x):
    h[s, o]       s*n + o            layers of option o on stage s          integer, 0..L
    y[q, s]       after h            stage s holds an option of gated phase q    binary
    t_max, d_max  after y            the bottleneck and the flush           continuous, >= 0
    m_max         last, if asked     the memory bound (milp.min_memory)     continuous, free

Rows (lower <= a x <= upper), as milp's docstring names them:
    sum_{s,o} h = L                                                   layer count
    sum_o h[s,o] >= v                                 each s          non-empty stage (L > 0)
    sum_o T[s,o] h[s,o] - t_max <= -E_s               each s          bottleneck
    sum_o (W - chi G + k A)[s,o] h[s,o] <= C_s - M_s  each s          main memory phase
    sum_o X^q[s,o] h[s,o] <= C_s - Y^q_s              each s, q       other memory phases
      gated ones: L y[q,s] - sum_{o in G^q} h[s,o] >= 0  and  sum_o X^q h + B^q_s y[q,s] <= C_s - Y^q_s + B^q_s
    sum_o D[s,o] h[s,o] - d_max <= -F_s               each s          flush
    sum_{s, o in R} h >= 1                                            a tensor-parallel option used
    sum_{s, o in N} h = n                                             counted options
    sum_o (V + k U)[s,o] h[s,o] <= H_s                each s          host memory
With `memory_bound`, every memory row's capacity C_s becomes the column m_max (a_row - m_max <= -const).

Objective: (m - 1/v) t_max + sum_{s,o} T[s,o] h[s,o] / v + d_max + eps sum h rank / L, plus the constant
sum_s E_s / v (`offset`), which is left out of what HiGHS sees (milp.highs_objective_bound).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TIE_BREAK = 1e-7
"""epsilon of the tie-break term (milp.StageProblem.option_rank)."""


def per_stage(prob, a: np.ndarray) -> np.ndarray:
    """An option cost as a (stages x options) matrix: per-stage costs as given, shared ones repeated."""
    a = np.asarray(a, dtype=float)
    return a if a.ndim == 2 else np.broadcast_to(a, (prob.num_stages, a.shape[-1]))


def mem_coeff(prob) -> np.ndarray:
    """W[s,o] - chi_s G[s,o] + k_s A[s,o] (the main, forward/backward phase)."""
    coeff = per_stage(prob, prob.option_state) + prob.in_flight[:, None] * per_stage(prob, prob.option_act)
    if prob.option_grad is not None and prob.grads_absent is not None:
        coeff = coeff - np.asarray(prob.grads_absent, dtype=float)[:, None] * per_stage(prob, prob.option_grad)
    return coeff


@dataclass
class StageMatrix:
    cost: np.ndarray
    offset: float
    start: np.ndarray       # row-wise sparse matrix: row r's entries are index/value[start[r]:start[r+1]]
    index: np.ndarray
    value: np.ndarray
    row_lower: np.ndarray
    row_upper: np.ndarray
    col_lower: np.ndarray
    col_upper: np.ndarray
    integer: np.ndarray     # bool per column
    stages: int
    options: int
    t_max: int              # column of t_max (d_max is the next one)
    m_max: int | None = None

    @property
    def num_rows(self) -> int:
        return len(self.row_lower)

    def counts(self, x: np.ndarray) -> np.ndarray:
        """h as integers, (stages x options)."""
        return np.rint(np.asarray(x[: self.stages * self.options])).astype(int).reshape(self.stages, self.options)

    def dense(self) -> np.ndarray:
        """The constraint matrix as a dense array (tests and the cvxpy path)."""
        a = np.zeros((self.num_rows, len(self.cost)))
        for r in range(self.num_rows):
            a[r, self.index[self.start[r]:self.start[r + 1]]] += self.value[self.start[r]:self.start[r + 1]]
        return a


class _Rows:
    def __init__(self):
        self.start, self.index, self.value, self.lower, self.upper = [0], [], [], [], []

    def add(self, cols, vals, lower: float, upper: float) -> None:
        cols, vals = np.asarray(cols, dtype=np.int64).ravel(), np.asarray(vals, dtype=float).ravel()
        keep = vals != 0
        self.index += cols[keep].tolist()
        self.value += vals[keep].tolist()
        self.start.append(len(self.index))
        self.lower.append(lower)
        self.upper.append(upper)


@dataclass(frozen=True)
class _Columns:
    """Where each variable of the program sits in x (module docstring's column order)."""

    p: int
    n: int
    L: int
    v: int
    h: np.ndarray           # h[s, o]: its column
    y0: int                 # the first y column
    t_max: int
    d_max: int
    m_max: int | None       # the memory bound's column (memory_bound), else None
    ncol: int
    cap: np.ndarray         # C_s


def stage_matrix(prob, memory_bound: bool = False, step_bound: float | None = None,
                 objective: str = "step") -> StageMatrix:
    """The program of `prob` (a milp.StageProblem, scaled) as matrices (module docstring). `step_bound` adds
    the row "step time <= step_bound" (milp.polish); `objective` is "step" (the step time), "rank" (the
    tie-break weights alone: milp.polish) or "memory" (m_max: milp.min_memory, with `memory_bound`)."""
    c = _columns(prob, memory_bound)
    rows = _Rows()
    T = _add_layer_rows(rows, prob, c)
    _add_memory_rows(rows, prob, c)
    D = per_stage(prob, prob.option_flush)
    for s in range(c.p):
        rows.add(list(c.h[s]) + [c.d_max], list(D[s]) + [-1.0], -np.inf, -float(prob.extra_flush[s]))
    _add_choice_rows(rows, prob, c)
    cost, offset, step = _objective(prob, c, T, objective)
    if step_bound is not None:
        nz = np.flatnonzero(step)
        rows.add(nz, step[nz], -np.inf, step_bound - float(np.sum(prob.extra_time)) / c.v)
    col_lower, col_upper = np.zeros(c.ncol), np.full(c.ncol, np.inf)
    col_upper[c.h.ravel()] = max(c.L, 0)
    col_upper[c.y0:c.t_max] = 1.0
    if memory_bound:
        col_lower[c.m_max] = -np.inf
    integer = np.zeros(c.ncol, dtype=bool)
    integer[:c.t_max] = True
    return StageMatrix(cost=cost, offset=offset, start=np.asarray(rows.start, dtype=np.int64),
                       index=np.asarray(rows.index, dtype=np.int64), value=np.asarray(rows.value),
                       row_lower=np.asarray(rows.lower, dtype=float), row_upper=np.asarray(rows.upper, dtype=float),
                       col_lower=col_lower, col_upper=col_upper, integer=integer, stages=c.p, options=c.n,
                       t_max=c.t_max, m_max=c.m_max)


def _columns(prob, memory_bound: bool) -> _Columns:
    """The column layout of `prob`'s program: h, then one y per gated phase and stage, t_max, d_max, m_max."""
    p, n = prob.num_stages, prob.option_time.shape[-1]
    gated = [q for q in prob.phases if q.gate is not None and q.gate.any()]
    y0 = p * n
    t_max = y0 + p * len(gated)
    d_max = t_max + 1
    return _Columns(p=p, n=n, L=prob.num_layers, v=prob.virtual_stages, h=np.arange(p * n).reshape(p, n), y0=y0,
                    t_max=t_max, d_max=d_max, m_max=d_max + 1 if memory_bound else None,
                    ncol=d_max + 1 + (1 if memory_bound else 0),
                    cap=np.broadcast_to(np.asarray(prob.capacity, dtype=float), (p,)))


def _add_layer_rows(rows: _Rows, prob, c: _Columns) -> np.ndarray:
    """Layer count, non-empty stages and the bottleneck rows; returns T (stages x options)."""
    p, n, h, inf = c.p, c.n, c.h, np.inf
    rows.add(h.ravel(), np.ones(p * n), c.L, c.L)
    if c.L:
        for s in range(p):
            rows.add(h[s], np.ones(n), c.v, inf)
    T = per_stage(prob, prob.option_time)
    for s in range(p):
        rows.add(list(h[s]) + [c.t_max], list(T[s]) + [-1.0], -inf, -float(prob.extra_time[s]))
    return T


def _memory_row(rows: _Rows, c: _Columns, s: int, coeff_s, const_s, extra_cols=(), extra_vals=()) -> None:
    """sum_o coeff_s h[s, o] (+ extra) <= C_s - const_s, or (memory_bound) <= m_max - const_s."""
    cols, vals = list(c.h[s]) + list(extra_cols), list(coeff_s) + list(extra_vals)
    if c.m_max is not None:
        rows.add(cols + [c.m_max], vals + [-1.0], -np.inf, -const_s)
    else:
        rows.add(cols, vals, -np.inf, c.cap[s] - const_s)


def _add_memory_rows(rows: _Rows, prob, c: _Columns) -> None:
    """The main memory phase's rows, then every other phase's; a gated phase binds only on the stages that
    hold one of its options (its y column, with a big-M of the phase's largest possible sum)."""
    p, L, h = c.p, c.L, c.h
    W = mem_coeff(prob)
    for s in range(p):
        _memory_row(rows, c, s, W[s], float(prob.extra_mem[s]))
    g = 0
    for q in prob.phases:
        X = per_stage(prob, q.coeff)
        const = np.broadcast_to(np.asarray(q.const, dtype=float), (p,))
        if q.gate is None:
            for s in range(p):
                _memory_row(rows, c, s, X[s], float(const[s]))
        elif q.gate.any():
            big = np.maximum(X.max(axis=1) * max(L, 1) + const, 0)
            members = np.flatnonzero(q.gate)
            for s in range(p):
                y = c.y0 + g * p + s
                rows.add([y] + list(h[s, members]), [max(L, 1)] + [-1.0] * len(members), 0.0, np.inf)
                # sum X h + B y <= C - Y + B: binds only where y = 1
                _memory_row(rows, c, s, X[s], float(const[s]) - float(big[s]), [y], [float(big[s])])
            g += 1


def _add_choice_rows(rows: _Rows, prob, c: _Columns) -> None:
    """The rows of fixed choices (a tensor-parallel option used, a pinned split, counted options) and host memory."""
    p, n, h, inf = c.p, c.n, c.h, np.inf
    if prob.must_use is not None and prob.must_use.any():
        rows.add(h[:, np.flatnonzero(prob.must_use)], np.ones((p, int(prob.must_use.sum()))), 1.0, inf)
    if prob.stage_layers is not None:  # a pinned split: stage s holds exactly n_s layers
        for s in range(p):
            rows.add(h[s], np.ones(n), float(prob.stage_layers[s]), float(prob.stage_layers[s]))
    if prob.count_use is not None:
        mask, count = prob.count_use
        cols = h[:, np.flatnonzero(mask)]
        rows.add(cols, np.ones(cols.shape), count, count)  # no option in N: the empty sum 0 = n
    if prob.option_host_state is not None and np.all(np.isfinite(prob.host_capacity)):
        host = per_stage(prob, prob.option_host_state) + prob.in_flight[:, None] * per_stage(prob, prob.option_host_act)
        hcap = np.broadcast_to(np.asarray(prob.host_capacity, dtype=float), (p,))
        for s in range(p):
            rows.add(h[s], host[s], -inf, float(hcap[s]))


def _objective(prob, c: _Columns, T: np.ndarray, objective: str) -> tuple[np.ndarray, float, np.ndarray]:
    """(cost vector, constant offset, the step time's vector) of the objective asked (stage_matrix)."""
    v, L, h = c.v, c.L, c.h
    step = np.zeros(c.ncol)
    step[h.ravel()] = (T / v).ravel()
    step[c.t_max], step[c.d_max] = prob.num_microbatches - 1 / v, 1.0
    offset = float(np.sum(prob.extra_time)) / v
    rank = np.zeros(c.ncol)
    if prob.option_rank is not None and prob.option_rank.any():
        rank[h.ravel()] = np.broadcast_to(np.asarray(prob.option_rank, dtype=float), (c.p, c.n)).ravel()
    if objective == "step":
        cost = step + TIE_BREAK * rank / max(1, L)
    elif objective == "rank":
        cost, offset = rank, 0.0
    elif objective == "memory":
        cost, offset = np.zeros(c.ncol), 0.0
        cost[c.m_max] = 1.0
    else:
        raise ValueError(f"unknown objective {objective!r}")
    return cost, offset, step


@dataclass
class MatrixResult:
    status: str                 # cvxpy's spelling: "optimal", "infeasible", "user_limit", ...
    x: np.ndarray | None        # the columns, where the solver holds a feasible assignment
    objective: float | None     # with the offset
    mip_gap: float | None


STATUS = {"kOptimal": "optimal", "kInfeasible": "infeasible", "kUnboundedOrInfeasible": "infeasible_or_unbounded",
          "kUnbounded": "unbounded", "kObjectiveBound": "user_limit", "kObjectiveTarget": "user_limit",
          "kTimeLimit": "user_limit", "kIterationLimit": "user_limit", "kSolutionLimit": "user_limit"}
"""HiGHS's model status in cvxpy's words (cvxpy's HiGHS interface maps them the same way), so that
milp.no_solution_status reads both backends."""
GOOD_ENOUGH = "good_enough"
"""solve_highs stopped at an incumbent no worse than its `good_enough`."""


def solve_highs(m: StageMatrix, time_limit: float, mip_rel_gap: float | None,
                objective_bound: float | None = None, node_limit: int | None = None,
                good_enough: float | None = None) -> MatrixResult:
    """Solve with HiGHS directly (`mip_rel_gap` None: HiGHS's default). `objective_bound` is HiGHS's own
    (without the offset). `node_limit` bounds the branch-and-bound work (HiGHS's mip_max_nodes): a limit by
    work gives the same answer on any machine at any load, where the wall-clock `time_limit` only guards
    against a stuck solve. `good_enough` (HiGHS's units, as `objective_bound`): the solve stops, with status
    GOOD_ENOUGH, at the first incumbent at or below it -- the caller has proven from its own bound that such an
    incumbent is within the gap (milp.solve_stages). HiGHS checks it at fixed points of its search, so the stop is
    as deterministic as the node limit."""
    import highspy
    from partita.planner.solve.highs import silence_banner
    silence_banner()
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = len(m.cost), m.num_rows
    lp.col_cost_ = m.cost
    lp.col_lower_, lp.col_upper_ = m.col_lower, m.col_upper
    lp.row_lower_, lp.row_upper_ = m.row_lower, m.row_upper
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = m.start, m.index, m.value
    lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous for i in m.integer]
    solver = highspy.Highs()
    solver.setOptionValue("output_flag", False)
    solver.setOptionValue("time_limit", float(time_limit))
    if node_limit is not None:
        solver.setOptionValue("mip_max_nodes", int(node_limit))
    if mip_rel_gap is not None:
        solver.setOptionValue("mip_rel_gap", float(mip_rel_gap))
    if objective_bound is not None:
        solver.setOptionValue("objective_bound", float(objective_bound))
    solver.passModel(lp)
    met, found = [], []
    if good_enough is not None:  # (mip_primal_bound is not an incumbent: with objective_bound it starts there)
        solver.cbMipImprovingSolution.subscribe(lambda event: found.append(event.data_out.objective_function_value))

        def stop_when_good_enough(event) -> None:
            if found and min(found) <= good_enough:
                met.append(True)
                event.data_in.user_interrupt = True
        solver.cbMipInterrupt.subscribe(stop_when_good_enough)
    solver.run()
    status = GOOD_ENOUGH if met else STATUS.get(solver.getModelStatus().name, "solver_error")
    info = solver.getInfo()
    if int(info.primal_solution_status) != 2:  # 2: a feasible primal solution
        return MatrixResult(status, None, None, None)
    x = np.asarray(solver.getSolution().col_value)
    gap = float(info.mip_gap) if np.isfinite(info.mip_gap) else (0.0 if status == "optimal" else None)
    return MatrixResult(status, x, float(m.cost @ x) + m.offset, gap)


def solve_cvxpy(m: StageMatrix, solver: str, options: dict) -> MatrixResult:
    """The same matrices through cvxpy, for solvers without a direct interface here (CBC)."""
    import cvxpy as cp
    n_int = int(m.integer.sum())
    assert m.integer[:n_int].all() and not m.integer[n_int:].any()  # integer columns first
    xi, xc = cp.Variable(n_int, integer=True), cp.Variable(len(m.cost) - n_int)
    x = cp.hstack([xi, xc])
    a = m.dense()
    low, up = np.isfinite(m.col_lower), np.isfinite(m.col_upper)
    cons = [x[np.flatnonzero(low)] >= m.col_lower[low]] if low.any() else []
    cons += [x[np.flatnonzero(up)] <= m.col_upper[up]] if up.any() else []
    eq = m.row_lower == m.row_upper
    lo, hi = np.isfinite(m.row_lower) & ~eq, np.isfinite(m.row_upper) & ~eq
    for mask, build in ((eq, lambda a_, b: a_ @ x == b), (lo, lambda a_, b: a_ @ x >= b),
                        (hi, lambda a_, b: a_ @ x <= b)):
        if mask.any():
            cons.append(build(a[mask], (m.row_lower if mask is lo or mask is eq else m.row_upper)[mask]))
    problem = cp.Problem(cp.Minimize(m.cost @ x), cons)
    problem.solve(solver=solver, **options)
    if x.value is None:
        return MatrixResult(problem.status, None, None, None)
    return MatrixResult(problem.status, np.asarray(x.value), float(m.cost @ x.value) + m.offset,
                        0.0 if problem.status == "optimal" else None)

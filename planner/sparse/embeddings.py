"""The embedding-table block of the program: per table its sharding, ranks and placement.

Per table t the program picks one option o (costmodel.sparse.costs.Option: data_parallel, table_wise,
column_wise into k pieces, row_wise, table_row_wise; placement HBM, an HBM cache of a fraction f of the
rows before host memory, or host memory through UVM) and the ranks its pieces go to, beside the dense
plan, whose per-rank step time D and HBM M_D enter as constants (the dense part of a recommendation
model runs on every rank, replicated or sharded: planner.sparse.rec_plan solves this block once per choice). Piece costs
c_to (seconds), h_to (HBM bytes) and u_to (host bytes) are costmodel.sparse.costs's, or with `--embedding-costs
torchrec` TorchRec's own estimator's (costmodel.sparse.torchrec_costs, lambda_s = 0): TorchRec's planner minimises
max_r sum c_to over its shards too, so the program then solves TorchRec's own objective exactly.

Rank-indexed program (exact; HiGHS, warm-started from the placement below):

    z_to in {0,1}               option o for table t;   sum_o z_to = 1
    x_tor in {0,1}              a piece of (t, o) on rank r (table_wise, column_wise):  sum_r x_tor = k_o z_to
    x_ton in {0,1}              (t, o) row-wise over node n (table_row_wise):           sum_n x_ton = z_to
    q_s in {0,1}                sharding type s used at all: q_s >= z_to for o of type s (aggregated, big-M)
    min T   s.t. for every rank r (on node n(r)):
        T >= D + sum_s lambda_s q_s + sum x_tor c_to + sum x_to,n(r) c_to + sum_{o spread} z_to c_to
        M_D + sum x_tor h_to + sum x_to,n(r) h_to + sum_{o spread} z_to h_to <= HBM usable   (host alike)

lambda_s is the latency of sharding type s's collectives (costmodel.sparse.costs.collective_latency); "spread"
options (data_parallel, row_wise) put one piece on every rank.

How it is solved. First the rank index is dropped: the same z, q, with S = sum_spread z c (the load every
rank carries) and the average and largest-piece bounds

    T >= D + Lambda + (sum_to z_to c_to k_to) / R        T >= D + Lambda + S + sum_o z_to c_to   (each local t)
    sum_to z_to h_to k_to <= R (HBM - M_D)               S_h + sum_o z_to h_to <= HBM - M_D   (host alike)

is a relaxation of the program above, so its optimum is a lower bound on the best plan (and its
infeasibility proves that no plan exists). The options it chooses are placed on ranks longest-processing-
time-first under the memory limits (Graham 1969: within 4/3 of the optimum makespan without them) and
improved by moving pieces off the slowest rank, then by changing one table's option at a time where that
shortens the step (`_rechoose`: the relaxation pools each rank, so a table it leaves whole on the slowest rank may
do better split or spread; only where the plan is more than MIP_GAP off the bound). Where the chosen pieces do not pack (the relaxation pools a
rank's memory), the relaxation is solved again under less memory per rank (PACKING_RETRIES) until they do.
Where that plan's gap to the bound exceeds MIP_GAP and the
rank-indexed program is small (up to EXACT_LIMIT piece variables), HiGHS solves it from that plan for
EXACT_NODES nodes (to the end, within the time limit, where the placement found no room), which can only improve
the plan and raise the bound. The plan states its gap: 1 - (D + bound) / (D + its sparse step). A table
that fits on no rank by itself is named with the memory it needs.

The block's records (Fixed, Assignment, SparseSolution, the shared problem) are planner.sparse.problem's, each
table's options and their costs planner.sparse.table_options', the placement and its local moves
planner.sparse.placement's; the programs and their solving are here.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np
from scipy.sparse import coo_array

from partita.costmodel.sparse.embeddings import Access, Table
from partita.costmodel.errors import InfeasibleError, PartitaError
from partita.costmodel.hardware import GiB
from partita.costmodel.sparse.costs import SHARDINGS, SparseContext, collective_latency
from partita.planner.sparse.placement import _faster_where_room, _place, _ranks_for
from partita.planner.sparse.table_options import floor_s, option_costs  # noqa: F401 (re-exported: rec_plan reads them here)
from partita.planner.sparse.table_options import (CACHE_FRACTIONS, COLUMN_SHARDS, MIN_COLUMN_WIDTH,  # noqa: F401 (re-exported)
                                                  _pareto, parse_fixed, table_options)
from partita.planner.sparse.problem import (LOCAL, SPREAD, Assignment, Fixed, SparseSolution,  # noqa: F401 (re-exported)
                                            _kinds, _nodes, _Problem, _tally, pieces)

MIP_GAP = 0.02
"""Relative gap of the step time (dense + sparse, the objective) at which the solver stops: many near-equal
tables make the last fraction of a percent a long proof of a balance that does not matter."""
PACKING_RETRIES = (0.95, 0.9, 0.8, 0.65)
"""Memory per rank, as fractions of the real limit, the relaxation is solved again under when its choice does
not pack onto ranks (each retry a smaller limit, the placement always against the real one)."""
RECHOOSE_ROUNDS = 100
"""Option changes the local search after the placement may make (planner.sparse.embeddings._rechoose)."""
EXACT_LIMIT = 20_000
"""Piece variables (tables x options x ranks) up to which the rank-indexed program is solved directly."""
EXACT_NODES = 200
"""Branch-and-bound nodes the rank-indexed program may spend improving on the placement's plan and bound
(small instances): a fixed amount of work, so the same inputs give the same plan on a busy machine too."""
def _check_each_fits(p: _Problem, fixed: dict[str, Fixed]) -> None:
    """A table none of whose options fits on an empty rank is named, with the least memory it needs."""
    for t, costs in zip(p.tables, p.costs):
        fitting = [c for _, c in costs if c.hbm_bytes <= p.hbm_cap and c.host_bytes <= p.host_cap]
        if fitting:
            continue
        if not costs:
            raise PartitaError(f"table {t.name}: no sharding of the allowed ones ({fixed[t.name].sharding}) applies "
                               f"on {p.ctx.ranks} ranks")
        least = min(costs, key=lambda oc: oc[1].hbm_bytes / max(p.hbm_cap, 1) + oc[1].host_bytes / max(p.host_cap, 1))
        o, c = least
        restricted = f" with {fixed[t.name].sharding} fixed" if t.name in fixed else ""
        raise InfeasibleError(
            f"table {t.name} ({t.rows:,} rows x {t.dim}) fits on no rank{restricted}: at the least ({o.describe()}) "
            f"a rank holds {c.hbm_bytes / GiB:.2f} GiB of HBM and {c.host_bytes / GiB:.2f} GiB of host memory, "
            f"and has {p.hbm_cap / GiB:.2f} GiB HBM and {p.host_cap / GiB:.2f} GiB host left beside the dense part")


class _Columns:
    def __init__(self):
        self.n, self.integral, self.cost, self.upper = 0, [], [], []

    def add(self, integral: bool, cost: float = 0.0, count: int = 1) -> int:
        """`count` columns: binaries, or (integral False) non-negative continuous ones."""
        start = self.n
        self.n += count
        self.integral += [int(integral)] * count
        self.cost += [cost] * count
        self.upper += [1.0 if integral else np.inf] * count
        return start


class _Rows:
    def __init__(self):
        self.r, self.c, self.v, self.lo, self.hi = [], [], [], [], []

    def add(self, terms: list[tuple[int, float]], lo: float, hi: float) -> None:
        i = len(self.lo)
        for c, v in terms:
            self.r.append(i)
            self.c.append(c)
            self.v.append(v)
        self.lo.append(lo)
        self.hi.append(hi)


@dataclass
class _Result:
    status: str
    x: np.ndarray | None
    objective: float
    bound: float
    gap: float


def _solve(cols: _Columns, rows: _Rows, time_limit: float, start: np.ndarray | None = None,
           nodes: int | None = None) -> _Result:
    """HiGHS on the program, from the feasible `start` where one is given (a warm start), stopping after
    `nodes` branch-and-bound nodes where given: a limit in work, not seconds, so the plan does not depend
    on how busy the machine is (`time_limit` only guards against a stuck solve)."""
    import highspy
    from partita.planner.solve.highs import silence_banner
    silence_banner()
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("mip_rel_gap", MIP_GAP)
    if nodes is not None:
        h.setOptionValue("mip_max_nodes", int(nodes))
    if start is not None:  # improving a plan in a few nodes: HiGHS's presolve of the rank-indexed program
        h.setOptionValue("presolve", "off")  # alone costs seconds on 26 tables x 8 ranks (its symmetric ranks)
    # each row scaled to a largest coefficient of 1: memory rows are in bytes (1e11) beside times in seconds
    # (1e-5), a range of 1e17 in which HiGHS's root LP did not finish in 60 s (a 32-rank instance of
    # benchmarks.rec); a row times a positive number is the same constraint
    r, c, v = np.asarray(rows.r), np.asarray(rows.c), np.asarray(rows.v, dtype=float)
    row_max = np.zeros(len(rows.lo))
    np.maximum.at(row_max, r, np.abs(v))
    row_scale = 1.0 / np.where(row_max > 0, row_max, 1.0)
    a = coo_array((v * row_scale[r], (r, c)), shape=(len(rows.lo), cols.n)).tocsc()
    inf = highspy.kHighsInf
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = cols.n, len(rows.lo)
    lp.col_cost_ = np.array(cols.cost, dtype=float)
    lp.col_lower_ = np.zeros(cols.n)
    lp.col_upper_ = np.minimum(np.array(cols.upper), inf)
    lp.row_lower_ = np.maximum(np.array(rows.lo, dtype=float) * row_scale, -inf)
    lp.row_upper_ = np.minimum(np.array(rows.hi, dtype=float) * row_scale, inf)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = a.indptr
    lp.a_matrix_.index_ = a.indices
    lp.a_matrix_.value_ = a.data
    lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                       for i in cols.integral]
    h.passModel(lp)
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = list(map(float, start))
        sol.value_valid = True
        h.setSolution(sol)
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    has_x = info.primal_solution_status == 2  # kSolutionStatusFeasible
    name = {highspy.HighsModelStatus.kOptimal: "optimal",
            highspy.HighsModelStatus.kInfeasible: "infeasible"}.get(status, "time_limit" if has_x else "no_solution")
    x = np.array(h.getSolution().col_value) if has_x else None
    bound = info.mip_dual_bound if np.isfinite(info.mip_dual_bound) else -np.inf
    return _Result(status=name, x=x, objective=info.objective_function_value if has_x else np.inf,
                   bound=bound, gap=float(info.mip_gap) if has_x else np.inf)


@dataclass
class _Exact:
    """The rank-indexed program's columns and rows, and where its variables sit (module docstring)."""

    cols: _Columns
    rows: _Rows
    T: int
    q: dict          # sharding type -> its q column
    z: dict          # (table, option) -> its z column
    x: dict          # (table, option) -> its first x column (one per rank, or per node for table_row_wise)


def _solve_exact(p: _Problem, time_limit: float, incumbent: list[Assignment] | None,
                 nodes: int | None = None) -> tuple[_Result, list | None]:
    """The rank-indexed program (module docstring), warm-started from `incumbent`; its assignments."""
    prog = _exact_program(p)
    start = _warm_start(p, prog, incumbent) if incumbent is not None else None
    res = _solve(prog.cols, prog.rows, time_limit, start, nodes)
    if res.x is None:
        return res, None
    return res, _exact_assignments(p, prog, res.x)


def _exact_program(p: _Problem) -> _Exact:
    """The rank-indexed program's columns and rows: one option per table, its pieces on ranks (or nodes),
    a q per sharding type used, and per rank its time, HBM and host rows."""
    R = p.ctx.ranks
    n_nodes, per_node = _nodes(p)
    cols, rows = _Columns(), _Rows()
    T = cols.add(False, 1.0)
    kinds = _kinds(p)
    q = {k: cols.add(True) for k in kinds}
    z, x = {}, {}
    time_rows = [[(T, -1.0)] + [(q[k], p.latency[k]) for k in kinds] for _ in range(R)]
    hbm_rows = [[] for _ in range(R)]
    host_rows = [[] for _ in range(R)]
    by_kind: dict[str, list[int]] = {k: [] for k in kinds}
    for t, costs in enumerate(p.costs):
        row = []
        for o, (opt, c) in enumerate(costs):
            z[t, o] = zi = cols.add(True)
            row.append((zi, 1.0))
            by_kind[opt.sharding].append(zi)
            if opt.sharding in LOCAL or opt.sharding == "table_row_wise":
                span = R if opt.sharding in LOCAL else n_nodes
                x[t, o] = xs = cols.add(True, count=span)
                rows.add([(xs + i, 1.0) for i in range(span)] + [(zi, -float(opt.shards))], 0.0, 0.0)
                on_rank = [xs + (r if opt.sharding in LOCAL else r // per_node) for r in range(R)]
            else:
                on_rank = [zi] * R
            for r in range(R):
                time_rows[r].append((on_rank[r], c.time_s))
                hbm_rows[r].append((on_rank[r], c.hbm_bytes))
                host_rows[r].append((on_rank[r], c.host_bytes))
        rows.add(row, 1.0, 1.0)
    for k in kinds:
        rows.add([(zi, 1.0) for zi in by_kind[k]] + [(q[k], -float(len(p.tables)))], -np.inf, 0.0)
    for r in range(R):
        rows.add(time_rows[r], -np.inf, -p.dense_s)
        rows.add(hbm_rows[r], -np.inf, p.hbm_cap)
        rows.add(host_rows[r], -np.inf, p.host_cap)
    return _Exact(cols=cols, rows=rows, T=T, q=q, z=z, x=x)


def _warm_start(p: _Problem, prog: _Exact, incumbent: list[Assignment]) -> np.ndarray:
    """The program's variables at the `incumbent` plan (a feasible start for HiGHS)."""
    _, per_node = _nodes(p)
    start = np.zeros(prog.cols.n)
    for t, a in enumerate(incumbent):
        o = next(i for i, (opt, _) in enumerate(p.costs[t]) if opt == a.option)
        start[prog.z[t, o]] = 1.0
        if a.option.sharding in LOCAL:
            start[[prog.x[t, o] + r for r in a.ranks]] = 1.0
        elif a.option.sharding == "table_row_wise":
            start[prog.x[t, o] + a.ranks[0] // per_node] = 1.0
        start[prog.q[a.option.sharding]] = 1.0
    inc = _tally(p, incumbent, "", "", 0.0)
    start[prog.T] = p.dense_s + inc.step_s
    return start


def _exact_assignments(p: _Problem, prog: _Exact, x: np.ndarray) -> list[Assignment]:
    """Each table's option and ranks in the program's solution `x`."""
    R = p.ctx.ranks
    n_nodes, per_node = _nodes(p)
    assignments = []
    for t, costs in enumerate(p.costs):
        o = max(range(len(costs)), key=lambda o: x[prog.z[t, o]])
        opt, c = costs[o]
        if opt.sharding in LOCAL:
            ranks = tuple(r for r in range(R) if x[prog.x[t, o] + r] > 0.5)
        elif opt.sharding == "table_row_wise":
            n = next(n for n in range(n_nodes) if x[prog.x[t, o] + n] > 0.5)
            ranks = tuple(range(n * per_node, (n + 1) * per_node))
        else:
            ranks = tuple(range(R))
        assignments.append(Assignment(table=p.tables[t], option=opt, cost=c, ranks=ranks))
    return assignments


def _solve_relaxed(p: _Problem, time_limit: float):
    """The rank-free relaxation (module docstring): option per table, a lower bound; None if infeasible."""
    R = p.ctx.ranks
    cols, rows = _Columns(), _Rows()
    T = cols.add(False, 1.0)
    kinds = _kinds(p)
    q = {k: cols.add(True) for k in kinds}
    S, Sh, Su = (cols.add(False) for _ in range(3))
    avg = [(T, -1.0)] + [(q[k], p.latency[k]) for k in kinds]
    tot_h, tot_u, spread, spread_h, spread_u = [], [], [(S, -1.0)], [(Sh, -1.0)], [(Su, -1.0)]
    z = {}
    by_kind: dict[str, list[int]] = {k: [] for k in kinds}
    for t, costs in enumerate(p.costs):
        pick, local, local_h, local_u = [], [(S, 1.0), (T, -1.0)] + [(q[k], p.latency[k]) for k in kinds], \
            [(Sh, 1.0)], [(Su, 1.0)]
        for o, (opt, c) in enumerate(costs):
            z[t, o] = zi = cols.add(True)
            pick.append((zi, 1.0))
            by_kind[opt.sharding].append(zi)
            k = pieces(opt, p.ctx)
            avg.append((zi, c.time_s * k / R))
            tot_h.append((zi, c.hbm_bytes * k))
            tot_u.append((zi, c.host_bytes * k))
            if opt.sharding in SPREAD:
                spread += [(zi, c.time_s)]
                spread_h += [(zi, c.hbm_bytes)]
                spread_u += [(zi, c.host_bytes)]
            else:
                local.append((zi, c.time_s))
                local_h.append((zi, c.hbm_bytes))
                local_u.append((zi, c.host_bytes))
        rows.add(pick, 1.0, 1.0)
        rows.add(local, -np.inf, -p.dense_s)
        rows.add(local_h, -np.inf, p.hbm_cap)
        rows.add(local_u, -np.inf, p.host_cap)
    for k in kinds:
        rows.add([(zi, 1.0) for zi in by_kind[k]] + [(q[k], -float(len(p.tables)))], -np.inf, 0.0)
    rows.add(avg, -np.inf, -p.dense_s)
    rows.add(tot_h, -np.inf, R * p.hbm_cap)
    rows.add(tot_u, -np.inf, R * p.host_cap)
    for terms in (spread, spread_h, spread_u):
        rows.add(terms, 0.0, 0.0)
    res = _solve(cols, rows, time_limit)
    if res.status == "infeasible":
        return None
    if res.x is None:
        raise PartitaError(f"the embedding program found no plan within {time_limit:.0f} s; raise the time limit")
    choice = [max(range(len(costs)), key=lambda o: res.x[z[t, o]]) for t, costs in enumerate(p.costs)]
    return choice, max(res.bound, 0.0) - p.dense_s


def _rechoose(p: _Problem, assignments: list[Assignment], rounds: int | None = None) -> list[Assignment]:
    """Change one table's option at a time where that shortens the step: the relaxation chose options for a
    pooled rank, and a table it left whole on the slowest rank may do better split, spread or on another node.
    Each round tries every other option of every table on the slowest rank, placed by _ranks_for, and keeps the
    change that most lowers (slowest rank + the collectives' latency, sum of squared rank loads); it stops when
    none does or after `rounds` changes (RECHOOSE_ROUNDS; a fixed amount of work: the same inputs give the same
    plan)."""
    rounds = RECHOOSE_ROUNDS if rounds is None else rounds
    out = list(assignments)
    sol = _tally(p, out, "", "", 0.0)
    load, hbm, host = sol.rank_time, sol.rank_hbm, sol.rank_host
    used = {}
    for a in out:
        used[a.option.sharding] = used.get(a.option.sharding, 0) + 1
    index = {t.name: i for i, t in enumerate(p.tables)}
    score = lambda ld, kinds: (ld.max() + sum(p.latency[k] for k, n in kinds.items() if n), float(ld @ ld))  # noqa: E731
    for _ in range(rounds):
        now = score(load, used)
        worst = int(np.argmax(load))
        best = None
        for i, a in enumerate(out):
            if worst not in a.ranks:
                continue
            idx = list(a.ranks)
            L, H, U = load.copy(), hbm.copy(), host.copy()
            L[idx] -= a.cost.time_s
            H[idx] -= a.cost.hbm_bytes
            U[idx] -= a.cost.host_bytes
            for opt, c in p.costs[index[a.table.name]]:
                if opt == a.option or (rs := _ranks_for(p, opt, c, L, H, U)) is None:
                    continue
                L2 = L.copy()
                L2[rs] += c.time_s
                kinds = dict(used)
                kinds[a.option.sharding] -= 1
                kinds[opt.sharding] = kinds.get(opt.sharding, 0) + 1
                key = score(L2, kinds)
                if key[0] < now[0] - 1e-12 or (key[0] <= now[0] + 1e-15 and key[1] < now[1] * (1 - 1e-9)):
                    if best is None or key < best[0]:
                        best = (key, i, Assignment(table=a.table, option=opt, cost=c, ranks=tuple(rs)))
        if best is None:
            break
        _, i, new = best
        old = out[i]
        for arr, before, after in ((load, old.cost.time_s, new.cost.time_s), (hbm, old.cost.hbm_bytes, new.cost.hbm_bytes),
                                   (host, old.cost.host_bytes, new.cost.host_bytes)):
            arr[list(old.ranks)] -= before
            arr[list(new.ranks)] += after
        used[old.option.sharding] -= 1
        used[new.option.sharding] = used.get(new.option.sharding, 0) + 1
        out[i] = new
    return out


def solve_tables(tables: list[Table], accesses: dict[str, Access], ctx: SparseContext, *, dense_s: float,
                 dense_hbm: float, fixed: dict[str, Fixed] | None = None, time_limit: float = 60.0,
                 exact_nodes: int = EXACT_NODES, costs: list | None = None) -> SparseSolution:
    """The embedding block (module docstring) beside a dense part of `dense_s` seconds and `dense_hbm` bytes
    per rank: the relaxation and placement first, then (up to EXACT_LIMIT piece variables) the rank-indexed
    program from that plan for at most `exact_nodes` branch-and-bound nodes. Raises InfeasibleError naming the table, or
    saying the tables do not fit together."""
    t0 = time.perf_counter()
    fixed = fixed or {}
    dev = ctx.cluster.device
    hbm_cap = dev.usable_memory(flat=True) - dense_hbm
    if hbm_cap <= 0:
        raise InfeasibleError(f"the dense part alone needs {dense_hbm / GiB:.2f} GiB per rank, more than the "
                              f"{dev.usable_memory(flat=True) / GiB:.2f} GiB usable")
    costs = costs if costs is not None else option_costs(tables, accesses, ctx, fixed)
    p = _Problem(tables=tables, costs=costs, ctx=ctx, dense_s=dense_s, hbm_cap=hbm_cap,
                 host_cap=dev.host_memory_bytes, latency={k: collective_latency(ctx, k) for k in SHARDINGS})
    _check_each_fits(p, fixed)
    relaxed = _solve_relaxed(p, time_limit)
    if relaxed is None:
        raise InfeasibleError(_together(p) + " (the rank-free relaxation is infeasible: proven by the solver)")
    choice, bound = relaxed
    placed = _place(p, choice)
    for tighter in PACKING_RETRIES if placed is None else ():
        # the relaxation pools each rank's memory; where its choice does not pack, choose again with less
        # memory per rank, so the pieces leave the packing slack (the bound stays the first relaxation's)
        again = _solve_relaxed(dataclasses.replace(p, hbm_cap=tighter * p.hbm_cap, host_cap=tighter * p.host_cap),
                               time_limit)
        if again is not None and (placed := _place(p, again[0])) is not None:
            choice = again[0]
            break
    gap = lambda sol: 1.0 - (dense_s + bound) / (dense_s + sol.step_s)  # noqa: E731 -- of the whole step
    best = _tally(p, placed, "feasible", "relaxation + placement", 0.0) if placed is not None else None
    if best is not None and gap(best) > MIP_GAP:
        best = _tally(p, _rechoose(p, placed), "feasible", "relaxation + placement + re-choice", 0.0)
        placed = best.assignments
    small = sum(len(c) for c in costs) * ctx.ranks <= EXACT_LIMIT
    if small and (best is None or gap(best) > MIP_GAP):
        res, exact = _solve_exact(p, time_limit, placed, exact_nodes if best is not None else None)
        if res.status == "infeasible":
            raise InfeasibleError(_together(p) + " (the rank-indexed program is infeasible: proven by the solver)")
        bound = max(bound, res.bound - dense_s)
        if exact is not None:
            candidate = _tally(p, exact, res.status, "rank-indexed", 0.0)
            if best is None or candidate.step_s < best.step_s:
                best = candidate
    if best is None:
        raise PartitaError("the tables' pieces could not be packed onto ranks within memory, though the memory in "
                           "all suffices; fix some tables' sharding (--embedding-sharding) or add devices")
    best = _tally(p, _faster_where_room(p, best.assignments), best.status, best.formulation, 0.0)
    best.lower_bound_s = min(bound, best.step_s)
    best.mip_gap = max(0.0, gap(best))
    best.status = "optimal" if best.mip_gap <= MIP_GAP else "feasible"
    best.wall_time_s = time.perf_counter() - t0
    return best


def _together(p: _Problem) -> str:
    least = [min(c.hbm_bytes * pieces(o, p.ctx) for o, c in costs) for costs in p.costs]
    big = sorted(zip(least, (t.name for t in p.tables)), reverse=True)[:3]
    return (f"the {len(p.tables)} tables do not fit together: each fits alone, but no placement holds all within "
            f"{p.hbm_cap / GiB:.2f} GiB HBM and {p.host_cap / GiB:.2f} GiB host per rank beside the dense part "
            f"(largest: {', '.join(f'{n} {b / GiB:.1f} GiB' for b, n in big)})")

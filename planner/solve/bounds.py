"""Bounds below the stage program's optimum (planner.solve.milp) that cost far less than solving it.

The outer search (planner.search) solves candidates in order of a cheap bound and skips those whose bound
is no better than the best plan found. That first bound (planner.enumerate.base._lower_bound) prices every
layer at its fastest option, so a candidate whose layers must recompute or shard to fit in memory looks as
fast as one that need not, and is solved only to be cut off: gpt3-175b on 128 A100s solved 1,311 of its
3,798 candidates, 1,301 of them ending "cutoff".

`stage_bound` keeps each stage's memory row and the integrality of the layer counts, and relaxes the rest.
For stage s and a whole number n of layers on it, let

    g_s(n) = E_s + n * h_s(B_s / n),    B_s = C_s - M_s,

where h_s(beta) is the least mean time per layer over mixes of options whose mean bytes per layer (the main
phase's W - chi G + k_s A, planner.solve.stage_matrix.mem_coeff) is at most beta: the lower convex hull of
the points (bytes_o, T_o) at beta, a mix of at most two options (a linear program with two rows). Any
assignment h[s, o] of the program gives tau_s >= g_s(n_s) (its options fit stage s, so their mean bytes are
at most B_s / n_s, and their mean time is at least the hull's). g_s is nondecreasing in n (times are >= 0,
h_s is nonincreasing in beta). So the objective (m - 1/v) t_max + sum_s tau_s / v + d_max is at least

    (m - 1/v) T* + S* / v + D*,

    T* = min over splits (n_s >= v, sum n_s = L) of max_s g_s(n_s)   (a threshold search: the smallest t at
         which the stages' largest n with g_s(n) <= t add up to L),
    S* = sum_s g_s(v) + the L - p v smallest increments g_s(n + 1) - g_s(n), n >= v, over all stages (no
         feasible split's increments add up to less),
    D* = (L min_o D_o + sum_s F_s) / p                               (d_max is at least the mean flush),

each minimised on its own (the minimum of a sum is at least the sum of the minima). With `whole`, a stage that holds
few layers (at most WHOLE_UP_TO) takes the larger of h's mix and the least time of n whole layers that fit (an
unbounded knapsack over the options with the layer count as a second dimension: `_whole_mixes`). The program gives
every layer one option, so 3 layers cannot run 2.4 fast and 0.6 slow ones as the hull may: on gpt3-175b / 128 A100s
the deep pipelines (pp = 32, 3 layers per stage) were solved only to end "cutoff" at 1-1.7 s of HiGHS each, their
hull bound 2-3% below the incumbent; the search asks for this bound only where the hull's does not prune
(planner.search._no_better), as it costs a knapsack per distinct stage. `whole` also counts, where the multisets
of options are few enough to enumerate, the least time of n whole layers meeting every memory row of the stage (the
other phases, gated ones where they bind, and host memory: `_whole_in_every_phase`); planner.solve.milp stops HiGHS
at the first plan within the gap of this bound. The hull, and the knapsack, leave the other memory phases and host
memory out; all of them leave out the must-use and counted options and a pinned split: dropping constraints only
lowers the bound. inf when some stage cannot hold v layers or the stages cannot hold L.

On gpt3-175b / 128 A100 it is within 0.01% of the chosen plan's step and above the best step for 103 of the
104 candidates the first bound left to solve (tests/planner/test_bounds.py checks it against solved programs).
"""
from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from partita.planner.solve.stage_matrix import mem_coeff, per_stage

SAFETY = 1 - 1e-9
"""The bound is scaled by this, so rounding in its arithmetic never lifts it above a program's optimum."""
WHOLE_UP_TO = 8
"""`whole` bounds count whole layers on stages that may hold at most this many (module docstring); beyond it the
hull's fractional mix is within a layer's worth of n and the knapsack's cost grows with n."""
BUDGET_RTOL = 1e-6
"""The whole-layer knapsack admits bytes this far above a stage's budget: the solver's assignments are accepted to
planner.solve.milp.FEASIBILITY_RTOL, so none of them is excluded."""


def stage_bound(prob, whole: bool = False) -> float:
    """A lower bound on `prob`'s optimum (module docstring); inf when no assignment fits. `whole`: with whole
    layers on stages that hold few (tighter, and dearer to compute)."""
    p, layers, v = prob.num_stages, prob.num_layers, prob.virtual_stages
    if layers < p * v:
        return float("inf")
    rows = [g[:, v - 1:] for g in _stage_times(prob, whole)]   # g_s(n) for n = v .. L, each pointwise above the last
    g = rows[-1]
    if not np.isfinite(g[:, 0]).all():
        return float("inf")
    t_star = _least_bottleneck(g, layers - p * v)
    if not np.isfinite(t_star):  # the stages cannot hold L layers
        return float("inf")
    s_star = max(_least_sum(r, layers - p * v) for r in rows)
    flush = per_stage(prob, prob.option_flush).min()
    d_star = (layers * flush + float(np.sum(prob.extra_flush))) / p
    m = prob.num_microbatches
    return float((m - 1 / v) * t_star + s_star / v + d_star) * SAFETY


def _least_sum(g: np.ndarray, extra: int) -> float:
    """S*: the stages' first values and the `extra` smallest increments. Raising g on few layers only (the whole-layer
    terms) can lower some increments, so stage_bound takes the largest S* over its rows of g: each is a bound."""
    with np.errstate(invalid="ignore"):
        steps = np.diff(g, axis=1)
    steps[np.isnan(steps)] = np.inf           # inf - inf: past what a stage can hold
    return float(g[:, 0].sum() + (np.sort(steps, axis=None)[:extra].sum() if extra else 0.0))


def _stage_times(prob, whole: bool = False) -> list[np.ndarray]:
    """g[s, n - 1] = g_s(n) for n = 1 .. L (module docstring), made nonincreasing from the right (a suffix
    minimum: equal to g in exact arithmetic, and never above it): the hull's, and with `whole` also the hull's
    raised by the main phase's whole layers, then by every phase's (each pointwise above the one before)."""
    p, layers = prob.num_stages, prob.num_layers
    time = per_stage(prob, prob.option_time)
    size = mem_coeff(prob)
    budget = np.broadcast_to(np.asarray(prob.capacity, dtype=float), (p,)) \
        - np.broadcast_to(np.asarray(prob.extra_mem, dtype=float), (p,))
    n = np.arange(1, layers + 1, dtype=float)
    per_layer = _hull(size, time, budget[:, None] / n[None, :])
    extra = np.asarray(prob.extra_time, dtype=float)[:, None]
    g = n[None, :] * per_layer + extra
    rows = [g]
    most = min(layers - (p - 1) * prob.virtual_stages, WHOLE_UP_TO)  # the most layers one stage can hold, capped
    if whole and layers <= p * WHOLE_UP_TO and most >= 1:
        for lift in (_whole_mixes(size, time, budget * (1 + BUDGET_RTOL), most),
                     _whole_in_every_phase(prob, time, most)):
            g = g.copy()
            g[:, :most] = np.maximum(g[:, :most], lift + extra)
            rows.append(g)
    return [np.minimum.accumulate(r[:, ::-1], axis=1)[:, ::-1] for r in rows]


def _whole_in_every_phase(prob, time: np.ndarray, most: int) -> np.ndarray:
    """w[s, n - 1]: the least time of n whole layers on stage s that meet every memory row of the stage -- the main
    phase, the other phases (a gated one where the stage holds one of its options) and host memory -- found by
    enumerating the multisets of options (n = 1 .. most; inf where none fit, or where there are more than
    ENUMERATE_UP_TO of them: the main phase's knapsack, `_whole_mixes`, then bounds alone). On deep pipelines the
    other phases bind: gpt3-175b on 64 A100s, pp = 32 with 3 layers a stage, had its bound 4.3% below the optimum
    with the main phase alone and 0.03% with every phase."""
    p, options = time.shape
    rows = _memory_rows(prob)
    out = np.full((p, most), -np.inf)
    memo: dict[bytes, np.ndarray] = {}
    for s in range(p):
        key = time[s].tobytes() + b"".join(np.asarray(r[s], dtype=float).tobytes() for r, *_ in rows) \
            + b"".join(np.float64(limit[s]).tobytes() for _, limit, _ in rows)
        if key not in memo:
            memo[key] = np.array([_least_enumerated(time[s], [(r[s], limit[s], gate) for r, limit, gate in rows], n)
                                  for n in range(1, most + 1)])
        out[s] = memo[key]
    return out


ENUMERATE_UP_TO = 5_000
"""`_whole_in_every_phase` enumerates the multisets of n options only where there are at most this many (6 options
and 8 layers: 1,287; 12 options and 5 layers: 4,368; 18 options and 3 layers: 1,140), so that a bound on a 32-stage
program with every stage different stays near 0.1 s at worst (32 stages x 8 counts x 5,000 multisets x 18 options x
a handful of memory rows)."""


def _memory_rows(prob) -> list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
    """Each memory row of the program as (bytes per layer of each option per stage (p, O), the most each stage may
    hold less its constant (p,), the gate: options whose presence makes the row bind, None for always), with the
    solver's feasibility slack on the capacity, so that no assignment the program accepts is excluded."""
    p = prob.num_stages
    cap = np.broadcast_to(np.asarray(prob.capacity, dtype=float), (p,)) * (1 + BUDGET_RTOL)
    rows = [(mem_coeff(prob), cap - np.broadcast_to(np.asarray(prob.extra_mem, dtype=float), (p,)), None)]
    for q in prob.phases:
        rows.append((per_stage(prob, q.coeff), cap - np.broadcast_to(np.asarray(q.const, dtype=float), (p,)), q.gate))
    if prob.option_host_state is not None and np.all(np.isfinite(prob.host_capacity)):
        host = per_stage(prob, prob.option_host_state) + np.asarray(prob.in_flight, dtype=float)[:, None] \
            * per_stage(prob, prob.option_host_act)
        rows.append((host, np.broadcast_to(np.asarray(prob.host_capacity, dtype=float), (p,)) * (1 + BUDGET_RTOL),
                     None))
    return rows


def _least_enumerated(time: np.ndarray, rows: list, n: int) -> float:
    """The least time of n layers, each taking one option, that meet every row (value, limit, gate); -inf (no
    bound) where the multisets are too many to enumerate."""
    combos = _multisets(time.shape[0], n)
    if combos is None:
        return -np.inf
    ok = np.ones(len(combos), dtype=bool)
    for value, limit, gate in rows:
        applies = ok if gate is None else (combos[:, gate].sum(axis=1) > 0 if gate.any() else ~ok)
        ok &= ~applies | (_dot(combos, value) <= limit)
    t = _dot(combos, time)
    return float(t[ok].min()) if ok.any() else np.inf


@functools.lru_cache(maxsize=64)
def _multisets(options: int, n: int) -> np.ndarray | None:
    """Every way to give n layers one of `options` each, as counts per option (rows); None beyond ENUMERATE_UP_TO."""
    if math.comb(options + n - 1, n) > ENUMERATE_UP_TO:
        return None
    return np.array([np.bincount(c, minlength=options) for c in
                     itertools.combinations_with_replacement(range(options), n)], dtype=float).reshape(-1, options)


def _dot(counts: np.ndarray, value: np.ndarray) -> np.ndarray:
    """counts @ value where an option not taken adds nothing, even at an infinite value (0 x inf is not nan here)."""
    finite = np.isfinite(value)
    out = counts[:, finite] @ value[finite]
    if not finite.all():
        out = out + np.where((counts[:, ~finite] > 0).any(axis=1), np.inf, 0.0)
    return out


def _whole_mixes(size: np.ndarray, time: np.ndarray, budget: np.ndarray, most: int) -> np.ndarray:
    """w[s, n - 1]: the least time of n whole layers on stage s, each taking one option, whose bytes add up to at most
    budget[s] (n = 1 .. most; inf where none fit). Stages with the same options and budget are solved once."""
    out = np.full((size.shape[0], most), np.inf)
    memo: dict[bytes, np.ndarray] = {}
    for s in range(size.shape[0]):
        key = size[s].tobytes() + time[s].tobytes() + budget[s:s + 1].tobytes()
        if key not in memo:
            memo[key] = _whole_row(size[s], time[s], float(budget[s]), most)
        out[s] = memo[key]
    return out


def _whole_row(size: np.ndarray, time: np.ndarray, budget: float, most: int) -> np.ndarray:
    """One stage's `_whole_mixes`: an unbounded knapsack over the options, by layer count, keeping for each count the
    (bytes, time) points no other beats on both (a point dropped there can be no part of a least time)."""
    usable = np.isfinite(size) & np.isfinite(time)
    cap = budget if (size[usable] >= 0).all() else np.inf  # partial sums may exceed a budget negative sizes bring back
    fronts = [np.zeros((1, 2))] + [np.empty((0, 2)) for _ in range(most)]
    for a, t in zip(size[usable], time[usable]):
        for n in range(1, most + 1):  # ascending: fronts[n - 1] already holds this option, so it may repeat
            grown = fronts[n - 1] + (a, t)
            fronts[n] = _pareto(np.vstack([fronts[n], grown[grown[:, 0] <= cap]]))
    return np.array([f[f[:, 0] <= budget, 1].min(initial=np.inf) for f in fronts[1:]])


def _pareto(points: np.ndarray) -> np.ndarray:
    """The points (bytes, time) that no other point has both fewer-or-equal bytes and less time than."""
    if len(points) <= 1:
        return points
    points = points[np.lexsort((points[:, 1], points[:, 0]))]
    keep = np.r_[True, points[1:, 1] < np.minimum.accumulate(points[:, 1])[:-1]]
    return points[keep]


def _hull(size: np.ndarray, time: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """Per stage s and budget beta[s, j]: the least mean time of a mix of options (size[s, o], time[s, o]) whose
    mean size is at most beta[s, j] (inf where no option is that small): one option that fits, or one that
    fits mixed with a larger, faster one up to the budget."""
    keep = ~_dominated_everywhere(size, time)  # an option another beats on every stage joins no least mix
    if not keep.all():
        size, time = size[:, keep], time[:, keep]
    a, t, b = size[:, :, None], time[:, :, None], beta[:, None, :]
    fits = a <= b                                                       # (p, O, n)
    single = np.where(fits, t, np.inf).min(axis=1)
    ai, ti, fi = a[:, :, None], t[:, :, None], fits[:, :, None]           # option i fits
    aj, tj, fj = a[:, None, :], t[:, None, :], fits[:, None, :]           # option j does not, and is faster
    usable = fi & ~fj & (tj < ti)
    with np.errstate(divide="ignore", invalid="ignore"):
        mixed = ti + (tj - ti) * (b[:, :, None] - ai) / (aj - ai)
    mixed = np.where(usable, mixed, np.inf).min(axis=(1, 2))
    return np.minimum(single, mixed)


def _dominated_everywhere(size: np.ndarray, time: np.ndarray) -> np.ndarray:
    """Per option: whether on every stage some other option has no more bytes and no more time, and less of one. A mix
    using it does no better than the same mix using that other one, so the hull is the same without it."""
    a, t = size[:, :, None], time[:, :, None]
    other_a, other_t = size[:, None, :], time[:, None, :]
    beaten = (other_a <= a) & (other_t <= t) & ((other_a < a) | (other_t < t))   # (p, o, other)
    return beaten.any(axis=2).all(axis=0)


def _least_bottleneck(g: np.ndarray, extra: int) -> float:
    """T*: the least t such that every stage holds its v layers within t and, beyond them, the stages can take
    `extra` more layers each within t (g is nondecreasing along each row)."""
    values = np.unique(g[np.isfinite(g)])
    values = values[values >= g[:, 0].max()]

    def enough(t: float) -> bool:  # each row's count of n with g_s(n) <= t, less its first (rows are nondecreasing)
        return int(np.count_nonzero(g <= t)) - g.shape[0] >= extra

    if not values.size or not enough(values[-1]):
        return float("inf")
    lo, hi = 0, values.size - 1
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(values[mid]) else (mid + 1, hi)
    return float(values[lo])

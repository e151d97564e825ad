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
(planner.search._no_better), as it costs a knapsack per distinct stage. The other memory phases,
host memory, the must-use and counted options and a pinned split are left out: dropping constraints only
lowers the bound. inf when some stage cannot hold v layers or the stages cannot hold L.

On gpt3-175b / 128 A100 it is within 0.01% of the chosen plan's step and above the best step for 103 of the
104 candidates the first bound left to solve (tests/planner/test_bounds.py checks it against solved programs).
"""
from __future__ import annotations

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
    g = _stage_times(prob, whole)[:, v - 1:]          # g_s(n) for n = v .. L
    if not np.isfinite(g[:, 0]).all():
        return float("inf")
    t_star = _least_bottleneck(g, layers - p * v)
    if not np.isfinite(t_star):  # the stages cannot hold L layers
        return float("inf")
    with np.errstate(invalid="ignore"):
        steps = np.diff(g, axis=1)
    steps[np.isnan(steps)] = np.inf           # inf - inf: past what a stage can hold
    extra = layers - p * v
    s_star = float(g[:, 0].sum() + (np.sort(steps, axis=None)[:extra].sum() if extra else 0.0))
    flush = per_stage(prob, prob.option_flush).min()
    d_star = (layers * flush + float(np.sum(prob.extra_flush))) / p
    m = prob.num_microbatches
    return float((m - 1 / v) * t_star + s_star / v + d_star) * SAFETY


def _stage_times(prob, whole: bool = False) -> np.ndarray:
    """g[s, n - 1] = g_s(n) for n = 1 .. L (module docstring), made nonincreasing from the right (a suffix
    minimum: equal to g in exact arithmetic, and never above it)."""
    p, layers = prob.num_stages, prob.num_layers
    time = per_stage(prob, prob.option_time)
    size = mem_coeff(prob)
    budget = np.broadcast_to(np.asarray(prob.capacity, dtype=float), (p,)) \
        - np.broadcast_to(np.asarray(prob.extra_mem, dtype=float), (p,))
    n = np.arange(1, layers + 1, dtype=float)
    per_layer = _hull(size, time, budget[:, None] / n[None, :])
    extra = np.asarray(prob.extra_time, dtype=float)[:, None]
    g = n[None, :] * per_layer + extra
    most = min(layers - (p - 1) * prob.virtual_stages, WHOLE_UP_TO)  # the most layers one stage can hold, capped
    if whole and layers <= p * WHOLE_UP_TO and most >= 1:
        g[:, :most] = np.maximum(g[:, :most], _whole_mixes(size, time, budget * (1 + BUDGET_RTOL), most) + extra)
    return np.minimum.accumulate(g[:, ::-1], axis=1)[:, ::-1]


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


def _least_bottleneck(g: np.ndarray, extra: int) -> float:
    """T*: the least t such that every stage holds its v layers within t and, beyond them, the stages can take
    `extra` more layers each within t (g is nondecreasing along each row)."""
    values = np.unique(g[np.isfinite(g)])
    values = values[values >= g[:, 0].max()]

    def enough(t: float) -> bool:
        more = sum(int(np.searchsorted(row, t, side="right")) - 1 for row in g)
        return more >= extra

    if not values.size or not enough(values[-1]):
        return float("inf")
    lo, hi = 0, values.size - 1
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(values[mid]) else (mid + 1, hi)
    return float(values[lo])

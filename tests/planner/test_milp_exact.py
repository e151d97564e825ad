"""The stage program's optimum equals brute-force enumeration of every assignment (many seeds)."""
import itertools

import numpy as np
import pytest

from partita.planner.solve.milp import (MemoryPhase, StageProblem, assignment_errors, counted_use_errors, evaluate, fits,
                                  polish, solve_stages)


def compositions(total, parts):
    """All ways to write total as an ordered sum of `parts` positive integers."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield [bounds[i + 1] - bounds[i] for i in range(parts)]


def brute_force(prob: StageProblem) -> float:
    p, n_opt = prob.num_stages, prob.option_time.shape[-1]
    best = float("inf")
    for sizes in compositions(prob.num_layers, p):
        if min(sizes) < prob.virtual_stages:
            continue
        per_stage = []
        for n in sizes:  # every split of a stage's n layers over the options
            per_stage.append([c for c in itertools.product(range(n + 1), repeat=n_opt) if sum(c) == n])
        for choice in itertools.product(*per_stage):
            counts = np.array(choice)
            if fits(prob, counts) and not counted_use_errors(prob.count_use, counts):
                best = min(best, evaluate(prob, counts))
    return best


def random_problem(rng, p, L, n_opt):
    t = rng.uniform(0.5, 2.0, n_opt)
    w = rng.uniform(1.0, 4.0, n_opt)
    a = rng.uniform(0.1, 1.0, n_opt)
    m = int(rng.integers(p, 3 * p + 2))
    in_flight = np.array([min(p - s, m) for s in range(p)], dtype=float)
    extra_t = np.zeros(p)
    extra_t[0] += rng.uniform(0, 1)
    extra_t[-1] += rng.uniform(0, 1.5)
    extra_m = np.zeros(p)
    extra_m[0] += rng.uniform(0, 3)
    extra_m[-1] += rng.uniform(0, 3)
    cap = float(rng.uniform(0.6, 1.2) * (w.mean() + a.mean() * p) * L / p + 3)
    return StageProblem(num_stages=p, num_layers=L, num_microbatches=m, option_time=t, option_state=w,
                        option_act=a, option_flush=rng.uniform(0, 0.2, n_opt), extra_time=extra_t,
                        extra_mem=extra_m, extra_flush=np.zeros(p), in_flight=in_flight, capacity=cap,
                        mip_rel_gap=0.0, virtual_stages=int(rng.integers(1, 3)),
                        must_use=np.array([False] * (n_opt - 1) + [bool(rng.integers(0, 2))]))


def heterogeneous(rng, prob: StageProblem) -> StageProblem:
    """The same program with per-stage speeds and capacities (stages on different device groups)."""
    p = prob.num_stages
    speed = rng.uniform(0.5, 2.0, (p, 1))
    prob.option_time = prob.option_time[None, :] * speed
    prob.option_state = np.broadcast_to(prob.option_state, (p, len(prob.option_state))).copy()
    prob.capacity = prob.capacity * rng.uniform(0.7, 1.3, p)
    return prob


def assert_solves_like_brute_force(prob: StageProblem) -> None:
    expected = brute_force(prob)
    sol = solve_stages(prob)
    if expected == float("inf"):
        assert not sol.feasible
    else:
        assert sol.feasible and fits(prob, sol.counts)
        assert sol.objective == pytest.approx(expected, rel=1e-6)


def with_phases(rng, prob: StageProblem) -> StageProblem:
    """The same program with gradients absent at some stages' main peak, an ungated phase (an optimizer
    step: states only) and a phase gated by the last option (a recompute rebuild), as planner.search
    builds them."""
    p, n_opt = prob.num_stages, prob.option_time.shape[-1]
    w = np.asarray(prob.option_state, dtype=float)
    prob.option_grad = w * rng.uniform(0.1, 0.4, n_opt)
    prob.grads_absent = (rng.uniform(size=p) < 0.5).astype(float)
    gate = np.zeros(n_opt, dtype=bool)
    gate[-1] = True
    prob.phases = [MemoryPhase("optimizer step", w, prob.extra_mem + rng.uniform(0, 2, p)),
                   MemoryPhase("recompute", w + prob.in_flight[:, None] * prob.option_act[None, :],
                               prob.extra_mem + rng.uniform(1, 4, p), gate=gate)]
    return prob


@pytest.mark.parametrize("seed", range(30))
def test_optimum_equals_brute_force_with_memory_phases(seed):
    """Every phase is a memory constraint; a gated one binds only on stages holding a gated option
    (binary y_s with a big-M): the program agrees with enumeration checked by `fits`."""
    rng = np.random.default_rng(2000 + seed)
    p = int(rng.integers(1, 4))
    assert_solves_like_brute_force(with_phases(rng, random_problem(rng, p, int(rng.integers(p, 7)), 2)))


@pytest.mark.parametrize("seed", range(20))
def test_optimum_equals_brute_force_with_per_stage_costs(seed):
    rng = np.random.default_rng(1000 + seed)
    p = int(rng.integers(1, 4))
    prob = heterogeneous(rng, random_problem(rng, p, int(rng.integers(p, 7)), int(rng.integers(1, 3))))
    assert_solves_like_brute_force(prob)


@pytest.mark.parametrize("seed", range(40))
def test_optimum_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    p = int(rng.integers(1, 4))
    prob = random_problem(rng, p, int(rng.integers(p, 7)), int(rng.integers(1, 3)))
    assert_solves_like_brute_force(prob)


@pytest.mark.parametrize("seed", range(20))
def test_a_fixed_option_count_is_kept_and_optimal(seed):
    """count_use = (N, n): exactly n layers take an option in N (a fixed number of fully recomputed
    layers). The optimum equals enumeration over the assignments that keep the count, the polished plan
    keeps it too, and a count no assignment reaches is infeasible."""
    rng = np.random.default_rng(3000 + seed)
    p = int(rng.integers(1, 4))
    prob = random_problem(rng, p, int(rng.integers(p, 7)), 3)
    mask = np.array([False, True, bool(rng.integers(0, 2))])
    prob.count_use = (mask, int(rng.integers(0, prob.num_layers + 1)))
    assert_solves_like_brute_force(prob)
    sol = solve_stages(prob)
    if sol.feasible:
        assert sol.counts[:, mask].sum() == prob.count_use[1]
        prob.option_rank = np.array([0.0, 1.0, 2.0])
        assert polish(prob, sol).counts[:, mask].sum() == prob.count_use[1]
    prob.count_use = (mask, prob.num_layers + 1)
    assert not solve_stages(prob).feasible
    unreached = (np.zeros(3, dtype=bool), 1)
    assert counted_use_errors(unreached, np.ones((p, 3), dtype=int)) == ["0 layers take the counted options, not 1"]
    prob.count_use = unreached
    assert not solve_stages(prob).feasible
    assert assignment_errors(prob, np.ones((p, 3), dtype=int))  # the count is part of a complete assignment


@pytest.mark.parametrize("seed", range(8))
def test_another_backend_given_the_same_matrices_finds_the_same_optimum(seed):
    """planner.solve.stage_matrix writes the program once; HiGHS takes it directly and any other cvxpy backend
    (here SciPy's MILP) takes the same rows. Both agree with enumeration, memory phases and counts included."""
    import cvxpy as cp
    rng = np.random.default_rng(4000 + seed)
    p = int(rng.integers(1, 4))
    prob = with_phases(rng, random_problem(rng, p, int(rng.integers(p, 7)), 3))
    prob.count_use = (np.array([False, True, False]), int(rng.integers(0, 2)))
    expected = brute_force(prob)
    other = solve_stages(prob, solver=cp.SCIPY)
    if expected == float("inf"):
        assert not other.feasible and not solve_stages(prob).feasible
    else:
        assert other.feasible and other.objective == pytest.approx(expected, rel=1e-6)

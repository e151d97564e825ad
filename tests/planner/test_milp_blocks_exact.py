"""The general (per-block) stage program equals brute-force enumeration on small random chains."""
import itertools

import numpy as np
import pytest

from partita.planner.solve.milp import counted_use_errors
from partita.planner.solve.milp_blocks import BlockProblem, block_plan_errors, evaluate_blocks, fits_blocks, solve_blocks


def random_blocks(rng, p, B):
    n_opt = rng.integers(1, 3, size=B)
    block_of = np.repeat(np.arange(B), n_opt)
    J = len(block_of)
    m = int(rng.integers(p, 2 * p + 3))
    return BlockProblem(
        num_stages=p, num_microbatches=m, block_of=block_of, time=rng.uniform(0.2, 2.0, J),
        state=rng.uniform(0.5, 3.0, J), act=rng.uniform(0.1, 1.0, J), flush=rng.uniform(0, 0.3, J),
        boundary_time=rng.uniform(0, 0.5, B - 1), in_flight=np.array([min(p - s, m) for s in range(p)], float),
        capacity=float(rng.uniform(0.5, 1.3) * 3.5 * B / p + 1), workspace=float(rng.uniform(0, 1)),
        must_use=(rng.random(J) < 0.3) if rng.random() < 0.5 else None, mip_rel_gap=0.0)


def brute_force(prob: BlockProblem) -> float:
    B, p = prob.num_blocks, prob.num_stages
    options = [np.flatnonzero(prob.block_of == i) for i in range(B)]
    best = float("inf")
    for cuts in itertools.combinations(range(1, B), p - 1):
        bounds = (0, *cuts, B)
        stage = np.concatenate([[s] * (bounds[s + 1] - bounds[s]) for s in range(p)])
        for choice in itertools.product(*options):
            counts = np.zeros((p, len(prob.block_of)), dtype=int)
            counts[stage, list(choice)] = 1
            if fits_blocks(prob, counts) and not counted_use_errors(prob.count_use, counts):
                best = min(best, evaluate_blocks(prob, counts))
    return best


@pytest.mark.parametrize("seed", range(30))
def test_general_program_equals_brute_force(seed):
    rng = np.random.default_rng(100 + seed)
    p = int(rng.integers(1, 4))
    prob = random_blocks(rng, p, int(rng.integers(p, 7)))
    expected = brute_force(prob)
    sol = solve_blocks(prob)
    if expected == float("inf"):
        assert not sol.feasible
    else:
        assert sol.feasible and fits_blocks(prob, sol.counts)
        assert sol.objective == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("seed", range(15))
def test_a_fixed_option_count_is_kept_and_optimal(seed):
    """count_use = (N, n) in the general program: exactly n blocks take an option in N."""
    rng = np.random.default_rng(400 + seed)
    p = int(rng.integers(1, 4))
    prob = random_blocks(rng, p, int(rng.integers(p, 7)))
    mask = rng.random(len(prob.block_of)) < 0.5
    prob.count_use = (mask, int(rng.integers(0, prob.num_blocks + 1)))
    expected = brute_force(prob)
    sol = solve_blocks(prob)
    if expected == float("inf"):
        assert not sol.feasible
    else:
        assert sol.feasible and not block_plan_errors(prob, sol.counts)
        assert sol.counts[:, mask].sum() == prob.count_use[1]
        assert sol.objective == pytest.approx(expected, rel=1e-6)

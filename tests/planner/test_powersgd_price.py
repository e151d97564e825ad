"""The PowerSGD sync mode on the planner's side (planner.estimate.sync.powersgd, gradient_shapes).

- tiny-gpt's gradients split into matrices (m, n) and vectors as torch's powerSGD_hook views them: the token
  embedding (64 x 256), each Linear's weight (out x in); biases and norms are vectors; the element counts add up to
  the model's parameters.
- On two islands over a 12.5 MB/s, 5 ms link: two all-reduces per step, the uncompressed tensors with the P
  factors (r m each), then the Q factors (r n each); a matrix that would not shrink 2x is sent as it is (torch's
  min_compression_rate); the memory is the error feedback of every gradient (torch keeps it per bucket) and
  the factors.
- A bad rank or start is one line.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from partita.planner.plan import Plan, PlanError

SLOW = "2x1xcpu@0.1Gbps,5ms"
ALPHA, BETA = 5e-3, 0.1e9 / 8


def _plan(**space):
    from partita.planner.api import plan_search
    from partita.planner.enumerate.space import SearchSpace, TrainConfig
    return plan_search("tiny-gpt", cluster=SLOW, train=TrainConfig(global_batch=4),
                       space=SearchSpace(dp=(2,), zero=(0,), **space))


def test_gradient_shapes_are_the_hooks_matrices_and_vectors():
    from partita.planner.estimate.sync import gradient_shapes
    result, plan = _plan(sync="powersgd")
    matrices, vectors = gradient_shapes(result.graph)
    assert sum(m * n for m, n in matrices) + vectors == plan.model["parameters"]
    assert (64, 256) in matrices and (64, 64) in matrices  # the token embedding, an attention projection
    assert all(m > 1 and n > 1 for m, n in matrices) and vectors > 0


@pytest.fixture(scope="module")
def solved():
    return _plan(sync="powersgd")


def _price(result, rank: int):
    from partita.planner.estimate import build
    from partita.planner.estimate.sync import sync_price
    from partita.planner.plan.sync import Sync
    c = result.best
    return sync_price("powersgd", build.predicted(result, c), build.sync_setting(result, c),
                      Sync(mode="powersgd", options={"rank": rank}))


@pytest.mark.parametrize("rank", [1, 4, 32])
def test_two_all_reduces_of_the_factors_and_what_does_not_shrink(solved, rank):
    from partita.planner.estimate.sync import gradient_shapes
    result, plan = solved
    matrices, vectors = gradient_shapes(result.graph)
    first, second, kept = vectors, 0, 0
    for m, n in matrices:
        if (m + n) * rank * 2 < m * n:  # worth compressing: P (r m) in the first all-reduce, Q (r n) in the second
            first, second, kept = first + rank * m, second + rank * n, kept + m * n
        else:
            first += m * n
    x = lambda elements: 2 * ALPHA + 4 * elements / BETA  # noqa: E731 -- two islands
    price = _price(result, rank)
    assert price.cross_island_s == pytest.approx(x(first) + (x(second) if second else 0.0), rel=1e-9)
    # torch's state: the error feedback of whole buckets (every gradient) and the P and Q factors
    factors = first - vectors - (sum(m * n for m, n in matrices) - kept) + second
    assert price.extra_memory_bytes == 4 * (vectors + sum(m * n for m, n in matrices) + factors)
    if rank == 32:  # the 64 x 64 matrices would not shrink 2x at rank 32: sent whole
        assert kept < sum(m * n for m, n in matrices)
    if rank == 4:  # the plan's own (rank 4 by default), and what explain says of it
        s = plan.predicted["sync"]
        assert (s["mode"], s["rank"], s["start"]) == ("powersgd", 4, 1000)
        assert s["cross_island_s"] == pytest.approx(price.cross_island_s, rel=1e-12)


@pytest.mark.parametrize("options, needle", [
    ({"rank": 0}, "sync.options.rank is the rank of PowerSGD's gradient factors, 1 or more"),
    ({"start": 1}, "sync.options.start is the step from which PowerSGD compresses, 2 or more"),
    ({"every": 4}, "sync.options.every is not an option of the powersgd mode"),
])
def test_bad_powersgd_options_are_one_line(options, needle):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
    from test_plans_match_single_process import make_plan
    with pytest.raises(PlanError) as refused:
        Plan.from_dict({**make_plan(dp=2), "sync": {"mode": "powersgd", "options": options}})
    assert needle in str(refused.value) and "\n" not in str(refused.value)

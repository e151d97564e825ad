"""Fewer micro-batches than pipeline stages (issue #45 item 4): a 2-stage pipeline fed one micro-batch per step
is planned, as published runs use it, with GPipe (planner.plan.schedules: the one-chunk schedule torch runs with
m < pp, what --schedule auto tries there) and priced with its whole bubble; a fixed 1F1B keeps its one-line
refusal. The run: tests/e2e/test_fewer_microbatches_run.py."""
import numpy as np
import pytest

from partita.cli import main
from partita.costmodel.errors import PartitaError
from partita.planner.api import plan_search
from partita.planner.enumerate.candidates import _plain_schedule
from partita.planner.enumerate.space import TrainConfig
from partita.planner.plan.schedules import AUTO, SCHEDULES
from partita.planner.solve.milp import solve_stages

MODEL = "gpt:layers=6,hidden=64,heads=4,seq=32,vocab=256"
PINNED = dict(pp=2, micro_batch=2)  # global batch 2 on dp=1: one micro-batch of 2 over two stages


def _train(schedule: str = AUTO, global_batch: int = 2) -> TrainConfig:
    return TrainConfig(global_batch=global_batch, dtype="fp32", schedule=schedule)


def test_one_microbatch_over_two_stages_plans_gpipe_priced_with_its_bubble():
    result, plan = plan_search(MODEL, cluster="2xcpu", train=_train(), **PINNED)
    assert (plan.mesh.pp, plan.mesh.dp) == (2, 1)
    assert (plan.schedule.name, plan.schedule.num_microbatches, plan.schedule.micro_batch_size) == ("GPipe", 1, 2)
    c, gpipe = result.best, SCHEDULES["GPipe"]
    tau, m, pp = c.solution.stage_time, 1, 2
    assert tau.min() > 0  # both stages hold work
    # the registry's step: m max tau + (sum tau - max tau); with one micro-batch every stage runs once in turn,
    # (m + pp - 1) x the mean stage time, nothing overlapping
    assert gpipe.pipeline_s(m, tau) == pytest.approx((m + pp - 1) * tau.mean())
    assert plan.predicted["step_time_s"] == pytest.approx(gpipe.pipeline_s(m, tau) + c.solution.stage_flush.max())
    assert plan.predicted["breakdown"]["bubble_s"] == pytest.approx(tau.sum() - tau.max())
    assert c.problem.in_flight.tolist() == [1.0, 1.0]  # GPipe holds its one micro-batch on each rank


def test_a_fixed_1f1b_with_fewer_microbatches_than_stages_is_refused_in_1f1bs_words():
    with pytest.raises(PartitaError) as e:
        plan_search(MODEL, cluster="2xcpu", train=_train("1F1B"), **PINNED)
    assert str(e.value) == SCHEDULES["1F1B"].refusal(1, 2) and "\n" not in str(e.value)


def test_auto_plans_m_below_pp_where_nothing_else_runs():
    """Global batch 1 on 2 devices: dp=1, so pp=2 (one micro-batch) or tp=2; before, only tp=2 was tried."""
    _, plan = plan_search(MODEL, cluster="2xcpu", train=_train(global_batch=1), pp=2)
    assert (plan.mesh.pp, plan.schedule.name, plan.schedule.num_microbatches) == (2, "GPipe", 1)


def test_the_bound_of_every_candidate_with_m_below_pp_is_below_its_solved_step():
    """planner.search prunes a candidate whose lower bound is no better than the best step so far: a bound
    above the step would silently drop the right plan. Every candidate solved to the end, m < pp among them."""
    result, _ = plan_search(MODEL, cluster="4xcpu", train=_train(global_batch=4), pp=(2, 4))
    below = [c for c in result.candidates if c.num_microbatches < c.pp]
    assert {c.schedule for c in below} == {"GPipe"}
    assert {(c.pp, c.num_microbatches) for c in below} >= {(2, 1), (4, 1), (4, 2)}
    assert "GPipe" not in {c.schedule for c in result.candidates if c.num_microbatches >= c.pp}
    assert len(result.candidates) > len(below)
    for c in result.candidates:
        sol = solve_stages(c.problem)
        assert sol.feasible and c.lower_bound <= sol.objective * (1 + 1e-9), (c.pp, c.num_microbatches, c.schedule)


@pytest.mark.parametrize("requested,pp,m,expected", [
    (AUTO, 2, 1, "GPipe"), (AUTO, 4, 3, "GPipe"), (AUTO, 2, 2, "1F1B"), (AUTO, 1, 1, "1F1B"),
    ("1F1B", 2, 1, None), ("1F1B", 2, 4, "1F1B"), ("GPipe", 2, 1, "GPipe"), ("GPipe", 2, 8, "GPipe"),
    ("Interleaved1F1B", 2, 1, "GPipe"),  # (blocks and heterogeneous clusters plan one chunk per rank)
])
def test_one_chunk_candidates_take_the_schedule_the_registry_allows(requested, pp, m, expected):
    """Blocks and heterogeneous clusters (planner.enumerate.candidates._plain_schedule) read the same rule."""
    assert _plain_schedule(_train(requested), pp, m) == expected


def test_the_cli_prints_a_plan_where_m_below_pp_is_the_only_option(capsys):
    base = ["plan", "--model", MODEL, "--cluster", "2xcpu", "--global-batch", "2", "--dtype", "fp32", "--pp", "2",
            "--micro-batch", "2"]
    assert main(base) == 0
    out = capsys.readouterr().out
    assert "schedule     GPipe, 1 micro-batch of 2" in out and "pp=2 x dp=1" in out, out
    assert main([*base, "--schedule", "1F1B"]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == f"partita: error: {SCHEDULES['1F1B'].refusal(1, 2)}" and captured.out == ""


def test_gpipe_is_searched_only_where_1f1b_refuses():
    """With m >= pp 1F1B has GPipe's step and holds no more (planner.plan.schedules): auto leaves GPipe out."""
    for m, pp in [(m, pp) for pp in (2, 3, 4, 8) for m in range(1, 2 * pp + 1)]:
        gpipe, one_f = SCHEDULES["GPipe"], SCHEDULES["1F1B"]
        assert gpipe.searched(m, pp) == (one_f.refusal(m, pp) is not None), (m, pp)
        if m >= pp:
            assert gpipe.pipeline_s(m, np.ones(pp)) == one_f.pipeline_s(m, np.ones(pp))
            assert (one_f.in_flight(m, pp) <= gpipe.in_flight(m, pp)).all()

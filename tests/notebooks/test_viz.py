"""partita.report.viz: the data behind the notebooks' pictures (Pareto front, schedule simulator, candidate points).

The simulator is checked against the closed forms the planner's objective is built on (planner.solve.milp):
with p equal stages and m micro-batches, 1F1B and GPipe take (m + p - 1)(f + b), interleaving with v
chunks m (f + b) + (p - 1)(f + b) / v; with unequal stages the objective is an upper bound.
"""
from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

import partita.planner as planner
from partita.planner import TrainConfig
from partita.report import viz
from partita.planner.estimate.build import predicted


# ---- Pareto front ------------------------------------------------------------------------------

def test_pareto_front_keeps_the_fastest_point_for_each_memory():
    memory = [10, 20, 30, 15, 25, 30]
    time = [9.0, 5.0, 4.0, 9.5, 6.0, 3.0]
    front = viz.pareto_front(memory, time)
    assert front == [0, 1, 5]  # 15 GiB is slower than 10, 25 slower than 20, the 4 s at 30 loses to 3 s at 30
    for i in range(len(memory)):  # every point off the front is beaten by one on it
        if i not in front:
            assert any(memory[j] <= memory[i] and time[j] < time[i] for j in front) or \
                any(memory[j] == memory[i] and time[j] <= time[i] and j != i for j in front)


def test_pareto_front_edge_cases():
    assert viz.pareto_front([], []) == []
    assert viz.pareto_front([5.0], [1.0]) == [0]
    assert viz.pareto_front([1, 2, 3], [3, 2, 1]) == [0, 1, 2]       # every point a trade-off
    assert viz.pareto_front([1, 2, 3], [1, 2, 3]) == [0]             # one point dominates
    assert viz.pareto_front([1, 2], [5, 5]) == [0]                   # as fast with more memory: not on it


# ---- schedule orders ---------------------------------------------------------------------------

@pytest.mark.parametrize("schedule,p,m,v", [("1F1B", 4, 8, 1), ("1F1B", 4, 2, 1), ("GPipe", 3, 5, 1),
                                            ("Interleaved1F1B", 4, 8, 2), ("Interleaved1F1B", 2, 6, 4)])
def test_every_rank_runs_each_pass_once_forward_first(schedule, p, m, v):
    for r in range(p):
        order = viz.schedule_order(schedule, p, m, r, v)
        expected = {(k, i, c) for k in "FB" for i in range(m) for c in range(v)}
        assert sorted(order) == sorted(expected) and len(order) == len(expected)
        for i, c in itertools.product(range(m), range(v)):
            assert order.index(("F", i, c)) < order.index(("B", i, c))


def test_1f1b_warmup_is_p_minus_rank_minus_one_forwards():
    p, m = 4, 8
    for r in range(p):
        order = viz.schedule_order("1F1B", p, m, r)
        first_b = next(k for k, op in enumerate(order) if op[0] == "B")
        assert first_b == p - r  # p - r - 1 warm-up forwards, then one more forward before the first backward


def test_interleaved_needs_microbatches_divisible_by_stages():
    with pytest.raises(ValueError, match="divisible"):
        viz.schedule_order("Interleaved1F1B", 4, 6, 0, 2)
    with pytest.raises(ValueError, match="unknown schedule"):
        viz.schedule_order("ZeroBubble", 4, 8, 0)


# ---- simulator ---------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule", ["1F1B", "GPipe"])
@pytest.mark.parametrize("p,m", [(1, 1), (1, 5), (2, 2), (4, 8), (4, 3), (8, 16), (3, 7)])
def test_equal_stages_take_m_plus_p_minus_one_slots(schedule, p, m):
    f, b = 1.0, 2.0
    tl = viz.simulate_pipeline(schedule, m, [f] * p, [b] * p)
    assert tl.pipeline_s == pytest.approx((m + p - 1) * (f + b))
    assert len(tl.passes) == 2 * p * m


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 8, 4), (2, 16, 4), (8, 16, 2), (3, 6, 3), (4, 4, 2)])
def test_interleaving_shrinks_the_bubble_v_fold(p, m, v):
    f, b = 0.5, 1.25
    tl = viz.simulate_pipeline("Interleaved1F1B", m, [f] * p, [b] * p, virtual_stages=v)
    assert tl.pipeline_s == pytest.approx(m * (f + b) + (p - 1) * (f + b) / v)
    plain = viz.simulate_pipeline("1F1B", m, [f] * p, [b] * p)
    assert tl.pipeline_s < plain.pipeline_s
    # the planner's objective (planner.solve.milp) for equal stages tau = f + b
    tau = f + b
    assert tl.pipeline_s == pytest.approx((m - 1 / v) * tau + p * tau / v)


def _in_flight(tl: viz.Timeline, rank: int) -> int:
    """Most micro-batch activations rank `rank` holds at once (forwards finished, backwards not yet)."""
    events = sorted([(p.end, 1) for p in tl.passes if p.rank == rank and p.kind == "F"]
                    + [(p.end, -1) for p in tl.passes if p.rank == rank and p.kind == "B"], key=lambda e: (e[0], e[1]))
    held = peak = 0
    for _, d in events:
        held += d
        peak = max(peak, held)
    return peak


def test_1f1b_holds_at_most_p_minus_rank_microbatches_gpipe_all():
    p, m = 4, 8
    one = viz.simulate_pipeline("1F1B", m, [1.0] * p, [2.0] * p)
    gpipe = viz.simulate_pipeline("GPipe", m, [1.0] * p, [2.0] * p)
    for r in range(p):
        assert _in_flight(one, r) == min(p - r, m)   # the k_s of the planner's memory constraint
        assert _in_flight(gpipe, r) == m


@pytest.mark.parametrize("p,m,v", [(2, 16, 4), (4, 8, 2), (4, 16, 4), (8, 16, 2), (4, 4, 2)])
def test_interleaved_in_flight_follows_the_megatron_warmup(p, m, v):
    tl = viz.simulate_pipeline("Interleaved1F1B", m, [1.0] * p, [2.0] * p, virtual_stages=v)
    for r in range(p):  # in chunk activations: warm-up forwards, plus the one before the first backward
        assert _in_flight(tl, r) == min(2 * (p - r - 1) + (v - 1) * p + 1, m * v)
    if m * v >= 2 * (p - 1) + (v - 1) * p + 1:
        # rank 0 in whole micro-batches (v chunks each): p (1 + (p - 1) / (p v)), REFERENCE.md's factor with
        # Korthikanti et al.'s m read as the number of model chunks per rank
        assert _in_flight(tl, 0) / v == pytest.approx(p * (1 + (p - 1) / (p * v)))


@pytest.mark.parametrize("schedule,v", [("1F1B", 1), ("GPipe", 1), ("Interleaved1F1B", 2), ("Interleaved1F1B", 3)])
def test_dependencies_hold_and_objective_bounds_unequal_stages(schedule, v):
    rng = np.random.default_rng(7)
    for _ in range(40):
        p = int(rng.integers(2, 6))
        m = p * int(rng.integers(1, 4))
        tau = rng.uniform(0.2, 3.0, p)
        tl = viz.simulate_pipeline(schedule, m, tau / 3, 2 * tau / 3, virtual_stages=v)
        end = {(q.kind, q.microbatch, q.chunk * p + q.rank): q for q in tl.passes}
        last = p * v - 1
        for (kind, i, stage), q in end.items():
            dep = (("F", i, stage - 1) if stage > 0 else None) if kind == "F" else \
                (("F", i, last) if stage == last else ("B", i, stage + 1))
            if dep is not None:
                assert q.start >= end[dep].end - 1e-12
        for r in range(p):  # a rank runs one pass at a time
            mine = sorted((q.start, q.end) for q in tl.passes if q.rank == r)
            assert all(a[1] <= b[0] + 1e-12 for a, b in zip(mine, mine[1:]))
        # with the same forward:backward ratio on every stage the objective is an upper bound
        assert tl.pipeline_s <= ((m - 1 / v) * tau.max() + tau.sum() / v) * (1 + 1e-9)
        assert tl.pipeline_s >= m * tau.max() - 1e-9  # the slowest rank's own work


def test_simulate_rejects_bad_input():
    with pytest.raises(ValueError):
        viz.simulate_pipeline("1F1B", 4, [1.0, 1.0], [2.0])


# ---- a real search -----------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _cached_search(model: str):
    return planner.plan_search(model, cluster="4xcpu", train=TrainConfig(global_batch=16, dtype="fp32"))


@pytest.fixture
def search_of(two_tower):
    """small-gpt: identical layers (planner.solve.milp); two-tower: unlike blocks (planner.solve.milp_blocks)."""
    return lambda model: _cached_search(two_tower if model == "two-tower" else model)


def test_planner_in_flight_matches_the_simulated_interleaved_schedule():
    result, _ = planner.plan_search("small-gpt", cluster="4xcpu",
                                    train=TrainConfig(global_batch=16, dtype="fp32", schedule="Interleaved1F1B"))
    checked = 0
    for c in result.candidates:
        if c.virtual_stages > 1:
            tl = viz.simulate_pipeline(c.schedule, c.num_microbatches, [1.0] * c.pp, [2.0] * c.pp, c.virtual_stages)
            simulated = [_in_flight(tl, r) / c.virtual_stages for r in range(c.pp)]
            assert np.allclose(c.problem.in_flight, simulated), (c.key, c.problem.in_flight, simulated)
            checked += 1
    assert checked


@pytest.mark.parametrize("model", ["small-gpt", "two-tower"])
def test_candidate_points_cover_the_plan_and_leave_the_search_untouched(model, search_of):
    result, plan = search_of(model)
    before = [(c.solution is None, c.pruned) for c in result.candidates]
    points = viz.candidate_points(result)
    assert [(c.solution is None, c.pruned) for c in result.candidates] == before
    assert points == sorted(points, key=lambda p: (p.step_time_s, p.peak_memory_bytes))
    assert points[0].step_time_s == pytest.approx(plan.predicted["step_time_s"])
    assert any(not p.searched for p in points)  # the picture has more than the search solved
    assert all(p.peak_memory_bytes <= plan.predicted["memory_capacity_bytes"] * (1 + 1e-9) for p in points)
    assert {p.candidate.pp for p in points} > {1}


@pytest.mark.parametrize("model,formulation", [("small-gpt", "counts"), ("two-tower", "blocks")])
def test_timelines_reproduce_the_planner_step_time(model, formulation, search_of):
    result, plan = search_of(model)
    assert result.best.formulation == formulation
    tl = viz.plan_timeline(plan, result)
    assert (tl.num_stages, tl.num_microbatches, tl.virtual_stages) == \
        (plan.mesh.pp, plan.schedule.num_microbatches, plan.schedule.virtual_stages)
    assert tl.predicted_step_s == pytest.approx(plan.predicted["step_time_s"])
    for point in viz.candidate_points(result):
        c = point.candidate
        f, b = viz.stage_times(c)
        assert np.allclose(f + b, c.solution.stage_time) and (f > 0).all() and (b > f).all()
        tl = viz.candidate_timeline(c)
        assert tl.step_s <= c.step_time * (1 + 1e-6)
        if c.pp == 1:
            assert tl.step_s == pytest.approx(c.step_time, rel=1e-9)


def test_find_candidate_rejects_a_plan_from_another_search():
    result, plan = _cached_search("small-gpt")
    other = planner.plan("tiny-gpt", cluster="2xcpu", train=TrainConfig(global_batch=8, dtype="fp32"))
    if (other.mesh.pp, other.mesh.dp, other.mesh.tp) != (plan.mesh.pp, plan.mesh.dp, plan.mesh.tp):
        with pytest.raises(ValueError, match="no solved candidate"):
            viz.find_candidate(other, result)


def test_replan_equals_planning_from_scratch():
    result, plan = _cached_search("small-gpt")
    train = TrainConfig(global_batch=8, dtype="fp32")
    _, again = viz.replan(result, plan, cluster="2xcpu", train=train)
    fresh = planner.plan("small-gpt", cluster="2xcpu", train=train)
    assert again.canonical_json() == fresh.canonical_json()  # byte for byte, measured wall times aside
    with pytest.raises(ValueError, match="seq"):
        viz.replan(result, plan, train=TrainConfig(global_batch=16, seq_len=32, dtype="fp32"))


def test_summary_table():
    _, plan = _cached_search("small-gpt")
    row = viz.plan_summary(plan)
    assert row["devices"] == 4 and row["mesh"] == f"{plan.mesh.pp}x{plan.mesh.dp}x{plan.mesh.tp}"
    text = viz.format_table([row, row])
    assert len(text.splitlines()) == 3 and "mesh" in text.splitlines()[0]


def test_plots_draw(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    result, plan = _cached_search("small-gpt")
    points = viz.candidate_points(result)
    try:
        viz.plot_candidates(points, chosen=plan)
        viz.plot_timeline(viz.plan_timeline(plan, result))
        viz.plot_timeline(viz.simulate_pipeline("Interleaved1F1B", 4, [1.0, 1.0], [2.0, 2.0], 2))
        viz.plot_memory({"plan": plan, "other": predicted(result, points[-1].candidate)})
        viz.plot_scaling([plan])
        with pytest.raises(ValueError, match="baselines"):
            viz.plot_baselines(plan)
        plt.gcf().savefig(tmp_path / "last.png")
    finally:
        plt.close("all")

"""Where the stage program stops (planner.solve.milp): at the first plan the whole-layer bound proves within the
gap, and a polish that keeps the plan's split of layers over stages.

On a deep pipeline HiGHS finds the plan at once and then spends its nodes proving it: llama3-405b on 8,192
H100s took 1,332 nodes for a 0.5% gap that planner.solve.bounds' whole-layer bound (0.09% below the optimum)
proves at the first incumbent. Node counts are deterministic, so they are what these tests compare.
"""
import dataclasses

import highspy
import numpy as np
import pytest

from partita.planner import TrainConfig
from partita.planner.api import plan_search
from partita.planner.solve import milp
from partita.planner.solve.bounds import stage_bound
from partita.planner.solve.milp import StageProblem, StageSolution, evaluate, polish, solve_stages
from tests.planner.test_milp_exact import brute_force, random_problem


@pytest.fixture(scope="module")
def deep_pipeline() -> StageProblem:
    """The stage program of llama3-405b's plan on 8,192 H100s: 16 stages of 7-8 layers, 6 options each."""
    result, _ = plan_search("llama3-405b", cluster="1024x8xH100-80GB", train=TrainConfig(global_batch=2048))
    prob = result.best.problem
    assert prob.num_stages >= 8 and prob.num_layers <= 8 * prob.num_stages
    return prob


@pytest.fixture
def nodes(monkeypatch):
    """The branch-and-bound nodes of every HiGHS run, in order."""
    counted, run = [], highspy.Highs.run

    def counting_run(self):
        out = run(self)
        counted.append(int(self.getInfo().mip_node_count))
        return out
    monkeypatch.setattr(highspy.Highs, "run", counting_run)
    return counted


def test_a_deep_pipeline_stops_at_the_first_plan_the_whole_layer_bound_proves(deep_pipeline, nodes, monkeypatch):
    """At the root here (0 nodes); HiGHS alone, proving the 0.5% gap with its own bound, reached its 2,000-node
    limit on this program."""
    prob = deep_pipeline
    stopped = solve_stages(prob)
    proven = stage_bound(prob, whole=True)
    assert stopped.status == "optimal"
    assert stopped.mip_gap == pytest.approx(1 - proven / stopped.objective)
    assert stopped.mip_gap <= prob.mip_rel_gap
    searched = solve_stages(dataclasses.replace(prob, mip_rel_gap=1e-5))  # the bound cannot stop this: 2,000 nodes
    assert searched.objective <= stopped.objective <= searched.objective * (1 + prob.mip_rel_gap)
    monkeypatch.setattr(milp, "stage_bound", lambda p, whole=False: 0.0)  # no bound: HiGHS proves the gap itself
    alone = solve_stages(prob)
    assert alone.objective >= searched.objective
    stop_nodes, alone_nodes = nodes[0], nodes[2]
    assert stop_nodes * 10 < alone_nodes, nodes


@pytest.mark.parametrize("seed", range(30))
def test_a_stop_by_the_bound_is_within_the_gap_of_the_enumerated_optimum(seed):
    rng = np.random.default_rng(9100 + seed)
    p = int(rng.integers(2, 4))
    prob = random_problem(rng, p, int(rng.integers(p, 7)), int(rng.integers(2, 4)))
    prob.mip_rel_gap = 0.05  # loose, so that the bound's stop is taken where it can be
    optimum, sol = brute_force(prob), solve_stages(prob)
    assert sol.feasible == np.isfinite(optimum)
    if sol.feasible:
        assert optimum * (1 - 1e-9) <= sol.objective <= optimum / (1 - prob.mip_rel_gap) * (1 + 1e-9)
        assert sol.mip_gap <= prob.mip_rel_gap + 1e-12


def _two_stages(microbatches: int = 4) -> StageProblem:
    """2 stages, 4 layers. Option 0 is plain (1 s, 2 bytes); option 1 offloads: as fast, 1 byte, rank 1. Stage 0
    has room for 3 plain layers, stage 1 for 1 plain layer and a second offloaded one."""
    return StageProblem(num_stages=2, num_layers=4, num_microbatches=microbatches, option_time=np.array([1.0, 1.0]),
                        option_state=np.array([2.0, 1.0]), option_act=np.zeros(2), option_flush=np.zeros(2),
                        extra_time=np.zeros(2), extra_mem=np.array([0.0, 3.0]), extra_flush=np.zeros(2),
                        in_flight=np.ones(2), capacity=6.0, option_rank=np.array([0.0, 1.0]))


def _solution(prob: StageProblem, counts) -> StageSolution:
    counts = np.array(counts)
    return StageSolution(status="optimal", objective=evaluate(prob, counts), counts=counts)


def test_the_polish_drops_machinery_that_buys_nothing_within_each_stage():
    prob = _two_stages()
    start = _solution(prob, [[0, 2], [1, 1]])  # two layers offloaded on stage 0 for nothing
    polished = polish(prob, start)
    assert polished.counts.tolist() == [[2, 0], [1, 1]]
    assert polished.objective <= start.objective


def test_the_polish_keeps_the_split_of_layers_over_stages():
    """With one micro-batch the step is the sum of the stages' times, whatever the split, so [[3, 0], [1, 0]]
    would be as fast with no offload at all; but it moves a layer from stage 1 to stage 0, and the polish
    re-chooses options inside each stage only (the free version took 2 s of nodes on llama3-405b)."""
    prob = _two_stages(microbatches=1)
    start = _solution(prob, [[0, 2], [0, 2]])
    assert evaluate(prob, np.array([[3, 0], [1, 0]])) == start.objective
    polished = polish(prob, start)
    assert polished.counts.sum(axis=1).tolist() == [2, 2]
    assert polished.counts.tolist() == [[2, 0], [1, 1]]

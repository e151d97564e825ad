"""The compressed sync mode on the planner's side (planner.plan.sync COMPRESSED, planner.estimate.sync.compressed):
synchronous data parallelism with the gradients all-reduced in bf16.

- Across two islands over a slow link, among synchronous and compressed the planner picks compressed, and its
  exposed cross-island time is X(P x 2 bytes) = 2 (I-1) alpha + 2 (I-1)/I x 2P / beta, against synchronous's X(4P).
- "auto" on that link still picks DiLoCo (the outer all-reduce every H steps moves less), and prices compressed
  beside it; on one island "auto" leaves the plan synchronous and does not price compressed at all.
- Asked for by name on one island, it is priced there: the in-island exposed seconds halve (fp32 gradients).
- It runs on DDP plans only: a ZeRO-3 plan says so in one line (`not_executed`).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_diloco_price import SLOW, _plan  # noqa: E402


@pytest.fixture(scope="module")
def plans():
    return {"slow_choice": _plan(SLOW, sync=("synchronous", "compressed")), "slow_sync": _plan(SLOW, sync="synchronous"),
            "slow_auto": _plan(SLOW), "one_auto": _plan("2xcpu"), "one_sync": _plan("2xcpu", sync="synchronous"),
            "one_compressed": _plan("2xcpu", sync="compressed")}


def test_on_a_slow_link_compressed_beats_synchronous_at_half_the_bytes(plans):
    chosen, sync = plans["slow_choice"], plans["slow_sync"]
    assert chosen.sync.mode == "compressed" and chosen.sync.options == {}
    params, alpha, beta = chosen.model["parameters"], 5e-3, 0.1e9 / 8
    s = chosen.predicted["sync"]
    assert s["cross_island_bytes"] == 2 * params
    # X(B) = 2 (I-1) alpha + 2 (I-1)/I B / beta with I = 2 islands and B = 2P bytes
    assert s["cross_island_s"] == pytest.approx(2 * alpha + 2 * params / beta, rel=1e-9)
    full = sync.predicted["sync"]
    assert full["cross_island_bytes"] == 4 * params  # the same latency, twice the bandwidth term
    assert full["cross_island_s"] - 2 * alpha == pytest.approx(2 * (s["cross_island_s"] - 2 * alpha), rel=1e-9)
    assert chosen.predicted["step_time_s"] < sync.predicted["step_time_s"]
    assert s["priced"]["synchronous"] == pytest.approx(sync.predicted["step_time_s"], rel=1e-9)


def test_auto_keeps_diloco_on_the_slow_link_and_synchronous_on_one_island(plans):
    auto = plans["slow_auto"]
    assert auto.sync.mode == "diloco" and isinstance(auto.predicted["sync"]["priced"]["compressed"], float)
    assert auto.predicted["sync"]["priced"]["compressed"] > auto.predicted["step_time_s"]
    one, one_sync = plans["one_auto"], plans["one_sync"]
    assert one.sync.is_default and "sync" not in one.predicted
    assert one.predicted["step_time_s"] == one_sync.predicted["step_time_s"]


def test_named_on_one_island_the_in_island_seconds_halve_and_the_report_says_bf16(plans):
    from partita.planner.plan.explain import explain
    named, sync = plans["one_compressed"], plans["one_sync"]
    assert named.sync.mode == "compressed"
    before = sync.predicted["breakdown"]["dp_comm_s"]
    assert before > 0 and named.predicted["breakdown"]["dp_comm_s"] == pytest.approx(before / 2, rel=1e-9)
    assert named.predicted["step_time_s"] == pytest.approx(sync.predicted["step_time_s"] - before / 2, rel=1e-9)
    assert "sync: compressed -- the gradients in bf16 all-reduced every step on one island" in explain(named, 10_000)


def test_a_sharded_plan_says_the_runtime_does_not_run_it():
    from partita.planner.api import plan_search
    from partita.planner.enumerate.space import SearchSpace, TrainConfig
    p = plan_search("tiny-gpt", cluster="2xcpu", train=TrainConfig(global_batch=4),
                    space=SearchSpace(dp=(2,), zero=(3,), sync="compressed"))[1]
    assert p.sync.mode == "compressed"
    assert "compressed with zero=3 is not run by partita's runtime" in p.solver["not_executed"]

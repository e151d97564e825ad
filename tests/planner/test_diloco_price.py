"""Islands and the DiLoCo sync mode on the planner's side (costmodel.hardware islands, costmodel.price.comm's
cross-island term, planner.estimate.sync, planner.plan.sync).

- Island clusters parse from a string (ISLANDSx<cluster>@LINK) and from a resource list; every older string and
  list parses as before, with one island; malformed or uneven islands are one line.
- On two islands over a slow link the planner picks DiLoCo over synchronous DP, and its exposed cross-island
  time per step is 2 (I-1) alpha + 2 (I-1)/I * P bits/8 / beta, over H; synchronous pays P * 4 bytes every step.
- On one island the plan stays synchronous with the prediction it had (no sync entry).
- DiLoCo's memory adds exactly the fp32 anchor and outer momentum: 8 bytes per parameter of the rank.
- A DiLoCo plan round-trips with its sync section; a bad H or option is one line at load.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from partita.costmodel import PartitaError
from partita.costmodel.hardware import parse_cluster
from partita.costmodel.hardware.resources import cluster_from_dict, cluster_to_dict
from partita.planner.plan import Plan, PlanError
from partita.planner.plan.sync import Sync

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from test_plans_match_single_process import make_plan  # noqa: E402

SLOW = "2x1xcpu@0.1Gbps,5ms"   # two islands of one CPU rank, 12.5 MB/s and 5 ms between them


def test_island_strings_and_lists_parse_and_older_ones_are_unchanged():
    c = parse_cluster("2x8x8xH100-80GB@2x100Gbps,20ms")
    assert (c.islands, c.nodes, c.devices_per_node, c.island_devices) == (2, 16, 8, 64)
    assert (c.island_bw, c.island_latency) == (25e9, 0.02)
    assert parse_cluster("2x64xH100-80GB@2x100Gbps,20ms").island_devices == 64
    for old in ("8xA100-80GB", "128x8xA100-80GB", "4xcpu"):
        assert parse_cluster(old).islands == 1 and "islands" not in parse_cluster(old).describe()
    lst = {"schema": "partita.cluster/1", "groups": [{"name": "a", "nodes": 2, "devices_per_node": 8, "device": "H100-80GB"},
                                                     {"name": "b", "nodes": 2, "devices_per_node": 8, "device": "H100-80GB"}],
           "islands": {"bandwidth": 2.5e10, "latency": 0.02}}
    c = cluster_from_dict(lst)
    assert (c.islands, c.island_bw, c.island_devices) == (2, 2.5e10, 16)
    assert cluster_from_dict(cluster_to_dict(c)).islands == 2
    one = {**lst, "groups": lst["groups"][:1], "islands": {"bandwidth": 1e9, "count": 2}}
    assert cluster_from_dict(one).islands == 2


@pytest.mark.parametrize("bad, needle", [
    ("2x8xH100-80GB@fast", "malformed island cluster"),
    ("1x8xH100-80GB@1Gbps", "needs 2 or more islands"),
    ({"groups": [{"name": "a", "nodes": 2, "devices_per_node": 8, "device": "H100-80GB"},
                 {"name": "b", "nodes": 1, "devices_per_node": 8, "device": "H100-80GB"}],
      "islands": {"bandwidth": 1e9}}, "needs 2 or more groups of equal size"),
    ({"groups": [{"name": "a", "nodes": 3, "devices_per_node": 8, "device": "H100-80GB"}],
      "islands": {"bandwidth": 1e9, "count": 2}}, "must split one group's nodes evenly"),
])
def test_islands_that_do_not_add_up_are_one_line(bad, needle):
    with pytest.raises(PartitaError) as refused:
        parse_cluster(bad) if isinstance(bad, str) else cluster_from_dict({"schema": "partita.cluster/1", **bad})
    assert needle in str(refused.value) and "\n" not in str(refused.value)


def _plan(cluster: str, **space):
    from partita.planner.api import plan_search
    from partita.planner.enumerate.space import SearchSpace, TrainConfig
    return plan_search("tiny-gpt", cluster=cluster, train=TrainConfig(global_batch=4),
                       space=SearchSpace(dp=(2,), zero=(0,), **space))[1]


@pytest.fixture(scope="module")
def plans():
    return {"slow": _plan(SLOW), "slow_sync": _plan(SLOW, sync="synchronous"), "one": _plan("2xcpu"),
            "one_sync": _plan("2xcpu", sync="synchronous"), "h7": _plan(SLOW, sync="diloco", sync_every=7, sync_bits=16)}


def test_on_a_slow_link_diloco_is_chosen_and_priced_by_the_formula(plans):
    slow, sync = plans["slow"], plans["slow_sync"]
    params = slow.model["parameters"]
    alpha, beta = 5e-3, 0.1e9 / 8
    assert slow.sync.mode == "diloco" and sync.sync.mode == "synchronous"
    every = slow.sync.options["every"]
    s = slow.predicted["sync"]
    assert s["every"] == every and s["islands"] == 2
    # I = 2: 2 (I-1) alpha + 2 (I-1)/I B / beta = 2 alpha + B / beta; B = P * 32/8 for DiLoCo, over H
    assert s["cross_island_s"] == pytest.approx((2 * alpha + params * 4 / beta) / every, rel=1e-12)
    assert slow.predicted["breakdown"]["cross_island_s"] == s["cross_island_s"]
    assert sync.predicted["sync"]["cross_island_s"] == pytest.approx(2 * alpha + params * 4 / beta, rel=1e-12)
    assert slow.predicted["step_time_s"] < sync.predicted["step_time_s"]
    assert s["priced"]["synchronous"] == pytest.approx(sync.predicted["step_time_s"], rel=1e-12)
    # a fixed H and a 16-bit outer all-reduce: half the bytes, over 7 steps
    h7 = plans["h7"].predicted["sync"]
    assert plans["h7"].sync.options == {"every": 7, "bits": 16}
    assert h7["cross_island_s"] == pytest.approx((2 * alpha + params * 2 / beta) / 7, rel=1e-12)


def test_on_one_island_synchronous_stays_with_its_prediction(plans):
    one, asked = plans["one"], plans["one_sync"]
    assert one.sync == Sync() and "sync" not in one.to_dict() and "sync" not in one.predicted
    assert one.predicted == asked.predicted and "cross_island_s" not in one.predicted["breakdown"]
    with pytest.raises(PartitaError, match="diloco trains islands apart"):
        _plan("2xcpu", sync="diloco")


def test_diloco_memory_adds_exactly_the_anchor_and_momentum(plans):
    slow, sync = plans["slow"], plans["slow_sync"]
    extra = 8 * slow.model["parameters"]  # fp32 anchor + fp32 momentum; tp = pp = 1, zero 0: unsharded
    assert slow.predicted["sync"]["extra_memory_bytes"] == extra
    assert slow.predicted["peak_memory_bytes"] - sync.predicted["peak_memory_bytes"] == extra


def test_the_envelope_refuses_an_h_beyond_the_published_range_unless_allowed():
    with pytest.raises(PartitaError, match="outside the published envelope"):
        _plan(SLOW, sync="diloco", sync_every=501)
    assert _plan(SLOW, sync="diloco", sync_every=501, sync_allow_any_every=True).sync.options["every"] == 501


def test_a_diloco_plan_round_trips_and_bad_options_are_one_line(plans, tmp_path):
    path = tmp_path / "p.json"
    plans["slow"].save(path)
    again = Plan.load(path)
    assert again.sync == plans["slow"].sync and again.to_json() == plans["slow"].to_json()
    assert json.loads(path.read_text())["sync"] == {"mode": "diloco", "options": {"every": plans["slow"].sync.options["every"]}}
    base = make_plan(dp=2)
    for options, needle in (({}, "sync.options.every (H, the inner steps per outer step) is required"),
                            ({"every": 0}, "sync.options.every is the inner steps per outer step (H), 1 or more"),
                            ({"every": 4, "bits": 8}, "sync.options.bits is the outer all-reduce's bit width, 4, 16 or 32"),
                            ({"every": 4, "outer_momentum": 1.5}, "sync.options.outer_momentum must be in [0, 1)"),
                            ({"every": 4, "outer_lr": 0}, "sync.options.outer_lr must be a number more than 0"),
                            ({"every": 4, "inner": "adam"}, "sync.options.inner is not an option of the diloco mode")):
        with pytest.raises(PlanError) as refused:
            Plan.from_dict({**base, "sync": {"mode": "diloco", "options": options}})
        assert needle in str(refused.value) and "\n" not in str(refused.value)


def test_a_diloco_plan_the_runtime_does_not_run_says_so():
    """The runtime runs DiLoCo on data-parallel replicas, with DDP, tensor parallelism (zero 0) or FSDP inside each
    island: a ZeRO-1 DiLoCo plan is priced and marked not executed, a ZeRO-2 one is executable."""
    from partita.planner.api import plan_search
    from partita.planner.enumerate.space import SearchSpace, TrainConfig
    from partita.planner.plan.executable import sync_refusal

    def diloco(zero: int):
        return plan_search("tiny-gpt", cluster=SLOW, train=TrainConfig(global_batch=4),
                           space=SearchSpace(dp=(2,), zero=(zero,), sync="diloco"))[1]
    one, two = diloco(1), diloco(2)
    assert one.sync.mode == "diloco" and "diloco with zero=1 is not run by partita's runtime" in one.solver["not_executed"]
    assert "FSDP with ZeRO 2 or 3 inside each island" in one.solver["not_executed"]
    assert two.sync.mode == "diloco" and "not_executed" not in two.solver
    # ZeRO-2 inside islands of one replica: FSDP shards nothing (dp / I = 1), so besides the anchor and momentum
    # (8 bytes a parameter) each rank holds the other half of the gradients and Adam's moments the estimator
    # sharded over dp = 2: (4 + 8) / 2 bytes a parameter more
    params = two.model["parameters"]
    assert two.predicted["sync"]["extra_memory_bytes"] == 8 * params + 12 * params // 2
    assert "diloco with tp=2 is not run" in sync_refusal("diloco", tp=2, zero=3)
    assert "compressed with zero=2 is not run" in sync_refusal("compressed", zero=2)
    # tensor parallelism inside each replica runs at zero 0 (each tp rank's shard crosses to its peers), for the
    # outer-step modes alone: the compressed and powersgd modes are DDP hooks
    assert sync_refusal("diloco", tp=2) is None and sync_refusal("streaming", tp=4) is None
    assert "compressed with tp=2 is not run" in sync_refusal("compressed", tp=2)
    # and pipeline parallelism (zero 0): each stage's parameters cross to the same stage in the other islands
    assert sync_refusal("streaming", tp=2, pp=2) is None and sync_refusal("diloco", pp=4) is None
    assert "diloco with pp=2 is not run" in sync_refusal("diloco", pp=2, zero=3)
    assert "streaming with cp=2 is not run" in sync_refusal("streaming", pp=2, cp=2)
    assert "compressed with pp=2 is not run" in sync_refusal("compressed", pp=2)


def test_the_cross_island_term_counts_islands_spanned_and_the_ring_factors():
    from partita.costmodel.price import comm
    c = parse_cluster("4x2x8xH100-80GB@400Gbps,10ms")   # 4 islands of 16 devices, 50e9 bytes/s, 10 ms
    assert [comm.islands_spanned(c, n) for n in (1, 16, 17, 32, 64, 128)] == [1, 1, 2, 2, 4, 4]
    assert comm.cross_island_all_reduce(c, 4, 1e9) == pytest.approx(2 * 3 * 0.01 + 2 * 3 / 4 * 1e9 / 50e9)
    assert comm.cross_island_all_reduce(c, 1, 1e9) == 0.0
    assert comm.islands_spanned(parse_cluster("8x8xH100-80GB"), 64) == 1


def test_an_export_of_a_diloco_plan_says_the_mode_has_no_equivalent(plans):
    from partita.export import export
    for fmt, tool in (("megatron", "Megatron-LM"), ("torchtitan", "torchtitan")):
        text = export(plans["slow"], fmt)
        assert f"the diloco sync mode (H = {plans['slow'].sync.options['every']}) has no {tool} equivalent" in text
        assert "sync mode" not in export(plans["one"], fmt)


def test_local_sgd_is_asked_for_by_name_and_holds_the_anchor_alone(plans):
    """localsgd: DiLoCo's all-reduce every H steps at its price, holding the fp32 anchor without an outer momentum
    (4 bytes a parameter, not 8); `--sync auto` does not choose it (no envelope cited), an H beyond DiLoCo's is the
    user's, and the outer optimizer is not an option of it."""
    slow = plans["slow"]
    local = _plan(SLOW, sync="localsgd", sync_every=slow.sync.options["every"])
    s, d = local.predicted["sync"], slow.predicted["sync"]
    assert local.sync.mode == "localsgd" and s["cross_island_s"] == pytest.approx(d["cross_island_s"], rel=1e-12)
    assert s["extra_memory_bytes"] == 4 * slow.model["parameters"] == d["extra_memory_bytes"] // 2
    assert slow.sync.mode == "diloco" and "localsgd" not in d["priced"]  # auto priced the others only
    assert _plan(SLOW, sync="localsgd", sync_every=1000).sync.options["every"] == 1000
    with pytest.raises(PlanError, match="sync.options.outer_lr is not an option of the localsgd mode"):
        Plan.from_dict({**make_plan(dp=2), "sync": {"mode": "localsgd", "options": {"every": 4, "outer_lr": 0.7}}})

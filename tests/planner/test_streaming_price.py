"""Streaming DiLoCo on the planner's side (planner.estimate.sync.streaming, planner.plan.sync's registry entry).

On two islands of one CPU rank over a 12.5 MB/s, 5 ms link, with the fragment count F, the overlap tau and H fixed:
- each fragment's all-reduce costs X = 2 alpha + (P bits/8 / F) / beta; tau inner steps of T seconds (the step
  without its synchronisation) hide min(X, tau T) of it, and the exposed rest comes F times every H steps;
- the memory adds DiLoCo's anchor and outer momentum (8 bytes per parameter) and the fragment in flight;
- tau = 0 exposes the whole all-reduce; more fragments cut the bytes of each all-reduce by F;
- `partita plan --sync streaming --sync-every/--sync-fragments/--sync-delay` writes those options and explains
  what crosses the link, how often and how much of it hides;
- options that do not fit each other are one line.
"""
from __future__ import annotations

import json

import pytest

from partita import cli
from partita.planner.plan import Plan, PlanError

SLOW = "2x1xcpu@0.1Gbps,5ms"
ALPHA, BETA = 5e-3, 0.1e9 / 8


def _plan(**space):
    from partita.planner.api import plan_search
    from partita.planner.enumerate.space import SearchSpace, TrainConfig
    return plan_search("tiny-gpt", cluster=SLOW, train=TrainConfig(global_batch=4),
                       space=SearchSpace(dp=(2,), zero=(0,), **space))[1]


@pytest.fixture(scope="module")
def plans():
    return {"f2": _plan(sync="streaming", sync_every=8, sync_fragments=2, sync_delay=1),
            "f2_blocking": _plan(sync="streaming", sync_every=8, sync_fragments=2, sync_delay=0),
            "diloco": _plan(sync="diloco", sync_every=8),
            "f2_bits4": _plan(sync="streaming", sync_every=8, sync_fragments=2, sync_delay=1, sync_bits=4),
            "diloco_bits4": _plan(sync="diloco", sync_every=8, sync_bits=4)}


def test_each_fragments_all_reduce_hides_behind_tau_steps_and_the_rest_is_exposed(plans):
    p = plans["f2"]
    params, s = p.model["parameters"], p.predicted["sync"]
    assert p.sync.options == {"every": 8, "fragments": 2, "delay": 1}
    assert (s["every"], s["fragments"], s["delay"], s["islands"]) == (8, 2, 1, 2)
    one = 2 * ALPHA + params * 4 / 2 / BETA
    compute = p.predicted["step_time_s"] - s["cross_island_s"]  # one replica per island: no in-island sync
    assert s["hidden_s"] == pytest.approx(min(one, compute), rel=1e-9)
    assert s["cross_island_s"] == pytest.approx((one - s["hidden_s"]) * 2 / 8, rel=1e-9)
    assert s["cross_island_bytes"] == pytest.approx(params * 4 / 2)
    assert s["extra_memory_bytes"] == 8 * params + params * 4 // 2
    blocking = plans["f2_blocking"].predicted["sync"]
    assert blocking["hidden_s"] == 0 and blocking["cross_island_s"] == pytest.approx(one * 2 / 8, rel=1e-9)
    # DiLoCo at the same H sends the whole change at once: one latency, no overlap
    diloco = plans["diloco"].predicted["sync"]
    assert diloco["cross_island_s"] == pytest.approx((2 * ALPHA + params * 4 / BETA) / 8, rel=1e-9)


def test_at_4_bits_the_wire_is_4_5_bits_per_element_and_only_its_first_phase_hides(plans):
    """bits 4 (runtime.loop.sync.four_bit): 4 bits and an fp32 scale per 64 elements, in two phases that move what a
    ring all-reduce of as many bits does; streaming overlaps the first phase only (the all-gather runs at the
    merge), and holds the fragment's fp32 change and its codes while it is in flight."""
    params = plans["f2_bits4"].model["parameters"]
    s, d = plans["f2_bits4"].predicted["sync"], plans["diloco_bits4"].predicted["sync"]
    wire = params * 4.5 / 8
    assert plans["f2_bits4"].sync.options == {"every": 8, "fragments": 2, "delay": 1, "bits": 4}
    assert d["cross_island_bytes"] == pytest.approx(wire)
    assert d["cross_island_s"] == pytest.approx((2 * ALPHA + wire / BETA) / 8, rel=1e-9)
    one = 2 * ALPHA + wire / 2 / BETA
    compute = plans["f2_bits4"].predicted["step_time_s"] - s["cross_island_s"]
    assert s["cross_island_bytes"] == pytest.approx(wire / 2)
    assert s["hidden_s"] == pytest.approx(min(one / 2, compute), rel=1e-9)
    assert s["cross_island_s"] == pytest.approx((one - s["hidden_s"]) * 2 / 8, rel=1e-9)
    assert s["extra_memory_bytes"] == 8 * params + int(params * (32 + 4.5) / 8 / 2)
    from partita.planner.plan.explain import sync_lines
    said = " ".join(t.plain for t in sync_lines(plans["f2_bits4"]))
    assert "2 fragments, delay 1, 4-bit (all-to-all, then all-gather at the merge) across 2 islands" in said, said
    assert "4-bit (all-to-all, then all-gather) across 2 islands" in " ".join(
        t.plain for t in sync_lines(plans["diloco_bits4"]))
    # 7x fewer bytes than fp32's change
    assert plans["diloco"].predicted["sync"]["cross_island_bytes"] / d["cross_island_bytes"] == pytest.approx(32 / 4.5)


def test_the_cli_writes_the_options_and_explains_the_overlap(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert cli.main(["plan", "--model", "tiny-gpt", "--cluster", SLOW, "--global-batch", "4", "--dp", "2", "--zero",
                     "0", "--sync", "streaming", "--sync-every", "8", "--sync-fragments", "2", "--sync-delay", "1",
                     "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert json.loads(out.read_text())["sync"] == {"mode": "streaming",
                                                   "options": {"every": 8, "fragments": 2, "delay": 1}}
    assert "sync: streaming, H = 8, 2 fragments, delay 1 across 2 islands" in text
    assert "all-reduced over the island link every 4 step(s), overlapped with the next 1 step(s)" in text
    assert cli.main(["plan", "--model", "tiny-gpt", "--cluster", SLOW, "--global-batch", "4", "--sync", "streaming",
                     "--sync-every", "8", "--sync-fragments", "0"]) == 2
    assert "sync-fragments must be a whole number from 1; got 0" in capsys.readouterr().err


@pytest.mark.parametrize("options, needle", [
    ({"every": 4, "fragments": 5}, "sync.options.fragments (5) must be from 1 to H = 4"),
    ({"every": 8}, None),
    ({"every": 4}, "sync.options.delay (1) must be less than H / fragments = 1"),
    ({"every": 8, "delay": 2}, "sync.options.delay (2) must be less than H / fragments = 2"),
    ({"every": 8, "alpha": 1.5}, "sync.options.alpha is the share of the local fragment kept at the merge"),
    ({"fragments": 2}, "sync.options.every (H, the inner steps per outer step) is required by the streaming mode"),
    ({"every": 8, "islands": 2, "tau": 1}, "sync.options.tau is not an option of the streaming mode"),
])
def test_streaming_options_that_do_not_fit_are_one_line(options, needle):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
    from test_plans_match_single_process import make_plan
    data = {**make_plan(dp=2), "sync": {"mode": "streaming", "options": options}}
    if needle is None:
        assert Plan.from_dict(data).sync.option("fragments") == 4
        return
    with pytest.raises(PlanError) as refused:
        Plan.from_dict(data)
    assert needle in str(refused.value) and "\n" not in str(refused.value)


def test_the_planner_skips_ladder_rungs_the_defaults_do_not_fit():
    """With the default 4 fragments and delay 1, H = 10 leaves 2 steps between fragments: allowed. Asked for H = 4
    with those defaults, the mode is refused in one line that says why."""
    from partita.costmodel import PartitaError
    assert _plan(sync="streaming").sync.options["every"] >= 8
    with pytest.raises(PartitaError, match=r"streaming: sync.options.delay \(1\) must be less than H / fragments = 1"):
        _plan(sync="streaming", sync_every=4)

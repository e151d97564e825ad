"""Streaming DiLoCo's runtime hook (runtime.loop.sync.diloco.StreamingDiLoCo, issue 42's asynchronous mode) on real 2-rank
gloo runs, each rank its own island (the plan's dp = 2 replicas, tests/rank_pool.py; tests/runtime/sync_job.py's
probes record each rank's parameter checksum, whole and per fragment, after every optimizer step). Seeds: the
runs' default (--seed 0), plain SGD at lr 0.5 unless a test says otherwise.

- One fragment, delay 0 and alpha 0 is DiLoCo: the same losses and parameters, bit for bit, at H = 4 with the
  published outer step (Nesterov, lr 0.7, momentum 0.9).
- Two fragments at H = 4, delay 1, alpha 0: fragment 1 (offset 2) sends after steps 2 and 6 and merges after 3 and
  7; fragment 0 sends after step 4 and merges after 5. A fragment's parameters are the same on both replicas right
  after its merges (both take the global weights) and differ at every other step, and the global weights move
  between a fragment's merges; the losses fall on a learnable token file. A skipped all-reduce or outer step, a
  wrong offset or a merge at the wrong step fails.
- Checkpoints fall anywhere: 8 steps with Adam, alpha 0.5, straight, against 4 steps (whose last checkpoint holds
  fragment 0's all-reduce in flight) and 4 more resumed: the same losses, bit for bit.
- The same at 4 bits (runtime.loop.sync.four_bit): the checkpoint lands the exchange's second phase first.
- --verify outside the H = 1 identity, or at 4 bits, is one line before training.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "runtime"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from test_diloco_runs import STEPS, _learnable, _run, adam_runs  # noqa: E402

PUBLISHED = {"every": 4}  # outer lr 0.7, momentum 0.9 by default


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("streaming")
    data = ("--data", str(_learnable(tmp / "tokens.bin")))
    return {"diloco": _run(tmp, "diloco", {"mode": "diloco_probe", "options": PUBLISHED}),
            "as_diloco": _run(tmp, "as_diloco", {"mode": "streaming_probe",
                                                 "options": {**PUBLISHED, "fragments": 1, "delay": 0, "alpha": 0}}),
            "two": _run(tmp, "two", {"mode": "streaming_probe",
                                     "options": {**PUBLISHED, "fragments": 2, "delay": 1, "alpha": 0}}, data)}


def test_one_fragment_without_delay_or_mixing_is_diloco_bit_for_bit(runs):
    diloco, streaming = runs["diloco"], runs["as_diloco"]
    assert diloco["code"] == 0 and streaming["code"] == 0, (diloco.get("stderr"), streaming.get("stderr"))
    assert streaming["losses"] == diloco["losses"] and len(diloco["losses"]) == STEPS
    for rank in (0, 1):
        whole = [value for _, _, value in runs["diloco"]["ranks"][rank]["record"]]
        one = [values[0] for _, _, values in runs["as_diloco"]["ranks"][rank]["record"]]
        assert one == whole, rank


def test_two_fragments_merge_in_turn_one_step_after_each_all_reduce_starts(runs):
    two = runs["two"]
    assert two["code"] == 0, two.get("stderr")
    by_rank = [{step: values for _, step, values in r["record"]} for r in two["ranks"]]
    merged = {0: {5}, 1: {3, 7}}  # fragment: the steps after which it took the global weights
    for step in range(1, STEPS + 1):
        for fragment in (0, 1):
            same = by_rank[0][step][fragment] == by_rank[1][step][fragment]
            assert same == (step in merged[fragment]), (step, fragment, by_rank[0][step], by_rank[1][step])
    # the outer step moved fragment 1's global weights between its two merges (a skipped step would merge the
    # initial weights both times)
    assert abs(by_rank[0][7][1] - by_rank[0][3][1]) > 1e-3, (by_rank[0][3], by_rank[0][7])
    losses = two["losses"]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses


@pytest.mark.parametrize("bits", [32, 4])
def test_a_run_resumed_from_a_checkpoint_with_an_all_reduce_in_flight_equals_the_straight_one(tmp_path, bits):
    """Adam in each of 2 islands, H = 4, 2 fragments, delay 1, alpha 0.5: the checkpoint after step 4 is taken while
    fragment 0's all-reduce (sent after step 4) is in flight; it holds the received mean and merges it after step
    5 of the resumed run, as the straight run does. At 4 bits the checkpoint finishes the exchange's second phase
    first (runtime.loop.sync.four_bit): the same mean the straight run merges."""
    from partita.runtime.checkpoint import read_metadata
    sync = {"mode": "streaming", "options": {"every": 4, "fragments": 2, "delay": 1, "alpha": 0.5, "bits": bits}}
    run, ck = adam_runs(tmp_path, sync), tmp_path / "ck"
    straight = run("straight", 8)
    first = run("first", 4, "--checkpoint-dir", str(ck), "--checkpoint-every", "3")
    keys = set(read_metadata(ck / "step-00000004").state_dict_metadata)
    assert "sync.streaming.pending.wire.0" in keys and "sync.streaming.anchor.0" in keys
    for island in (0, 1):
        assert any(k.startswith(f"sync.streaming.island{island}.param.") for k in keys)
        assert any(k.startswith(f"sync.streaming.island{island}.optim.") and k.endswith(".exp_avg") for k in keys)
    assert "sync.streaming.pending.wire.0" not in set(read_metadata(ck / "step-00000003").state_dict_metadata)
    resumed = run("resumed", 8, "--checkpoint-dir", str(ck), "--resume")
    assert first == straight[:4] and resumed == straight[4:], (straight, first, resumed)


def test_verify_outside_the_identity_is_one_line_and_checkpoints_anywhere_are_allowed():
    from partita.planner.plan.sync import Sync
    from partita.runtime.loop.sync import run_refusal
    streaming = Sync(mode="streaming", options={"every": 8})
    assert run_refusal(streaming, 3, 7) is None  # no window: any --checkpoint-every, any --steps
    assert "streaming DiLoCo reproduces only with H = 1, 1 fragment, delay 0, alpha 0" in run_refusal(streaming, 0, 8, True)
    identity = Sync(mode="streaming", options={"every": 1, "fragments": 1, "delay": 0, "alpha": 0, "outer_lr": 1,
                                               "outer_momentum": 0})
    assert run_refusal(identity, 0, 3, True) is None
    four = Sync(mode="streaming", options={**identity.options, "bits": 4})
    assert "rounds every outer change to 4 bits by design" in run_refusal(four, 0, 3, True)
    assert "rounds every outer change to 4 bits" in run_refusal(Sync(mode="diloco", options={"every": 1, "bits": 4}),
                                                                 0, 3, True)


def test_the_outer_all_reduce_goes_in_buckets_cut_at_the_limit(monkeypatch):
    """One collective per bucket of at most OUTER_BUCKET elements (a larger tensor alone), in parameter order."""
    from types import SimpleNamespace

    import torch

    from partita.runtime.loop.sync import diloco
    monkeypatch.setattr(diloco, "OUTER_BUCKET", 10)
    me = SimpleNamespace(anchor=[torch.zeros(n) for n in (4, 4, 4, 12, 3)])
    assert diloco.DiLoCo._buckets(me, range(5)) == [[0, 1], [2], [3], [4]]
    assert diloco.DiLoCo._buckets(me, [4, 0]) == [[4, 0]] and diloco.DiLoCo._buckets(me, []) == []

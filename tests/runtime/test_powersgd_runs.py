"""The PowerSGD sync mode's runtime hook (runtime.loop.sync.PowerSGD: torch's powerSGD_hook on DDP) on real 2-rank
gloo runs (tests/rank_pool.py; tests/runtime/sync_job.py's probe records torch's PowerSGDState after every
optimizer step). Seeds: the runs' default (--seed 0), plain SGD at lr 0.1 on a learnable token file.

- Before `start` the hook all-reduces plainly: 8 steps with start 100 train as synchronous DP does (within 1e-6 per
  step's loss).
- With start 2 and rank 1 the gradients are compressed from the third step on: the state's iteration count runs
  with the steps, every bucket holds error feedback, the losses leave synchronous training's from step 3 (not
  before) and still fall on a learnable token file.
- --verify with compression inside the run is one line before training; a resumed run says that the hook starts
  afresh.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "runtime"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
import rank_pool  # noqa: E402
from test_diloco_runs import STEPS, _learnable, _run  # noqa: E402


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("powersgd")
    data = ("--data", str(_learnable(tmp / "tokens.bin")), "--lr", "0.1")  # the last --lr given is the one taken
    return {"synchronous": _run(tmp, "synchronous", None, data),
            "late": _run(tmp, "late", {"mode": "powersgd_probe", "options": {"start": 100}}, data),
            "rank1": _run(tmp, "rank1", {"mode": "powersgd_probe", "options": {"rank": 1, "start": 2}}, data)}


def test_before_start_the_hook_all_reduces_plainly(runs):
    sync, late = runs["synchronous"]["losses"], runs["late"]["losses"]
    assert len(late) == STEPS and max(abs(a - b) for a, b in zip(sync, late)) < 1e-6, (sync, late)


def test_from_start_on_the_gradients_are_compressed_with_error_feedback(runs):
    rank1, sync = runs["rank1"], runs["synchronous"]["losses"]
    assert rank1["code"] == 0, rank1.get("stderr")
    for r in rank1["ranks"]:
        record = [row for row in r["record"] if row[0] == "powersgd"]
        assert [row[2] for row in record] == list(range(1, STEPS + 1))  # one iteration per step
        assert record[-1][3] >= 1  # error feedback kept per compressed bucket
        assert record[0][3] == 0 and record[1][3] == 0  # the first two steps all-reduce plainly
    losses = rank1["losses"]
    assert max(abs(a - b) for a, b in zip(losses[:3], sync[:3])) < 1e-6, (losses, sync)  # step 3 uses step 2's update
    assert min(abs(a - b) for a, b in zip(losses[3:], sync[3:])) > 1e-6, (losses, sync)
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses


def test_verify_with_compression_is_one_line_and_a_resume_says_the_hook_starts_afresh(tmp_path):
    from partita.planner.plan.sync import Sync
    from partita.runtime.loop.sync import run_refusal
    from test_plans_match_single_process import make_plan
    late = Sync(mode="powersgd", options={"start": 10})
    assert run_refusal(late, 0, 10, True) is None  # ten plain steps: torch compresses from the eleventh
    assert "powersgd compresses the gradients from step 11 on" in run_refusal(late, 0, 11, True)
    assert "or at most 10 steps" in run_refusal(late, 0, 11, True)
    plan = make_plan(dp=2)
    plan["train"]["optimizer"] = "sgd"
    plan["sync"] = {"mode": "powersgd", "options": {"rank": 2, "start": 2}}
    path, ck = tmp_path / "p.json", tmp_path / "ck"
    path.write_text(json.dumps(plan))
    base = [str(path), "--model", "tiny-gpt", "--lr", "0.5", "--log-every", "0", "--checkpoint-dir", str(ck)]
    first = rank_pool.shared().run(2, [*base, "--steps", "4", "--checkpoint-every", "2"], cwd=ROOT, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    again = rank_pool.shared().run(2, [*base, "--steps", "6", "--resume"], cwd=ROOT, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "note: powersgd starts afresh after a resume: 2 plain all-reduce steps" in again.stdout, again.stdout

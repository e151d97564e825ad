"""`partita run --eval-data D --eval-every N --eval-batches K` through the real launcher (runtime.loop.evaluate): the
held-out loss after every N-th step and the last, the same on 2 data-parallel ranks as on one, and evaluating does
not change training (the training losses are bit-identical with and without it). Refusals are one line."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from test_plans_match_single_process import ROOT, _env, make_plan

pytestmark = pytest.mark.slow


def _run(tmp_path, plan: dict, name: str, *flags):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(plan))
    out = tmp_path / f"{name}-out.json"
    done = subprocess.run([sys.executable, "-m", "partita.cli", "run", str(path), "--model", "tiny-gpt", "--steps", "4",
                           "--losses-out", str(out), *flags], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=_env())
    return done, (json.loads(out.read_text()) if out.exists() else None)


def test_held_out_losses_match_across_plans_and_leave_training_alone(tmp_path):
    rng = np.random.default_rng(0)
    train, held = tmp_path / "train.npy", tmp_path / "held.npy"
    np.save(train, rng.integers(0, 256, 40_000).astype(np.uint16))
    np.save(held, rng.integers(0, 256, 40_000).astype(np.uint16))
    flags = ("--data", str(train), "--eval-data", str(held), "--eval-every", "2", "--eval-batches", "2")
    two, a = _run(tmp_path, make_plan(dp=2), "dp2", *flags)
    assert two.returncode == 0, two.stderr
    assert [s for s, _ in a["eval_losses"]] == [2, 4]
    assert "eval after step 2: loss" in two.stdout and "eval after step 4: loss" in two.stdout
    one, b = _run(tmp_path, make_plan(dp=1, mb=4), "dp1", *flags)  # the same global batch, on one rank
    assert one.returncode == 0, one.stderr
    assert [s for s, _ in b["eval_losses"]] == [2, 4]
    for (_, x), (_, y) in zip(a["eval_losses"], b["eval_losses"]):
        assert x == pytest.approx(y, rel=1e-5)
    plain, c = _run(tmp_path, make_plan(dp=2), "plain", "--data", str(train))
    assert plain.returncode == 0, plain.stderr
    assert c["losses"] == a["losses"] and c["eval_losses"] == []


@pytest.mark.parametrize("plan,flags,needle", [
    (make_plan(pp=2, micro=2), ("--eval-data", "HELD"), "--eval-data evaluates plans without pipeline stages (pp=1) for now"),
    (make_plan(dp=2), ("--eval-every", "2"), "--eval-every and --eval-batches need --eval-data"),
])
def test_evaluation_that_cannot_run_is_one_line(tmp_path, plan, flags, needle):
    held = tmp_path / "held.npy"
    np.save(held, np.arange(4096, dtype=np.uint16) % 256)
    done, _ = _run(tmp_path, plan, "p", *(str(held) if f == "HELD" else f for f in flags))
    assert done.returncode == 2, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("partita")]
    assert len(said) == 1 and said[0].startswith(f"partita: error: {needle}"), done.stderr

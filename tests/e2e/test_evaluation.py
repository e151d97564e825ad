"""`partita run --eval-data D --eval-every N --eval-batches K` (runtime.loop.evaluate; the runs on the rank pool, the
refusal through the real launcher): the
held-out loss after every N-th step and the last, the same on 2 data-parallel ranks as on one, and evaluating does
not change training (the training losses are bit-identical with and without it). Refusals are one line."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import rank_pool

from test_plans_match_single_process import ROOT, _env, make_plan

pytestmark = pytest.mark.slow


def _run(tmp_path, plan: dict, name: str, *flags, launcher: bool = False):
    """The plan's ranks on the test session's gloo workers (tests/rank_pool.py: the workers' own entry point), or
    with `launcher` through `partita run` itself (its pre-flight refusals)."""
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(plan))
    out = tmp_path / f"{name}-out.json"
    flags = ("--steps", "4", "--losses-out", str(out), *flags)
    if launcher:
        done = subprocess.run([sys.executable, "-m", "partita.cli", "run", str(path), "--model", "tiny-gpt", *flags],
                              capture_output=True, text=True, timeout=300, cwd=ROOT, env=_env())
    else:
        done = rank_pool.run_plan(path, "tiny-gpt", *flags, cwd=ROOT)
    return done, (json.loads(out.read_text()) if out.exists() else None)


def test_held_out_losses_match_across_plans_and_leave_training_alone(tmp_path):
    rng = np.random.default_rng(0)
    train, held = tmp_path / "train.npy", tmp_path / "held.npy"
    np.save(train, rng.integers(0, 256, 40_000).astype(np.uint16))
    np.save(held, rng.integers(0, 256, 40_000).astype(np.uint16))
    flags = ("--data", str(train), "--eval-data", str(held), "--eval-every", "2", "--eval-batches", "2")
    one, ref = _run(tmp_path, make_plan(dp=1, mb=4), "dp1", *flags)  # global batch 4 on one rank
    assert one.returncode == 0, one.stderr
    assert [s for s, _ in ref["eval_losses"]] == [2, 4]
    assert "eval after step 2: loss" in one.stdout and "eval after step 4: loss" in one.stdout
    # a loss of the held-out tokens (uniform over 256 ids: about ln 256 = 5.55), not a training loss or a
    # constant: the model changes between the two evaluations
    (_, at2), (_, at4) = ref["eval_losses"]
    assert 5.0 < at2 < 6.5 and 5.0 < at4 < 6.5 and at2 != at4
    assert at2 not in ref["losses"] and at4 not in ref["losses"]
    # data parallel (DDP), a 2-stage 1F1B pipeline (torch's forward-only schedule), Megatron TP: the same global batch
    runs = {}
    for name, plan in (("dp2", make_plan(dp=2)), ("pp2", make_plan(pp=2, micro=2)), ("tp2", make_plan(tp=2, mb=4))):
        done, runs[name] = _run(tmp_path, plan, name, *flags)
        assert done.returncode == 0, done.stderr
        assert [s for s, _ in runs[name]["eval_losses"]] == [2, 4]
        for (_, x), (_, y) in zip(runs[name]["eval_losses"], ref["eval_losses"]):
            assert x == pytest.approx(y, rel=1e-5), name
    plain, c = _run(tmp_path, make_plan(dp=2), "plain", "--data", str(train))
    assert plain.returncode == 0, plain.stderr
    assert c["losses"] == runs["dp2"]["losses"] and c["eval_losses"] == []


def test_eval_flags_without_eval_data_are_one_line(tmp_path):
    done, _ = _run(tmp_path, make_plan(dp=2), "p", "--eval-every", "2", launcher=True)
    assert done.returncode == 2, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("partita")]
    assert said == ["partita: error: --eval-every and --eval-batches need --eval-data"], done.stderr

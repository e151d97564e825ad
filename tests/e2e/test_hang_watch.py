"""`partita run --hang-timeout S` through the real launcher: a rank paused mid-step (PARTITA_FAULT sigstop, as a
process stuck without dying) is named within the timeout, ended, and handled as a failure: without restarts one
line and exit 1; with --max-restarts the run resumes from its newest checkpoint and its losses equal an
uninterrupted run's (bit-exact on gloo). Timing decides nothing but the timeout itself: the paused rank never
moves again on its own."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from test_plans_match_single_process import ROOT, _env, make_plan

pytestmark = pytest.mark.slow
HANG = "15"
"""Seconds: the paused rank is named after this long; every step and checkpoint save of a healthy rank must take
less, also on a loaded 2-core machine (3 s was exceeded there by a checkpoint save, a false hang in CI; 8 s held
at two test workers, and the suite runs three since 2026-11-30, at load 9)."""


def _run(tmp_path, plan, *flags, fault=None):
    env = _env(**({"PARTITA_FAULT": fault} if fault else {}))
    return subprocess.run([sys.executable, "-m", "partita.cli", "run", str(plan), "--model", "tiny-gpt", *flags],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)


def test_a_paused_rank_is_named_and_a_restart_resumes_it_exactly(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(make_plan(dp=2)))
    hung = _run(tmp_path, plan, "--steps", "5", "--hang-timeout", HANG, fault="sigstop,rank=1,step=3")
    assert hung.returncode == 1, hung.stderr
    errors = [line for line in hung.stderr.splitlines() if line.startswith("partita: error:")]
    assert errors == [f"partita: error: rank 1: no progress for more than {HANG} s (--hang-timeout) in forward and backward "
                      "of step 3, while rank 0 waited in the loss all-reduce; ended by the hang watch"], hung.stderr

    ckpt, out, clean = tmp_path / "ckpt", tmp_path / "out.json", tmp_path / "clean.json"
    flags = ("--steps", "5", "--checkpoint-every", "2", "--hang-timeout", HANG)
    restarted = _run(tmp_path, plan, *flags, "--checkpoint-dir", str(ckpt), "--max-restarts", "1",
                     "--losses-out", str(out), fault="sigstop,rank=1,step=3")
    assert restarted.returncode == 0, restarted.stderr
    result = json.loads(out.read_text())
    assert result["restarts"] == 1 and result["first_step"] == 2
    reference = _run(tmp_path, plan, *flags, "--checkpoint-dir", str(tmp_path / "ckpt2"), "--losses-out", str(clean))
    assert reference.returncode == 0, reference.stderr
    assert result["losses"] == json.loads(clean.read_text())["losses"][2:]

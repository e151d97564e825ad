"""How the launcher starts its workers (runtime.launcher.fork): forked from the launcher where torch has no CUDA
(this machine), as new interpreters where PARTITA_WORKER_START=spawn (and on a GPU host). Both through the real
`partita run`: a 2-rank dp tiny-gpt plan on gloo."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from test_plans_match_single_process import ROOT, _env, make_plan
from test_signals_and_ownership import children, start, wait_for

from partita.runtime.launcher.fork import START_ENV, can_fork


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_text().split("\0")[:-1]


def _run(tmp_path: Path, how: str) -> tuple[dict, str]:
    plan, out = tmp_path / "plan.json", tmp_path / f"{how}.json"
    plan.write_text(json.dumps(make_plan(dp=2)))
    proc = subprocess.run([sys.executable, "-m", "partita.cli", "run", str(plan), "--model", "tiny-gpt", "--steps",
                           "3", "--losses-out", str(out)], cwd=ROOT, env=_env(**{START_ENV: how}),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    checksum = [line for line in proc.stdout.splitlines() if line.startswith("parameter checksum")]
    return json.loads(out.read_text()), checksum[0]


def test_forked_and_spawned_workers_train_alike(tmp_path):
    forked, forked_sum = _run(tmp_path, "fork")
    spawned, spawned_sum = _run(tmp_path, "spawn")
    assert forked["losses"] == spawned["losses"] and len(forked["losses"]) == 3
    assert forked_sum == spawned_sum


def test_workers_are_forked_here_and_stop_on_a_signal(tmp_path, monkeypatch):
    """A CPU-only torch: the workers are the launcher's forks (the same command line), and a SIGTERM still stops
    every one of them at a step boundary with the usual line (their own handlers, not the launcher's)."""
    monkeypatch.delenv(START_ENV, raising=False)
    assert can_fork()
    ck = tmp_path / "ck"
    proc = start(tmp_path, "--steps", "1000", "--checkpoint-dir", str(ck), "--checkpoint-every", "2")
    wait_for(ck / "step-00000002", proc)
    agent = children(proc.pid)[0]
    workers = children(agent)
    assert len(workers) == 2 and all(_cmdline(w) == _cmdline(agent) for w in workers)
    assert "partita.runtime.train" in _cmdline(agent)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM after step" in err and "with --resume" in err


def test_the_start_method_follows_the_environment(monkeypatch):
    monkeypatch.setenv(START_ENV, "spawn")
    assert not can_fork()
    monkeypatch.setenv(START_ENV, "fork")
    assert can_fork()

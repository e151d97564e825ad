"""Failures reach the user as one line: a rank's error (`partita: error: rank R: ...`) instead of torchrun's
report, and argument errors before anything is launched (exit code 2, no usage text)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from partita.costmodel import PartitaError
from partita import cli
from partita.runtime.loop import report
from test_plans_match_single_process import ROOT, _env, make_plan


def partita(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "partita.cli", *args], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def plan4(tmp_path):
    path = tmp_path / "plan4.json"
    path.write_text(json.dumps(make_plan(dp=2, tp=2)))
    return path


def test_a_wrong_launch_is_one_line_before_any_worker_starts(plan4):
    """A 4-rank plan started on 2 processes: the launcher's pre-flight refuses it before torchrun starts a
    worker; the user sees one line, not torchrun's report, and exit code 2 (the plan does not fit the world
    size). (A failure only the workers can see names the rank: test_signals_and_ownership, test_multinode.)"""
    code = f"import sys, runtime; sys.exit(runtime.launch({str(plan4)!r}, 'tiny-gpt', 2, nproc=2))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines == ["partita: error: plan is for 4 ranks (pp=1 x dp=2 x tp=2) but WORLD_SIZE is 2"], lines
    assert proc.stdout == ""


@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "--steps must be at least 1"),
    (["--steps", "2", "--checkpoint-every", "-1"], "--checkpoint-every must be >= 0"),
    (["--steps", "2", "--nnodes", "2"], "--nnodes 2 needs --rdzv-endpoint HOST:PORT"),
    (["--steps", "2", "--nnodes", "3", "--rdzv-endpoint", "127.0.0.1:1"],
     "the plan is for 4 ranks, which 3 nodes cannot share equally (processes per node = world size / nnodes): "
     "use --nnodes 1, 2, 4"),
])
def test_argument_errors_are_one_line_before_anything_is_launched(plan4, monkeypatch, capsys, args, message):
    def no_process(*a, **k):
        raise AssertionError(f"launched {a[0] if a else k}")
    monkeypatch.setattr(subprocess, "run", no_process)
    monkeypatch.setattr(subprocess, "call", no_process)
    monkeypatch.setattr(subprocess, "Popen", no_process)
    assert cli.main(["run", str(plan4), "--model", "tiny-gpt", *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"partita: error: {message}"), lines


def test_steps_0_from_the_command_line_is_one_line_and_exit_code_2(plan4):
    proc = partita("run", str(plan4), "--model", "tiny-gpt", "--steps", "0", timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["partita: error: --steps must be at least 1"], proc.stderr
    assert "usage" not in proc.stderr + proc.stdout


def test_launch_refuses_steps_0_before_starting_processes(plan4, monkeypatch):
    import partita.runtime.api  # noqa: F401  (loads the submodule read as runtime.api)
    from partita import runtime
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("torchrun was started"))
    with pytest.raises(PartitaError, match="--steps must be at least 1"):
        runtime.api.launch(plan4, "tiny-gpt", 0)
    with pytest.raises(PartitaError, match="3 nodes cannot share equally"):
        runtime.api.launch(plan4, "tiny-gpt", 2, nnodes=3, rdzv_endpoint="127.0.0.1:1")


def test_a_bug_prints_its_traceback_and_leaves_no_log_directory(tmp_path):
    """An unexpected exception on rank 1 (PARTITA_FAULT raise): its line, its traceback below it, and torchrun's
    log directory removed (it used to stay in the temporary directory, one per failed run)."""
    plan = tmp_path / "plan2.json"
    plan.write_text(json.dumps(make_plan(dp=2)))
    (tmp_path / "tmp").mkdir()
    code = f"import sys, runtime; sys.exit(runtime.launch({str(plan)!r}, 'tiny-gpt', 3))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=_env(PARTITA_FAULT="raise,rank=1,step=2", TMPDIR=str(tmp_path / "tmp")))
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == "partita: error: rank 1: RuntimeError: PARTITA_FAULT: rank 1 raises during step 2", proc.stderr
    assert lines[1] == "traceback of rank 1:" and lines[2].startswith("Traceback (most recent call last):")
    assert lines[-1] == "RuntimeError: PARTITA_FAULT: rank 1 raises during step 2"
    # torch's own caches (torchinductor_<user>, made by the workers' imports) may stay: they are meant to
    assert [p.name for p in (tmp_path / "tmp").iterdir() if not p.name.startswith("torchinductor_")] == []


def test_the_first_failure_is_the_earliest_that_torchrun_did_not_stop_itself(tmp_path, monkeypatch):
    """Error files as workers write them (runtime.loop.report.write_error_file), read back as the launcher does."""
    files = {}
    for rank, message in ((2, "RuntimeError: Connection closed by peer"), (1, "plan is for 4 ranks")):
        files[rank] = tmp_path / f"{rank}.json"
        monkeypatch.setenv(report.ERROR_FILE_ENV, str(files[rank]))
        report.write_error_file(rank, message, trace="Traceback ..." if rank == 2 else None, exitcode=rank)
    t2 = json.loads(files[2].read_text())["message"]["extraInfo"]["partita"]["time"]
    failures = [report.read_failure(0, -15, None, t2 - 5),  # SIGTERM from torchrun: not the cause
                report.read_failure(2, 1, str(files[2]), 0),
                report.read_failure(1, 2, str(files[1]), 0)]
    first = report.first_failure(failures)  # rank 2 only noticed a peer go away; rank 1 said why
    assert first.line() == "rank 1: plan is for 4 ranks" and first.trace is None
    assert report.first_failure(failures[:2]).line() == "rank 2: RuntimeError: Connection closed by peer"
    assert failures[1].trace == "Traceback ..."
    assert failures[0].secondary and failures[0].message == "killed by SIGTERM"
    assert failures[2].trace is None and failures[2].exitcode == 2
    # stopped by torchrun after writing its error file: the code it was about to exit with
    assert report.read_failure(1, -15, str(files[1]), 0).exitcode == 1
    died = report.read_failure(3, 1, None, t2 - 1)  # os._exit: no file, noticed before rank 2 wrote its own
    assert report.first_failure(failures + [died]).line() == "rank 3: exited with code 1"


def test_a_rank_killed_by_sigkill_is_the_cause_not_its_peers_connection_error(tmp_path, monkeypatch):
    """The out-of-memory killer ends a worker with SIGKILL and no error file; its healthy peer then fails with
    "Connection reset by peer" -- written before torchrun notices the dead worker. The killed rank is named."""
    path = tmp_path / "0.json"
    monkeypatch.setenv(report.ERROR_FILE_ENV, str(path))
    report.write_error_file(0, "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error "
                               "[127.0.0.1]:4567: Connection reset by peer", trace="Traceback ...")
    written = json.loads(path.read_text())["message"]["extraInfo"]["partita"]["time"]
    failures = [report.read_failure(0, 1, str(path), 0), report.read_failure(1, -9, None, written + 0.5),
                report.read_failure(2, -15, None, written + 0.6)]
    first = report.first_failure(failures)
    assert first.line() == "rank 1: killed by SIGKILL (out of memory?)"
    assert not failures[1].secondary and failures[2].secondary and failures[0].peer_lost


def _ended(how: str):
    """A real process ended `how`: "kill" (SIGKILL, as the out-of-memory killer), "term" (torch's SIGTERM of the
    rest) or "exit" (exit code 1, as a rank that wrote its error file)."""
    import multiprocessing
    import os
    import signal
    import time
    target, arg = (sys.exit, 1) if how == "exit" else (time.sleep, 60)
    proc = multiprocessing.get_context("fork").Process(target=target, args=(arg,))
    proc.start()
    if how != "exit":
        os.kill(proc.pid, signal.SIGKILL if how == "kill" else signal.SIGTERM)
    proc.join(30)
    return proc


def test_a_killed_forked_worker_is_named_though_torch_reported_its_peer_first(tmp_path, monkeypatch):
    """torch's MultiprocessContext (forked workers) reports only the first ended process its join finds. Rank 0,
    which only saw its peer go, was found; rank 1, SIGKILLed before it and silent, must still be named, and rank
    2, stopped by torch's SIGTERM, is not a cause (runtime.launcher.agent._add_silent_deaths)."""
    from types import SimpleNamespace

    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from partita.runtime.launcher.agent import _add_silent_deaths
    files = {r: str(tmp_path / f"{r}.json") for r in range(3)}
    monkeypatch.setenv(report.ERROR_FILE_ENV, files[0])
    report.write_error_file(0, "RuntimeError: Connection closed by peer [127.0.0.1]:17595", trace="Traceback ...")
    procs = [_ended("exit"), _ended("kill"), _ended("term")]
    agent = SimpleNamespace(_pcontext=SimpleNamespace(_pc=SimpleNamespace(processes=procs), error_files=files))
    group = SimpleNamespace(workers=[SimpleNamespace(global_rank=r) for r in range(3)])
    failures = {0: ProcessFailure(local_rank=0, pid=procs[0].pid, exitcode=1, error_file=files[0])}
    _add_silent_deaths(agent, group, failures)
    assert sorted(failures) == [0, 1] and failures[1].exitcode == -9, failures
    read = [report.read_failure(r, f.exitcode, f.error_file if r == 0 else None, f.timestamp)
            for r, f in failures.items()]
    assert report.first_failure(read).line() == "rank 1: killed by SIGKILL (out of memory?)"
    # a second node's workers (global ranks 3, 4, 5; torch keys the result by global rank): rank 4 is the killed one
    second = SimpleNamespace(workers=[SimpleNamespace(global_rank=r) for r in (3, 4, 5)])
    failures = {3: ProcessFailure(local_rank=0, pid=procs[0].pid, exitcode=1, error_file=files[0])}
    _add_silent_deaths(agent, second, failures)
    assert sorted(failures) == [3, 4] and failures[4].local_rank == 1, failures
    # torch found the killed rank 1 first: rank 0, which exited with code 1 (as os._exit, or its error file), is added
    failures = {1: ProcessFailure(local_rank=1, pid=procs[1].pid, exitcode=-9, error_file=files[1])}
    _add_silent_deaths(agent, group, failures)
    assert sorted(failures) == [0, 1] and failures[0].exitcode == 1, failures
    alone = {0: failures[0]}
    _add_silent_deaths(SimpleNamespace(_pcontext=None), group, alone)  # spawned workers: torch reported them all
    assert list(alone) == [0]


def test_an_error_file_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """torchrun reads a worker's error file as soon as the worker ends, and its reader raises on half a JSON
    document (that took the agent down in CI when torchrun's SIGTERM met a rank mid-write). A write cut off
    part way leaves no file at the agent's path."""
    path = tmp_path / "error.json"
    monkeypatch.setenv(report.ERROR_FILE_ENV, str(path))

    def cut_off(data, f):
        f.write('{"message": {')
        raise KeyboardInterrupt  # stands in for the signal that ends the worker mid-write

    monkeypatch.setattr(json, "dump", cut_off)
    with pytest.raises(KeyboardInterrupt):
        report.write_error_file(1, "rank 1 dies during step 3")
    assert not path.exists()
    monkeypatch.undo()
    monkeypatch.setenv(report.ERROR_FILE_ENV, str(path))
    report.write_error_file(1, "rank 1 dies during step 3")
    assert json.loads(path.read_text())["message"]["message"] == "rank 1 dies during step 3"

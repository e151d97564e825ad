"""`partita run` under what a terminal, an operator and a filesystem do to it (issue 47, the runtime side), through
the real launcher: torchrun's agent in its own process, 2 gloo workers, tiny-gpt. Each test is one launch (10-40 s
on 2 shared cores), so each groups the checks that launch can make. Timing never decides an outcome: a fault
(PARTITA_FAULT, runtime.failure.faults) pauses a worker with SIGSTOP, and the test changes the world while it waits.

- a terminal that closes (SIGHUP, then EIO on every write to it) stops the run at a step boundary with a
  checkpoint and --losses-out, like SIGTERM;
- under nohup (SIGHUP ignored) the run goes on; SIGQUIT stops it in one line; a full stdout (/dev/full) costs
  the progress lines only;
- a paused worker and SIGTERM: torchrun kills the workers, and the line names the last step they passed;
- a stdout closed after three lines (`| head -3`), a planted `.step-N.tmp` file and a checkpoint directory
  made read-only mid-run: the run trains on, clears the file, and the failed save is one line, exit 2;
- the manifest write failing (the directory of a save in progress made read-only): one line, exit 2;
- a SIGKILLed rank: --losses-out names it, not its peer's "Connection closed by peer";
- a SIGKILLed launcher leaves no partita-torchrun-* directory, and its workers still stop with the history.
The one-process cases (a dangling `step-N` symlink, `.partita.lock` as a directory) run the entry point alone.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest

from partita.runtime import checkpoint as ckpt
from partita.runtime.loop.report import PEER_LOST
from test_plans_match_single_process import ROOT, _env, make_plan
from test_signals_and_ownership import alive, children, start, wait_for

pytestmark = pytest.mark.slow

NOTE_PREFIX = "partita: note: standard output failed ("


def history(path: Path) -> dict:
    return json.loads(path.read_text())


def resume_line(signame: str, step: int, steps: int, ck: Path) -> str:
    return f"stopped by {signame} after step {step} of {steps}; resume from {ck / f'step-{step:08d}'} with --resume"


def state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def paused_worker(proc: subprocess.Popen, timeout: float = 240) -> int:
    """The worker a sigstop fault stopped, once it is stopped (state T)."""
    end = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, proc.communicate()
        found = [w for agent in children(proc.pid) for w in children(agent) if state(w) == "T"]
        if found:
            return found[0]
        assert time.monotonic() < end, "no worker paused"
        time.sleep(0.1)


def no_launcher_dirs(tmp_path: Path) -> bool:
    return list((tmp_path / "tmp").glob("partita-torchrun-*")) == []


@contextlib.contextmanager
def read_only(path: Path):
    """`path` refuses new entries while inside: chmod for a user; root passes permission bits, so for root the
    immutable attribute (chattr +i, which the filesystem must support)."""
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(path)], check=True)
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(path)], check=True)
    else:
        mode = path.stat().st_mode
        path.chmod(0o555)
        try:
            yield
        finally:
            path.chmod(mode)


@pytest.fixture
def can_make_read_only(tmp_path):
    probe = tmp_path / "probe"
    probe.mkdir()
    try:
        with read_only(probe):
            with pytest.raises(OSError):
                (probe / "x").mkdir()
    except (OSError, subprocess.CalledProcessError, pytest.fail.Exception):
        pytest.skip("cannot make a directory read-only here")
    probe.rmdir()


class Terminal:
    """A pseudo-terminal for `partita run` to run on, as the controlling terminal of its session: closing it
    (`hang_up`) is what closing a terminal window or losing an ssh connection does -- the kernel sends SIGHUP
    and every later write to the terminal fails with EIO."""

    def __init__(self):
        self.master, self.slave = os.openpty()
        self.text = b""
        self._done = threading.Event()
        self._reader = threading.Thread(target=self._drain, daemon=True)

    def popen(self) -> dict:
        return {"stdin": self.slave, "stdout": self.slave, "stderr": self.slave, "preexec_fn": self._own}

    @staticmethod
    def _own():  # in the child, after setsid (start_new_session): the terminal becomes its controlling one
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        # As a shell on a new terminal starts its jobs: SIGHUP at its default. A suite run under nohup (or
        # anything else that ignores SIGHUP) would otherwise pass the ignored SIGHUP on, and `partita run`
        # rightly keeps training through a hang-up it was started ignoring (the nohup test below); that made
        # this test fail only where the suite itself ran under nohup.
        signal.signal(signal.SIGHUP, signal.SIG_DFL)

    def started(self) -> None:
        os.close(self.slave)
        self._reader.start()

    def _drain(self) -> None:  # keep reading, or the run blocks on a full terminal buffer
        while not self._done.is_set():
            if select.select([self.master], [], [], 0.1)[0]:
                try:
                    self.text += os.read(self.master, 65536)
                except OSError:
                    return

    def hang_up(self) -> None:
        self._done.set()
        self._reader.join()
        os.close(self.master)


def test_closing_the_terminal_stops_at_a_step_boundary_with_a_checkpoint_and_the_history(tmp_path):
    """Before: SIGHUP was passed on, the workers died mid-step without a checkpoint or --losses-out, and the line
    said "stopped by SIGHUP before training began"."""
    ck, out = tmp_path / "ck", tmp_path / "out.json"
    term = Terminal()
    proc = start(tmp_path, "--steps", "1000", "--checkpoint-dir", str(ck), "--checkpoint-every", "2",
                 "--losses-out", str(out), new_session=True, **term.popen())
    term.started()
    wait_for(ck / "step-00000002", proc)
    workers = [w for agent in children(proc.pid) for w in children(agent)]
    term.hang_up()
    assert proc.wait(timeout=180) == 129, term.text.decode(errors="replace")
    saved = history(out)
    step = len(saved["losses"])
    assert saved["exit_code"] == 129 and saved["failure"] == resume_line("SIGHUP", step, 1000, ck), saved
    assert ckpt.latest(ck).name == f"step-{step:08d}" and not ckpt.incomplete(ck)
    assert alive(workers) == [] and no_launcher_dirs(tmp_path)
    assert b"Traceback" not in term.text and b"partita run: tiny-gpt" in term.text


def test_nohup_keeps_running_sigquit_stops_and_a_full_stdout_costs_only_the_lines(tmp_path):
    """SIGHUP ignored from the start (what nohup does) stays ignored; SIGQUIT (Ctrl-\\) stops at a step boundary
    (before: it killed `partita run` and left the launcher to a SIGTERM); stdout on /dev/full (before: every
    rank died before step 1) turns the progress lines off with one note."""
    ck, out = tmp_path / "ck", tmp_path / "out.json"
    with open("/dev/full", "w") as full:
        proc = start(tmp_path, "--steps", "1000", "--checkpoint-dir", str(ck), "--checkpoint-every", "2",
                     "--losses-out", str(out), "--log-every", "1", stdout=full,
                     preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    wait_for(ck / "step-00000002", proc)
    proc.send_signal(signal.SIGHUP)
    wait_for(ck / "step-00000004", proc)  # still training
    proc.send_signal(signal.SIGQUIT)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 131, err
    step = len(history(out)["losses"])
    lines = err.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith(NOTE_PREFIX + "No space left on device): "), err
    assert lines[1] == "partita: " + resume_line("SIGQUIT", step, 1000, ck), err
    assert step >= 4 and ckpt.latest(ck).name == f"step-{step:08d}" and history(out)["exit_code"] == 131


def test_a_paused_worker_then_sigterm_names_the_last_step_passed(tmp_path):
    """Rank 1 is paused in step 5 (SIGSTOP); SIGTERM cannot stop rank 0, which waits for it in the step's
    all-reduce, so torchrun kills both after its shutdown timeout (2 s here). Before: "stopped by SIGTERM before
    training began", though step 4 was checkpointed."""
    ck = tmp_path / "ck"
    proc = start(tmp_path, "--steps", "1000", "--checkpoint-dir", str(ck), "--checkpoint-every", "2",
                 env={"PARTITA_FAULT": "sigstop,rank=1,step=5", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "2"})
    paused = paused_worker(proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == (
        f"partita: stopped by SIGTERM after step 4 of 1000 (the workers did not reach the next step boundary in "
        f"time and were killed); resume from {ck / 'step-00000004'} with --resume"), err
    assert alive([paused]) == [] and ckpt.latest(ck).name == "step-00000004" and no_launcher_dirs(tmp_path)


def test_a_closed_stdout_a_planted_tmp_file_and_a_read_only_directory(tmp_path, can_make_read_only):
    """`| head -3`: the reader goes after three lines (before: BrokenPipeError at the next line and no
    --losses-out). A file planted at step 2's temporary name is cleared like a stale save (before: a traceback).
    The directory turns read-only while rank 0 is paused in step 3, so step 4's save cannot start: one line,
    exit 2, on every rank alike (before: rank 0's PermissionError traceback, exit 1)."""
    ck, out = tmp_path / "ck", tmp_path / "out.json"
    ck.mkdir()
    (ck / ".step-00000002.tmp").write_text("not a save\n")
    proc = start(tmp_path, "--steps", "8", "--checkpoint-dir", str(ck), "--checkpoint-every", "2",
                 "--losses-out", str(out), "--log-every", "1", env={"PARTITA_FAULT": "sigstop,rank=0,step=3"})
    rank0 = paused_worker(proc)
    head = [proc.stdout.readline() for _ in range(3)]
    proc.stdout.close()
    with read_only(ck):
        os.kill(rank0, signal.SIGCONT)
        err = proc.stderr.read()
        proc.wait(timeout=180)
    assert proc.returncode == 2, err
    assert head[0].startswith("partita run: tiny-gpt") and head[2].startswith("step 2/8"), head
    lines = err.strip().splitlines()
    assert len(lines) == 3 and lines[0].startswith("partita: fault injected") and lines[1].startswith(
        NOTE_PREFIX + "Broken pipe): "), err
    assert lines[2].startswith("partita: error: rank ") and (
        f": saving the checkpoint of step 4 to {ck / '.step-00000004.tmp'} failed (") in lines[2], err
    assert lines[2].endswith(f"; the newest checkpoint, {ck / 'step-00000002'}, is intact"), err
    saved = history(out)
    assert len(saved["losses"]) == 4 and saved["exit_code"] == 2 and saved["failure"] in lines[2]
    assert [p.name for p in ckpt.steps(ck)] == ["step-00000002"]
    ckpt.open_checkpoint(ck / "step-00000002")


def test_the_manifest_write_failing_is_one_line(tmp_path, can_make_read_only):
    """Rank 0 is paused while saving step 2, after DCP wrote the shards: the save's directory turns read-only,
    so the manifest cannot be written (as on a full disk). Before: an OSError traceback, exit 1."""
    ck = tmp_path / "ck"
    proc = start(tmp_path, "--steps", "4", "--checkpoint-dir", str(ck), "--checkpoint-every", "2",
                 env={"PARTITA_FAULT": "save-sigstop,step=2"})
    rank0 = paused_worker(proc)
    with read_only(ck / ".step-00000002.tmp"):
        os.kill(rank0, signal.SIGCONT)
        out, err = proc.communicate(timeout=180)
    assert proc.returncode == 2, err
    line = err.strip().splitlines()[-1]
    assert f": saving the checkpoint of step 2 to {ck / '.step-00000002.tmp'} failed (" in line, err
    assert f"{ck / '.step-00000002.tmp' / 'partita.json.part'}); no checkpoint was saved before" in line, err
    assert "Traceback" not in err and ckpt.steps(ck) == []


def test_a_killed_rank_is_named_in_losses_out(tmp_path):
    """Rank 1 is SIGKILLed in step 3; rank 0 only sees the connection close. Before: --losses-out's failure was
    rank 0's "Connection closed by peer"."""
    out = tmp_path / "out.json"
    proc = start(tmp_path, "--steps", "5", "--losses-out", str(out), env={"PARTITA_FAULT": "kill,rank=1,step=3"})
    _, err = proc.communicate(timeout=240)
    assert err.strip().splitlines()[-1] == "partita: error: rank 1: killed by SIGKILL (out of memory?)", err
    saved = history(out)
    assert saved["failure"] == "rank 1: killed by SIGKILL (out of memory?)", saved
    assert PEER_LOST.search(saved["failure_noticed"]) and len(saved["losses"]) == 2, saved


def test_a_killed_launcher_leaves_no_directory_and_its_workers_stop_with_the_history(tmp_path):
    """Before: the launcher's partita-torchrun-* directory stayed in TMPDIR; `partita run`, which outlives it,
    now makes and removes it."""
    ck, out = tmp_path / "ck", tmp_path / "out.json"
    proc = start(tmp_path, "--steps", "1000", "--checkpoint-dir", str(ck), "--checkpoint-every", "2",
                 "--losses-out", str(out))
    wait_for(ck / "step-00000002", proc)
    agent = children(proc.pid)[0]
    workers = children(agent)
    os.kill(agent, signal.SIGKILL)
    proc.communicate(timeout=120)
    assert proc.returncode == 137
    end = time.monotonic() + 120
    while alive(workers) and time.monotonic() < end:
        time.sleep(0.2)
    assert alive(workers) == [] and no_launcher_dirs(tmp_path)
    saved = history(out)  # the workers stopped on the kernel's SIGTERM (runtime.failure.stop.die_with_parent)
    step = len(saved["losses"])
    assert saved["failure"] == resume_line("SIGTERM", step, 1000, ck) and ckpt.latest(ck).name == f"step-{step:08d}"


def entry_point(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """The training entry point alone: one rank, no torchrun."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(make_plan()))
    return subprocess.run([sys.executable, "-m", "partita.runtime.train", str(plan), "--model", "tiny-gpt", *args],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)


def test_a_dangling_step_symlink_and_a_lock_directory_are_one_line(tmp_path):
    """A dangling `step-N` symlink where the save's rename goes, and `.partita.lock` as a directory (refused by
    `partita run`'s pre-flight, before anything is launched). Before: tracebacks, exit 1."""
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "step-00000002").symlink_to(tmp_path / "nowhere")
    proc = entry_point(tmp_path, "--steps", "3", "--checkpoint-dir", str(ck), "--checkpoint-every", "1")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        f"partita: error: saving the checkpoint of step 2 to {ck / '.step-00000002.tmp'} failed ({ck / 'step-00000002'} "
        "is in the way: it is a symbolic link, not a checkpoint directory; move it out of the checkpoint directory); "
        f"the newest checkpoint, {ck / 'step-00000001'}, is intact"), proc.stderr

    locked = tmp_path / "locked"
    (locked / ".partita.lock").mkdir(parents=True)
    proc = start(tmp_path, "--steps", "2", "--checkpoint-dir", str(locked), "--checkpoint-every", "1")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and err.strip() == (
        f"partita: error: {locked / '.partita.lock'} is a directory, where partita keeps the lock of the run that "
        "trains into this directory: remove it, or choose another --checkpoint-dir"), err

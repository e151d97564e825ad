"""`partita run` under what a terminal, an operator and a filesystem do to it (issue 47, the runtime side), through
the real launcher: torchrun's agent in its own process, 2 gloo workers, tiny-gpt. Each test is one launch (10-40 s
on 2 shared cores), so each groups the checks that launch can make. Timing never decides an outcome: a fault
(PARTITA_FAULT, runtime.faults) pauses a worker with SIGSTOP, and the test changes the world while it waits.

- a terminal that closes (SIGHUP, then EIO on every write to it) stops the run at a step boundary with a
  checkpoint and --losses-out, like SIGTERM;
- under nohup (SIGHUP ignored) the run goes on; SIGQUIT stops it in one line; a full stdout (/dev/full) costs
  the progress lines only;
- a paused worker and SIGTERM: torchrun kills the workers, and the line names the last step they passed;
"""
from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import subprocess
import termios
import threading
import time
from pathlib import Path

import pytest

from partita.runtime import checkpoint as ckpt
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

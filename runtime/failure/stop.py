"""Stopping a run when told: SIGTERM, SIGINT, SIGHUP or SIGQUIT end training at a step boundary, on every rank.

A signal only records that a stop was asked for (`StopSignal.requested`); the training loop adds the request
to the all-reduce it already does for the loss (runtime.loop.session), so every rank learns of it in the step
where any rank received it and all of them stop after that step's optimizer update -- a signal that reached
one worker alone (a scheduler's, an operator's `kill`) stops the whole job the same way. The run then saves
a checkpoint (when it checkpoints), writes --losses-out, and every rank raises runtime.loop.session.Stopped: one
line naming the signal, the step and the checkpoint to resume from, and exit code 128 + the signal's number
(129 SIGHUP, 130 SIGINT, 131 SIGQUIT, 143 SIGTERM). This module imports nothing heavy (no torch), so a
worker installs it first.

Every terminating signal a terminal or a scheduler sends is a stop: SIGHUP is what a closed terminal or a
dropped ssh connection sends, SIGQUIT what Ctrl-\\ sends. A SIGHUP that is ignored when the process starts
stays ignored: `nohup partita run ...` detaches a run from its terminal (docs/reliability.md says how).

The worker entry point (runtime.train) installs the handlers first thing, so Ctrl-C never prints a
KeyboardInterrupt traceback per rank; under partita's launcher a worker whose agent dies gets SIGTERM from
the kernel (`die_with_parent`, Linux's PR_SET_PDEATHSIG) and stops the same way instead of training on as
an orphan. The Python API installs the handlers for the length of a run and puts the caller's back after.

Under partita's launcher, local rank 0 also records each step boundary it passes (`record_step`, a small
file in the launcher's directory): when the workers cannot stop in time (a worker paused or stuck in a
collective) and torchrun kills them, the launcher still says after which step the run stopped and which
checkpoint it holds (`recorded_step`).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
"""The signals that stop a run at a step boundary."""
NOHUP = (signal.SIGHUP,)
"""Signals left ignored where the process started with them ignored (nohup)."""
PROGRESS_ENV = "PARTITA_PROGRESS_FILE"
"""Set by partita's launcher for its workers: where local rank 0 records the step boundaries it passes."""


def handled() -> list[signal.Signals]:
    """The SIGNALS this process stops on: all of them, but a SIGHUP ignored from the start (nohup) stays so."""
    return [s for s in SIGNALS if not (s in NOHUP and signal.getsignal(s) is signal.SIG_IGN)]


class StopSignal:
    """Handlers of the stop signals (`handled`) that record the first stop request. Installed while it is
    entered (main thread only; elsewhere the process's handlers stay as they are). The one of the process is
    `current`."""

    current: "StopSignal | None" = None

    def __init__(self):
        self.requested: int | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        if self.requested is None:
            self.requested = signum

    def install(self) -> "StopSignal":
        if threading.current_thread() is threading.main_thread() and not self._previous:
            for s in handled():
                self._previous[s] = signal.signal(s, self._handle)
        StopSignal.current = self
        return self

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()
        if StopSignal.current is self:
            StopSignal.current = None

    def __enter__(self) -> "StopSignal":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.restore()


def active() -> StopSignal:
    """The process's StopSignal when one is installed (runtime.train's workers), else a new one for a run."""
    return StopSignal.current if StopSignal.current is not None else StopSignal()


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """Ask the kernel to send `signum` to this process when its parent ends (Linux). A worker of partita's
    launcher so stops at its next step boundary when the launcher is killed, rather than train on alone."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signum), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent ended before the request took effect
        os.kill(os.getpid(), signum)


def record_step(step: int, steps: int, checkpoint: str | None, checkpointing: bool, root: str | None = None) -> None:
    """Local rank 0 under partita's launcher (PROGRESS_ENV): note that every rank passed step `step`'s
    boundary, the newest checkpoint the run stands on, and the checkpoint directory (`root`). Written whole (a
    renamed file); a failure to write it is no reason to stop training."""
    path = os.environ.get(PROGRESS_ENV)
    if not path or os.environ.get("LOCAL_RANK", "0") != "0":
        return
    part = f"{path}.part"
    try:
        with open(part, "w") as f:
            json.dump({"step": step, "steps": steps, "checkpoint": checkpoint, "checkpointing": checkpointing,
                       "root": root}, f)
        os.replace(part, path)
    except OSError:
        pass


def recorded_step(path: str | os.PathLike) -> dict | None:
    """What `record_step` last wrote at `path`, or None (no step passed, or nothing readable)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("step"), int) else None

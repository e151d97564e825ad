"""Stopping a run when told: SIGTERM or SIGINT end training at a step boundary, on every rank at once.

A signal only records that a stop was asked for (`StopSignal.requested`); the training loop adds the request
to the all-reduce it already does for the loss (runtime.session), so every rank learns of it in the step
where any rank received it and all of them stop after that step's optimizer update -- a signal that reached
one worker alone (a scheduler's, an operator's `kill`) stops the whole job the same way. The run then saves
a checkpoint (when it checkpoints), and every rank raises runtime.session.Stopped: one line naming the
signal, the step and the checkpoint to resume from, and exit code 128 + the signal's number (130 for
SIGINT, 143 for SIGTERM). This module imports nothing heavy (no torch), so a worker installs it first.

The worker entry point (runtime.train) installs the handlers first thing, so Ctrl-C never prints a
KeyboardInterrupt traceback per rank; under partita's launcher a worker whose agent dies gets SIGTERM from
the kernel (`die_with_parent`, Linux's PR_SET_PDEATHSIG) and stops the same way instead of training on as
an orphan. The Python API installs the handlers for the length of a run and puts the caller's back after.
"""
from __future__ import annotations

import os
import signal
import sys
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignal:
    """SIGTERM/SIGINT handlers that record the first stop request. Installed while it is entered (main
    thread only; elsewhere the process's handlers stay as they are). The one of the process is `current`."""

    current: "StopSignal | None" = None

    def __init__(self):
        self.requested: int | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        if self.requested is None:
            self.requested = signum

    def install(self) -> "StopSignal":
        if threading.current_thread() is threading.main_thread() and not self._previous:
            for s in SIGNALS:
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

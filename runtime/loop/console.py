"""Console output that may fail without stopping training: rank 0's preamble, progress lines and report.

`partita run ... | head -3` closes the pipe after three lines, `> /dev/full` refuses every write, and a
terminal that closed (an ssh connection dropped) answers EIO. None of that says anything about the
training, which goes on: the first write to the console that fails turns it off for the rest of the run,
one line on stderr says so, and the run still writes its files (--losses-out, checkpoints, TensorBoard).
The stream's file descriptor is pointed at /dev/null then, so what was buffered for it, and whatever a
library prints later, goes nowhere instead of failing again (at the latest when the interpreter flushes it
on exit).

Lines for stderr (`stderr_line`: a stop, an error, a note) are written the same careful way: one that
cannot be written is dropped, so a dead terminal never turns a stop into a traceback or another exit code.
"""
from __future__ import annotations

import os
import sys

WRITE_ERRORS = (OSError, ValueError)
"""What writing to a closed or failing stream raises: BrokenPipeError, ENOSPC, EIO (OSError), or ValueError
for a file object already closed."""


def _why(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__


def _to_devnull(stream) -> None:
    """Point the file descriptor under `stream` at /dev/null (where it has one)."""
    try:
        fd = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError, AttributeError):
        return
    try:
        os.dup2(null, fd)
    except OSError:
        pass
    finally:
        os.close(null)


def stderr_line(text: str) -> bool:
    """Write one line to stderr; False (and nothing raised) when stderr cannot take it."""
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
        return True
    except WRITE_ERRORS:
        return False


class Console:
    """A text stream for progress and report lines (default: the process's current sys.stdout) that turns
    itself off at the first write that fails (module docstring)."""

    def __init__(self, stream=None):
        self._stream = stream
        self._failed = None  # the stream whose write failed: off for it from then on

    @property
    def stream(self):
        return self._stream if self._stream is not None else sys.stdout

    @property
    def on(self) -> bool:
        return self._failed is None or self._failed is not self.stream

    def write(self, text: str) -> bool:
        """Write and flush `text`; False when the console is off or this write turned it off."""
        stream = self.stream
        if not self.on:
            return False
        try:
            stream.write(text)
            stream.flush()
            return True
        except WRITE_ERRORS as e:
            self._turn_off(stream, e)
            return False

    def line(self, *lines: str) -> bool:
        """Write the lines, each ended by a newline."""
        return self.write("".join(f"{s}\n" for s in lines))

    def isatty(self) -> bool:
        try:
            return self.on and self.stream.isatty()
        except WRITE_ERRORS:
            return False

    def _turn_off(self, stream, e: BaseException) -> None:
        self._failed = stream
        _to_devnull(stream)
        what = "standard output" if stream is sys.stdout or stream is sys.__stdout__ else "the progress stream"
        stderr_line(f"partita: note: {what} failed ({_why(e)}): progress and report lines are off; training "
                    "goes on and still writes --losses-out and its checkpoints")


STDOUT = Console()
"""The process's console: every line rank 0 prints about a run goes through it."""

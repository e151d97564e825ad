"""Keep the solver off standard output.

highspy 1.16 writes a two-line banner ("Running HiGHS 1.16.0 ...") to the process's standard output, at
the C level, the first time a `Highs` object is built; HiGHS's `output_flag` option does not cover it and
Python-level redirection does not catch it. `partita plan --json` promises that standard output is the
JSON object and nothing else (DESIGN.md), so before the first solve we build one `Highs` with file
descriptor 1 pointed at /dev/null: the banner goes there, once per process, and every later solve
(cvxpy's own `Highs` objects, `verbose=False`) is silent.
"""
from __future__ import annotations

import os
import sys

_done = False


def silence_banner() -> None:
    """Consume HiGHS's once-per-process banner (module docstring). Safe to call any number of times."""
    global _done
    if _done:
        return
    _done = True
    try:
        import highspy
    except ImportError:  # cvxpy without highspy: nothing prints
        return
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)

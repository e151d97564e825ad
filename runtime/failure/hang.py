"""`--hang-timeout S`: a rank that makes no progress for S seconds is a failure, named with where it stopped.

A rank stuck without dying -- a paused process, a kernel that never returns, a peer that skipped a collective --
leaves every other rank waiting in its next collective, silently, until the backend's own timeout (30 minutes on
gloo, 10 on NCCL) or forever. Under partita's launcher each rank marks where it is in the step (`HangWatch`, a
hook of runtime.loop.trainer):

    0  forward and backward        (the gradient collectives of DDP and FSDP run inside)
    1  the loss all-reduce         (runtime.failure.guards.reduce_loss_and_stop)
    2  the optimizer step          (gradient clipping's all-reduce, the sync mode's)
    3  the checkpoint save         (and the evaluation, which marks each batch it finishes, and the next batch)

in a small file of the launcher's directory (`hang-rank<R>.json`: its step, phase and pid, written whole). A
thread on every rank wakes each second; when its own rank has not moved for S seconds it reads its node's marks:
the ranks furthest behind (the smallest step and phase) are the ones holding the others up. It names them, ends
those of this node (SIGKILL: a paused process does not stop on SIGTERM), records the line as the run's failure
(runtime.loop.report) and exits 1, so torchrun handles it as any failure: a restart from the newest checkpoint
when --max-restarts allows one, else `partita: error: rank R: ...` and exit 1. When every rank of the node waits
at the same point, the rank holding them up is on another node, or the collective itself never completes (the
network): the line says that.

Not watched: the time before the first step (building the model, loading a checkpoint), where a slow file system
is no hang. S must exceed the longest step and the longest checkpoint save: a save is one phase. A rank whose own watch thread cannot run (a paused process) is named by its peers on its node.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path

from partita.runtime.loop.report import ERROR_FILE_ENV, write_error_file
from partita.runtime.loop.trainer import StepHook

PHASES = ("forward and backward", "the loss all-reduce", "the optimizer step", "the checkpoint save")
FILE = "hang-rank{}.json"
HUNG_FILE = "hung.json"
"""Beside the marks: the ranks of this node the watch named and ended, and its line (runtime.launcher.leave: such a
node leaves an elastic job)."""
EXIT = 1
"""A hang is a failure torchrun may restart (--max-restarts), not a refusal."""


class HangWatch(StepHook):
    """Marks this rank's place in each step and watches it (module docstring). The first of the loop's hooks, so
    that it marks a phase before another hook's collectives run in it, with `after_loss()` among the last."""

    def __init__(self, timeout: float, directory: str | os.PathLike, rank: int):
        self.timeout, self.dir, self.rank = timeout, Path(directory), rank
        self.place: tuple[int, int] | None = None
        self.since = time.monotonic()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="partita-hang-watch", daemon=True)

    def during_backward(self, step):
        self._mark(step, 0)
        if not self.thread.is_alive() and not self.done.is_set():
            self.thread.start()
        return contextlib.nullcontext()

    def after_loss(self) -> StepHook:
        """The hook that marks the loss all-reduce: give it after the hooks that may still change the loss or stop
        the rank (runtime.failure.faults), and this watch before every hook that runs a collective."""
        watch = self

        class AfterLoss(StepHook):
            def after_backward(self, step, loss):
                watch._mark(step, 1)
                return loss
        return AfterLoss()

    def before_optimizer(self, step):
        self._mark(step, 2)

    def after_step(self, step, loss, seconds):
        self._mark(step, 3)
        HangWatch.current = self

    def checkpoint(self, step, stopping):
        self._mark(step, 3)

    current = None
    """The watch of this process's run, once a step has ended (`still_going`)."""

    def close(self) -> None:
        HangWatch.current = None
        self.done.set()
        with contextlib.suppress(OSError):
            (self.dir / FILE.format(self.rank)).unlink()

    def _mark(self, step: int, phase: int) -> None:
        self.place, self.since = (step, phase), time.monotonic()
        path = self.dir / FILE.format(self.rank)
        part = path.with_name(path.name + ".part")
        try:
            part.write_text(json.dumps({"rank": self.rank, "pid": os.getpid(), "step": step, "phase": phase,
                                        "error_file": os.environ.get(ERROR_FILE_ENV)}))
            os.replace(part, path)
        except OSError:  # the launcher's directory went away: it is ending the run anyway
            pass

    def _watch(self) -> None:
        every = min(1.0, self.timeout / 4)
        while not self.done.wait(every):
            if time.monotonic() - self.since > self.timeout:
                self._fail()
                return

    def _fail(self) -> None:
        places = marks(self.dir)
        line, culprits = verdict(places, self.timeout)
        # recorded before the culprits end: the launcher reports the earliest failure, and theirs says nothing
        write_error_file(culprits[0] if culprits else self.rank, line, exitcode=EXIT)
        if culprits:
            with contextlib.suppress(OSError):
                (self.dir / HUNG_FILE).write_text(json.dumps({"ranks": culprits, "line": line}))
        for r in culprits:
            pid = places[r].get("pid")
            if r != self.rank and isinstance(pid, int) and pid > 0:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        os._exit(EXIT)


def still_going() -> None:
    """Work between the marks that goes on (an evaluation batch finished): this rank is not hung."""
    watch = HangWatch.current
    if watch is not None and watch.place is not None:
        watch._mark(*watch.place)


def hang_watch(timeout: float | None, rank: int) -> HangWatch | None:
    """The run's watch under partita's launcher (its directory holds the marks: runtime.failure.stop.PROGRESS_ENV), or
    None: no timeout given, or no launcher (one process: no collective to wait in)."""
    from partita.runtime.failure.stop import PROGRESS_ENV
    progress = os.environ.get(PROGRESS_ENV)
    if timeout is None or not progress:
        return None
    return HangWatch(timeout, Path(progress).parent, rank)


def marks(directory: Path) -> dict[int, dict]:
    """Every rank's last mark in `directory` (this node's ranks), by rank, with when it was made ("time")."""
    out = {}
    for path in directory.glob("hang-rank*.json"):
        try:
            d, made = json.loads(path.read_text()), path.stat().st_mtime
        except (OSError, ValueError):
            continue
        if isinstance(d, dict) and all(isinstance(d.get(k), int) for k in ("rank", "step", "phase")) \
                and 0 <= d["phase"] < len(PHASES):
            out[d["rank"]] = {**d, "time": made}
    return out


def live_marks(directory: Path) -> dict[int, dict]:
    """`marks` of the ranks whose process still runs (a rank killed in an earlier attempt leaves its mark)."""
    out = {}
    for rank, d in marks(directory).items():
        pid = d.get("pid")
        if isinstance(pid, int) and pid > 0:
            try:
                os.kill(pid, 0)
            except OSError:
                continue
            out[rank] = d
    return out


def verdict(places: dict[int, dict], timeout: float) -> tuple[str, list[int]]:
    """The failure line, and the ranks it blames (those furthest behind; none when every rank is at one place)."""
    if not places:
        return f"no progress for {timeout:g} s (--hang-timeout)", []
    at = {r: (d["step"], d["phase"]) for r, d in places.items()}
    least, most = min(at.values()), max(at.values())
    behind = sorted(r for r, p in at.items() if p == least)
    if least == most:
        return (f"every rank of this node ({_ranks(behind)}) waited more than {timeout:g} s (--hang-timeout) in "
                f"{PHASES[least[1]]} of step {least[0]}: a rank of another node holds it up, or the collective never "
                "completes"), []
    waiting = sorted(set(at) - set(behind))
    where = {PHASES[at[r][1]] + (f" of step {at[r][0]}" if at[r][0] != least[0] else "") for r in waiting}
    who = "" if len(behind) == 1 else f"ranks {_ranks(behind)} made "  # the report names the first: "rank R: ..."
    return (f"{who}no progress for more than {timeout:g} s (--hang-timeout) in {PHASES[least[1]]} of step "
            f"{least[0]}, while rank {_ranks(waiting)} waited in {', '.join(sorted(where))}; ended by the hang watch"), \
        behind


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))

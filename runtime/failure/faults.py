"""Fault injection for tests: the environment variable PARTITA_FAULT, read by every rank.

    PARTITA_FAULT="rank=1,step=3"        rank 1 dies (os._exit(1)) during step 3, after its backward pass
    PARTITA_FAULT="save,step=4"          rank 0 (or rank=R) dies while saving the step-4 checkpoint:
                                         after every shard and DCP's .metadata are written, before the
                                         checkpoint is committed (renamed into place)
    PARTITA_FAULT="nan,step=3"           the loss of step 3 becomes NaN (on every rank holding a loss)
    PARTITA_FAULT="kill,rank=1,step=3"   rank 1 is killed by SIGKILL during step 3, writing nothing (as the
                                         out-of-memory killer does)
    PARTITA_FAULT="sigterm,rank=1,step=3"  rank 1 receives SIGTERM during step 3 (sigint, sighup, sigquit: SIGINT,
                                         SIGHUP, SIGQUIT), as from a scheduler or an operator's kill: the job
                                         stops after that step
    PARTITA_FAULT="sigstop,rank=1,step=3"  rank 1 stops itself (SIGSTOP) during step 3, before the step's
                                         all-reduce, and waits there for a SIGCONT: a paused worker
    PARTITA_FAULT="save-sigstop,step=4"  rank 0 (or rank=R) stops itself (SIGSTOP) while saving the step-4
                                         checkpoint, where `save` dies: a test can change the directory then
    PARTITA_FAULT="raise,rank=1,step=3"  rank 1 raises an unexpected exception (RuntimeError) during step 3: a
                                         bug, whose traceback the launcher prints
    PARTITA_FAULT="inf,step=2"           after step 2's optimizer update a parameter holds inf (every rank, or
                                         rank=R), as an update past the dtype's range leaves it
    PARTITA_FAULT="rank=1,step=3;save,step=4"   several faults, separated by ";"

Steps count from 1, as the run report numbers them. A dying fault fires once: before dying, the rank
writes a marker file `.fault-<kind>-rank<R>-step<K>` into the checkpoint directory, and a restarted
attempt (torchrun --max-restarts) that finds the marker runs on. Without a checkpoint directory it
fires on torchrun's first attempt only (TORCHELASTIC_RESTART_COUNT 0). NaN faults fire every time, as a
diverging run would.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from partita.costmodel.errors import PartitaError

ENV = "PARTITA_FAULT"
KINDS = ("exit", "save", "nan", "inf", "raise", "kill", "sigterm", "sigint", "sighup", "sigquit", "sigstop",
         "save-sigstop")
_SIGNALS = {"kill": "SIGKILL", "sigterm": "SIGTERM", "sigint": "SIGINT", "sighup": "SIGHUP", "sigquit": "SIGQUIT",
            "sigstop": "SIGSTOP"}


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    rank: int | None = None


def parse(text: str | None) -> list[Fault]:
    """The faults a PARTITA_FAULT value asks for; PartitaError for one that does not parse."""
    faults = []
    for item in filter(None, (s.strip() for s in (text or "").split(";"))):
        kind, fields = "exit", {}
        for part in filter(None, (p.strip() for p in item.split(","))):
            key, eq, value = part.partition("=")
            if not eq and key in KINDS:
                kind = key
            elif eq and key in ("rank", "step") and value.strip().isdigit():
                fields[key] = int(value)
            else:
                raise PartitaError(f"{ENV}={text!r}: cannot read {part!r}; e.g. 'rank=1,step=3', 'save,step=4', "
                                   "'nan,step=3', 'kill,rank=1,step=3', 'sigterm,rank=0,step=2'")
        if "step" not in fields or fields["step"] < 1:
            raise PartitaError(f"{ENV}={text!r}: each fault needs step=K (K >= 1)")
        if kind in ("exit", "kill", "raise") and "rank" not in fields:
            raise PartitaError(f"{ENV}={text!r}: a dying rank needs rank=R")
        rank = fields.get("rank", 0 if kind in ("save", "save-sigstop") else None)
        faults.append(Fault(kind, fields["step"], rank))
    return faults


class Faults:
    """The faults of this rank (from the environment unless `text` is given)."""

    def __init__(self, rank: int, marker_dir: str | os.PathLike | None, text: str | None = None):
        self.rank = rank
        self.marker_dir = Path(marker_dir) if marker_dir is not None else None
        self.faults = parse(os.environ.get(ENV) if text is None else text)

    def _mine(self, kind: str, step: int) -> list[Fault]:
        return [f for f in self.faults if f.kind == kind and f.step == step and f.rank in (None, self.rank)]

    def _first_time(self, f: Fault) -> bool:
        if self.marker_dir is None:
            return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0
        marker = self.marker_dir / f".fault-{f.kind}-rank{self.rank}-step{f.step}"
        if marker.exists():
            return False
        self.marker_dir.mkdir(parents=True, exist_ok=True)
        with open(marker, "w") as fh:
            fh.write(f"{ENV} fired\n")
            fh.flush()
            os.fsync(fh.fileno())
        return True

    def _die(self, kind: str, step: int, what: str) -> None:
        for f in self._mine(kind, step):
            if self._first_time(f):
                print(f"partita: fault injected ({ENV}): rank {self.rank} dies {what}", file=sys.stderr, flush=True)
                os._exit(1)

    def exit_during_step(self, step: int) -> None:
        self._die("exit", step, f"during step {step}")

    def during_save(self, step: int) -> None:
        """save / save-sigstop faults, after every shard and DCP's .metadata are written, before the commit."""
        self._die("save", step, f"while saving the checkpoint of step {step}")
        self._signal("save-sigstop", "SIGSTOP", f"while saving the checkpoint of step {step}", step)

    def raise_during_step(self, step: int) -> None:
        for f in self._mine("raise", step):
            if self._first_time(f):
                raise RuntimeError(f"{ENV}: rank {self.rank} raises during step {step}")

    def signal_during_step(self, step: int) -> None:
        """kill / sigterm / sigint / sighup / sigquit / sigstop faults: this rank sends itself the signal (once,
        as a dying fault fires)."""
        for kind, name in _SIGNALS.items():
            self._signal(kind, name, f"during step {step}", step)

    def _signal(self, kind: str, name: str, when: str, step: int) -> None:
        import signal
        for f in self._mine(kind, step):
            if self._first_time(f):
                try:
                    print(f"partita: fault injected ({ENV}): rank {self.rank} gets {name} {when}", file=sys.stderr,
                          flush=True)
                except (OSError, ValueError):  # stderr gone (a test closed the terminal): the fault still fires
                    pass
                os.kill(os.getpid(), getattr(signal, name))

    def inf_after_update(self, step: int, params) -> None:
        """inf faults: the first element of this rank's first parameter becomes inf."""
        if self._mine("inf", step) and params:
            import torch
            with torch.no_grad():
                local = params[0].to_local() if hasattr(params[0], "to_local") else params[0]
                local.view(-1)[0] = float("inf")

    def nan_at(self, step: int) -> bool:
        return bool(self._mine("nan", step))

"""Where checkpoints live in --checkpoint-dir and what they are called: the names, the complete and the
unfinished ones, and the errors (runtime.checkpoint's docstring has the layout)."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from partita.costmodel.errors import PartitaError

FORMAT = "partita.checkpoint/1"


MANIFEST = "partita.json"


DIGESTS = ".partita-digests"


SIDECAR = DIGESTS + "/{name}.sha256"
"""Relative to DIR, for step directory `name`: the digest of its manifest, in sha256sum's format; in a hidden
directory of its own, so that what lists DIR/step-* or DIR/.step-* sees the checkpoints alone."""


_STEP = re.compile(r"^step-(\d{8})$")


_TMP = re.compile(r"^\.step-(\d{8})\.tmp$")


class CheckpointError(PartitaError):
    """A checkpoint that is missing files, corrupt, or was written for another model or optimizer."""


class DamagedCheckpoint(CheckpointError):
    """A checkpoint whose files are missing, cut short, unreadable or changed since they were saved."""


@dataclass
class Checkpoint:
    path: Path
    step: int
    manifest: dict


def step_dir(root: str | os.PathLike, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def tmp_dir(root: str | os.PathLike, step: int) -> Path:
    return Path(root) / f".step-{step:08d}.tmp"


def steps(root: str | os.PathLike) -> list[Path]:
    """The committed checkpoint directories in `root`, oldest step first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = sorted((int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP.match(p.name)))
    return [p for _, p in found]


def latest(root: str | os.PathLike) -> Path | None:
    """The complete checkpoint directory with the highest step in `root`, or None."""
    found = steps(root)
    return found[-1] if found else None


def incomplete(root: str | os.PathLike) -> list[Path]:
    """Temporary directories of saves that never finished."""
    root = Path(root)
    return sorted(p for p in root.iterdir() if p.is_dir() and _TMP.match(p.name)) if root.is_dir() else []

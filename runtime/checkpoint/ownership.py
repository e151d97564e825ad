"""A checkpoint directory belongs to one run: a lock held for the run's life, and a run id in every manifest.

    DIR/partita-run.json   {"run_id", "created"}: the run (and the runs that continue it with --resume) whose
                           checkpoints DIR holds
    DIR/.partita.lock      flock'ed by global rank 0 while a run trains; says who holds it (pid, host, run id)

- A fresh run (no --resume, torchrun's first attempt) refuses a directory that holds committed checkpoints:
  they belong to another run, and overwriting them step by step would leave a directory of two runs.
- Two runs on one directory at once: the second cannot take the lock and stops before its first step.
- A run that continues the directory (--resume) takes its run id over, and so does a torchrun restart; a
  resume only considers checkpoints of that run id (runtime.loop.session), never a stray step of another run.
- Before the first step, the directory must be writable (a probe file), not only at the first save.

The lock is an advisory flock(2) on the shared filesystem, held by one process (global rank 0 of the
current attempt): between a failed attempt and its restart nobody holds it, and a filesystem without
working flock (some network mounts) gives no exclusion -- docs/reliability.md says what is not guaranteed.
"""
from __future__ import annotations

import json
import os
import socket
import time
import uuid
from pathlib import Path

from partita.runtime.checkpoint import CheckpointError, atomic_write, steps

OWNER = "partita-run.json"
LOCK = ".partita.lock"


def owner_run_id(root: str | os.PathLike) -> str | None:
    """The run id DIR belongs to, or None (no owner file yet, or an unreadable one)."""
    try:
        data = json.loads((Path(root) / OWNER).read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    run_id = data.get("run_id") if isinstance(data, dict) else None
    return run_id if isinstance(run_id, str) else None


def refuse_foreign(root: str | os.PathLike, continuing: bool) -> None:
    """A fresh run may not write into a directory that already holds committed checkpoints."""
    if continuing:
        return
    found = steps(root)
    if found:
        owner = owner_run_id(root)
        of = f"run {owner}'s" if owner else "another run's"
        raise CheckpointError(f"--checkpoint-dir {root} already holds {of} checkpoints (newest {found[-1].name}); "
                              "a new run does not overwrite them: continue that run with --resume, or choose an "
                              "empty directory")


def check_writable(root: str | os.PathLike) -> None:
    """Create DIR if needed and write a probe file into it: a checkpoint that cannot be written fails here,
    before any step; so does a lock path (`LOCK`) taken by something that is not a file."""
    root = Path(root)
    probe = root / f".partita-probe-{socket.gethostname()}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        with open(probe, "w") as f:
            f.write("partita\n")
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as e:
        raise CheckpointError(f"cannot write checkpoints to {root}: {e.strerror or e}; choose a writable "
                              "--checkpoint-dir") from None
    lock = root / LOCK
    if lock.exists() and not lock.is_file():
        raise CheckpointError(_lock_in_the_way(lock))


def _lock_in_the_way(lock: Path) -> str:
    return (f"{lock} is a {'directory' if lock.is_dir() else 'special file'}, where partita keeps the lock of the "
            "run that trains into this directory: remove it, or choose another --checkpoint-dir")


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "holder unknown"


def claim(root: str | os.PathLike, continuing: bool) -> tuple[str, int]:
    """Global rank 0, before the first step: take DIR's lock (kept until the process ends or `release`),
    refuse a foreign directory again under it, and return (run id, lock file descriptor). `continuing`: the
    run continues the directory (--resume or a torchrun restart) and takes over its run id."""
    root = Path(root)
    try:
        fd = _lock(root)
    except OSError as e:
        raise CheckpointError(_lock_in_the_way(root / LOCK) if isinstance(e, IsADirectoryError) else
                              f"cannot take the lock {root / LOCK}: {e.strerror or e}; choose a writable "
                              "--checkpoint-dir") from None
    try:
        refuse_foreign(root, continuing)  # again under the lock: another run may have saved since the pre-flight
        run_id = owner_run_id(root) if continuing else None
        if run_id is None:
            run_id = uuid.uuid4().hex[:12]
            atomic_write(root / OWNER, json.dumps({"run_id": run_id, "created": time.time()}) + "\n")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"run {run_id}, pid {os.getpid()} on {socket.gethostname()} since "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
    except OSError as e:
        os.close(fd)
        raise CheckpointError(f"cannot claim --checkpoint-dir {root} for this run: {e.strerror or e}"
                              f"{f': {e.filename}' if e.filename else ''}") from None
    except BaseException:
        os.close(fd)
        raise
    return run_id, fd


def _lock(root: Path) -> int:
    """The descriptor of DIR's lock file, flock'ed; CheckpointError when another run holds it."""
    import fcntl
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        held = _holder(fd)
        os.close(fd)
        raise CheckpointError(f"--checkpoint-dir {root} is in use by another run ({held}): wait for it to end, "
                              "or choose another directory") from None
    return fd


def release(fd: int | None) -> None:
    if fd is not None:
        try:
            os.close(fd)  # closing the descriptor drops the flock
        except OSError:
            pass


def is_locked(root: str | os.PathLike) -> str | None:
    """Who holds DIR's lock, or None when nobody does (a probe for the one-process pre-flight)."""
    import fcntl
    path = Path(root) / LOCK
    if not path.is_file():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return _holder(fd)
    finally:
        os.close(fd)
    return None

"""Saving a checkpoint atomically with DCP, pruning old ones, and loading one into any plan (runtime.checkpoint's
docstring says how a save commits)."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn as nn

from partita.costmodel.errors import PartitaError

if TYPE_CHECKING:  # DCP (and DTensor under it) load when a checkpoint is read or written: ~1.3 s of every
    from torch.distributed.checkpoint.metadata import Metadata  # worker's start otherwise
from partita.runtime.checkpoint.integrity import describe_files
from partita.runtime.launcher.mesh import broadcast_text
from partita.runtime.parallel.zero1 import owned
from partita.runtime.checkpoint.layout import (FORMAT, MANIFEST, SIDECAR, CheckpointError, Checkpoint, step_dir,
                                               tmp_dir, steps, latest)
from partita.runtime.checkpoint.reading import sidecar, manifest_digest


def _names(modules: list[nn.Module]) -> dict[int, str]:
    return {id(p): n for m in modules for n, p in m.named_parameters()}


def model_state(modules: list[nn.Module]) -> dict[str, torch.Tensor]:
    return {f"model.{k}": v for m in modules for k, v in m.state_dict().items()}


def rng_state(rank: int) -> dict[str, torch.Tensor]:
    """This rank's generator states (uint8 tensors on the CPU), keyed as the checkpoint stores them."""
    state = {f"rng.rank{rank}.cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state[f"rng.rank{rank}.cuda"] = torch.cuda.get_rng_state(torch.cuda.current_device())
    return state


def _set_rng_state(state: dict[str, torch.Tensor]) -> None:
    for key, value in state.items():
        if key.endswith(".cpu"):
            torch.set_rng_state(value)
        else:
            torch.cuda.set_rng_state(value, torch.cuda.current_device())


def train_state(modules: list[nn.Module], optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """What this rank contributes to a checkpoint: its model state and its parameters' optimizer state."""
    state = model_state(modules)
    names = _names(modules)
    for p, st in optimizer.state.items():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                state[f"optim.{names[id(p)]}.{k}"] = v
    return state


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` whole or not at all (a synced temporary file renamed over it)."""
    part = path.with_name(path.name + ".part")
    with open(part, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    part.rename(path)
    _fsync_dir(path.parent)


def _commit(tmp: Path, final: Path, manifest: dict, files: dict) -> None:
    """Rank 0: write the manifest (with every file's size and hash) into `tmp` and rename it to `final`
    (replacing an older one, which is put back if the rename fails)."""
    if final.is_symlink() or (final.exists() and not final.is_dir()):
        raise CheckpointError(f"{final} is in the way: it is a {'symbolic link' if final.is_symlink() else 'file'}, "
                              "not a checkpoint directory; move it out of the checkpoint directory")
    text = json.dumps({**manifest, "files": files, "manifest_sidecar": SIDECAR.format(name=final.name)}, indent=2)
    atomic_write(tmp / MANIFEST, text)
    side = sidecar(final)
    before = side.read_text() if side.is_file() else None  # an older checkpoint of this step being replaced
    side.parent.mkdir(exist_ok=True)
    atomic_write(side, f"{manifest_digest(text.encode())}  {final.name}/{MANIFEST}\n")
    old = None
    try:
        if final.exists():
            old = final.with_name(f".{final.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
        tmp.rename(final)
    except OSError:
        if old is not None:
            old.rename(final)
        if before is not None:
            atomic_write(side, before)
        raise
    _fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _clear(path: Path) -> None:
    """Remove whatever is at `path` (a save's temporary name: a stale save, or anything else put there)."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def _os_detail(e: BaseException) -> str:
    """An OSError as "strerror: path" (or any other error's own text), on one line."""
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    return " ".join(str(e).split()) or type(e).__name__


def _intact(root: Path) -> str:
    newest = latest(root)
    return f"the newest checkpoint, {newest}, is intact" if newest else "no checkpoint was saved before"


def _rank0_step(rank: int, action, failure: str, root: Path) -> None:
    """Collective: rank 0 does `action` to the checkpoint directory (every other rank waits for it). Whatever
    stops it there -- a directory made read-only, a full disk, a name taken by something else -- ends every
    rank with the same one-line CheckpointError, `failure (what went wrong); what is intact`."""
    said = None
    if rank == 0:
        try:
            action()
        except (OSError, CheckpointError) as e:
            said = f"{failure} ({_os_detail(e)}); {_intact(root)}"
    said = broadcast_text(said)
    if said:
        raise CheckpointError(said)


def dcp_failure(e: BaseException) -> str:
    """One line for DCP's CheckpointException (a BaseException carrying each failed rank's exception)."""
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict) and failures:
        rank, pair = min(failures.items())
        exc = pair[0] if isinstance(pair, tuple) else pair
        text = " ".join(str(exc).split()) or type(exc).__name__
        return f"rank {rank}: {type(exc).__name__}: {text}"[:300]
    return f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]


def _dcp(action, what: str):
    """Run a DCP save or load; its CheckpointException (not an Exception) becomes one CheckpointError line. A
    collective of DCP's that failed under it (a RuntimeError: a rank lost mid-save, gloo's "Connection closed by
    peer") is no checkpoint problem but a failure like any other collective's: raised as it is, so that torchrun
    restarts the workers (or an elastic job re-plans) from the newest checkpoint, which the atomic save left
    intact, instead of ending the job on a CheckpointError."""
    try:
        return action()
    except (KeyboardInterrupt, SystemExit, RuntimeError, ConnectionError):
        raise
    except BaseException as e:  # noqa: BLE001 -- CheckpointException derives from BaseException
        raise CheckpointError(f"{what} failed ({dcp_failure(e)})") from None


def save(root: str | os.PathLike, step: int, modules: list[nn.Module], optimizer: torch.optim.Optimizer,
         manifest: dict, rank: int, faults=None, keep: int = 0, extra: dict | None = None) -> Path:
    """Collective: every rank writes its share; returns the committed directory. A save that fails anywhere
    in the checkpoint directory (DCP's writes, the temporary directory, the hashes, the manifest, the rename,
    --keep's removals) raises CheckpointError on every rank, one line naming the newest checkpoint, which
    the atomic save left intact. `extra`: more tensors under their own keys (a sync mode's state,
    runtime.loop.sync)."""
    import torch.distributed.checkpoint as dcp
    root = Path(root)
    tmp, final = tmp_dir(root, step), step_dir(root, step)
    what = f"saving the checkpoint of step {step} to {tmp}"
    saving = f"{what} failed"

    def make_tmp():
        root.mkdir(parents=True, exist_ok=True)
        _clear(tmp)
        tmp.mkdir()

    _rank0_step(rank, make_tmp, saving, root)
    state = {**train_state(modules, optimizer), **rng_state(rank), **(extra or {})}  # extra: a sync mode's own
    try:
        _dcp(lambda: dcp.save(state, storage_writer=dcp.FileSystemWriter(tmp, sync_files=True)), what)
    except CheckpointError as e:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # free what it took (a full disk)
        raise CheckpointError(f"{e}; {_intact(root)}") from None
    dist.barrier()
    try:
        files = describe_files(tmp, rank)
    except PartitaError as e:  # every rank alike (runtime.checkpoint.integrity)
        raise CheckpointError(f"{saving} ({e}); {_intact(root)}") from None
    if faults is not None:
        faults.during_save(step)

    def commit():
        _commit(tmp, final, {"format": FORMAT, "step": step, "saved_at": time.time(), **manifest}, files)

    _rank0_step(rank, commit, saving, root)
    if keep:
        _rank0_step(rank, lambda: prune(root, keep, manifest.get("run_id")),
                    f"saved {final}, but removing the run's checkpoints beyond the newest {keep} (--keep) failed",
                    root)
    return final


def prune(root: Path, keep: int, run_id: str | None) -> list[Path]:
    """Rank 0 after a commit: remove this run's committed checkpoints beyond the newest `keep`."""
    ours = [p for p in steps(root) if _run_id(p) in (run_id, None)]
    removed = ours[:-keep] if keep > 0 else []
    for p in removed:
        old = p.with_name(f".{p.name}.old")
        p.rename(old)  # out of sight first: a crash mid-removal never leaves a half checkpoint named step-N
        shutil.rmtree(old, ignore_errors=True)
        sidecar(p).unlink(missing_ok=True)
    return removed


def _run_id(path: Path) -> str | None:
    try:
        return json.loads((path / MANIFEST).read_text()).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None


def load(ckpt: Checkpoint, md: Metadata, modules: list[nn.Module], params: list[torch.Tensor],
         optimizer: torch.optim.Optimizer) -> str | None:
    """Collective: fill this rank's model shards and optimizer state from the checkpoint, in place, and
    restore this rank's generators (module docstring). Returns a note when the generators were not restored."""
    import torch.distributed.checkpoint as dcp
    return load_from(md, dcp.FileSystemReader(ckpt.path), ckpt.manifest.get("world_size"), str(ckpt.path), modules,
                     params, optimizer, f"loading checkpoint {ckpt.path}")


def load_from(md: Metadata, reader, world_then: int | None, source: str, modules: list[nn.Module],
              params: list[torch.Tensor], optimizer: torch.optim.Optimizer, what: str) -> str | None:
    """`load` from any DCP StorageReader (a checkpoint's files, or the nodes' snapshots:
    runtime.checkpoint.recovery) whose state `world_then` ranks wrote; `source` names it in the note.

    Optimizer state is created for each local parameter the checkpoint holds state of, with the
    parameter's placement (DTensor or plain), and DCP reads into it the chunks this rank needs."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    state = model_state(modules)
    names = _names(modules)
    saved: dict[str, dict[str, TensorStorageMetadata]] = {}
    for key, entry in md.state_dict_metadata.items():
        if key.startswith("optim.") and isinstance(entry, TensorStorageMetadata):
            fqn, _, k = key[len("optim."):].rpartition(".")
            saved.setdefault(fqn, {})[k] = entry
    for p in owned(optimizer, params):  # under ZeRO-1 the state of the parameters this rank owns
        fqn = names[id(p)]
        for k, entry in saved.get(fqn, {}).items():
            dtype = entry.properties.dtype
            if tuple(entry.size) == tuple(p.shape):
                target = torch.zeros_like(p, dtype=dtype, requires_grad=False)
            else:
                target = torch.zeros(tuple(entry.size), dtype=dtype)
            optimizer.state[p][k] = target
            state[f"optim.{fqn}.{k}"] = target
    rank, world = dist.get_rank(), dist.get_world_size()
    rng, note = {}, None
    if world_then != world:
        note = (f"note: {source} was written by {world_then} ranks, this run has {world}: "
                "random number generators restart from the seed (dropout masks differ from an uninterrupted run)")
    else:
        for key, value in rng_state(rank).items():
            if key in md.state_dict_metadata:
                rng[key] = torch.empty_like(value)
        if f"rng.rank{rank}.cpu" not in rng:
            note = f"note: {source} holds no generator state: dropout masks differ from an uninterrupted run"
    _dcp(lambda: dcp.load({**state, **rng}, storage_reader=reader), what)
    _set_rng_state(rng)
    return note

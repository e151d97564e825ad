"""Checkpoints with torch.distributed.checkpoint (DCP): saved under one plan, loadable under any other.

Layout of `--checkpoint-dir DIR`:

    DIR/step-00000004/          a complete checkpoint after 4 optimizer steps
        __0_0.distcp ...        DCP shards, one file per rank
        .metadata               DCP's index (global shapes, which file holds which chunk)
        partita.json            manifest: format, step, run id, model fingerprint, train config, seed, data,
                                the plan it was saved under, and the size and SHA-256 of every file above
    DIR/.partita-digests/step-00000004.sha256
                                the SHA-256 of step-00000004/partita.json (`sha256sum -c` reads it in DIR): the
                                manifest is checked against it, so an entry edited or removed in it is seen
    DIR/.step-00000006.tmp/     a save in progress (or one that crashed): never read
    DIR/partita-run.json        the run that owns DIR; DIR/.partita.lock: held while it trains (runtime.checkpoint.ownership)

What is saved: the model state dict under "model.<fqn>" and each parameter's optimizer state under
"optim.<param fqn>.<key>" (AdamW's step, exp_avg, exp_avg_sq), keyed by the user's FQNs whatever the plan
(FSDP2 and tensor-parallel parameters as DTensors, pipeline stages each their own names, data-parallel
replicas once; under ZeRO-1 each by the rank that owns it, runtime.parallel.zero1), so DCP reshards on load: a checkpoint of 4 ranks under one mesh loads into 2 ranks under
another, or into one process. The step is the data position too (batches depend on (seed, step) only).
Hyperparameters (lr, betas, the recipe) come from the run's flags and plan, not from the checkpoint: the lr
schedule is a function of the step (runtime.loop.recipe), so it needs no state of its own.

Each rank's random number generators are saved too, under "rng.rank<R>.cpu" (torch's default CPU
generator) and "rng.rank<R>.cuda" (the current CUDA device's, when there is one), and restored on resume
when the checkpoint was written by as many ranks -- so a model with dropout draws the masks an
uninterrupted run would have drawn, and resumes bit-exactly. Under another world size the ranks' draws
do not correspond, and the generators are left as seeded (`load` says so).

Atomic save: every rank writes into the temporary directory beside the target; once DCP has finished
(all shards and .metadata), rank 0 writes the manifest into it and renames it to `step-<k>`. A crash at
any point before the rename leaves only a `.tmp` directory, which resume ignores (and the next save
removes, whatever is at that name), so the last complete checkpoint stays intact. `latest()` is the complete
checkpoint with the highest step. What rank 0 does to the directory alone (make the temporary directory, write
the manifest, rename, prune) is a collective step (`_rank0_step`): a failure there -- a directory turned
read-only, a full disk, a `step-N` name taken by a file or a symlink -- ends every rank with the same one
line, as DCP's own failures do. DIR must be one directory for all ranks (a shared filesystem across nodes).
With `keep` N, a save then removes the run's older checkpoints beyond the newest N.

Before the first step, `validate` checks a checkpoint against the model and plan -- manifest readable and
equal to its recorded digest (the sidecar in DIR/.partita-digests), fingerprint equal, every file present at its
recorded size and no file the manifest does not list, the data the same (a token file by its content
digest, runtime.data.content_digest), DCP's metadata readable (through a
restricted unpickler that admits only DCP's own metadata classes), every model tensor present with its
shape, the same optimizer -- and raises CheckpointError (one line) otherwise: DamagedCheckpoint when the
checkpoint itself is broken (a resume then falls back to an older one, runtime.loop.session), plain
CheckpointError when it does not fit this run. The content hashes are checked by all ranks together
(runtime.checkpoint.integrity) just before loading. DCP's own failures (a CheckpointException, which derives from
BaseException) become one CheckpointError line that names the checkpoint still intact.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn as nn

from partita.costmodel.errors import PartitaError

if TYPE_CHECKING:  # DCP (and DTensor under it) load when a checkpoint is read or written: ~1.3 s of every
    from torch.distributed.checkpoint.metadata import Metadata  # worker's start otherwise
from partita.runtime.checkpoint.integrity import describe_files, recorded_size
from partita.runtime.launcher.mesh import broadcast_text
from partita.runtime.parallel.zero1 import owned

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


# ---- reading and validating ----------------------------------------------------------------------

class _MetadataUnpickler(pickle.Unpickler):
    """DCP's .metadata is a pickle: admit DCP's own metadata classes and the torch values they hold only."""

    _ALLOWED = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
                ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"),
                ("builtins", "set"), ("builtins", "frozenset")}

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith("torch.distributed.checkpoint.") or (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout,
                                                                         torch.memory_format)):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP metadata")


def read_metadata(path: Path) -> Metadata:
    try:
        with open(path / ".metadata", "rb") as f:
            md = _MetadataUnpickler(f).load()
    except FileNotFoundError:
        raise DamagedCheckpoint(f"checkpoint {path} has no DCP .metadata file") from None
    except Exception as e:  # garbage: any unpickling failure
        raise DamagedCheckpoint(f"checkpoint {path}: DCP .metadata is unreadable ({type(e).__name__}: {e})") from None
    from torch.distributed.checkpoint.metadata import Metadata
    if not isinstance(md, Metadata) or not isinstance(md.state_dict_metadata, dict):
        raise DamagedCheckpoint(f"checkpoint {path}: .metadata is not DCP metadata")
    return md


def sidecar(path: Path) -> Path:
    return path.parent / SIDECAR.format(name=path.name)


def manifest_digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def _check_manifest_digest(path: Path, raw: bytes, manifest: dict) -> None:
    """DamagedCheckpoint when the manifest differs from the digest recorded beside the directory, or when a
    manifest that says it has one lost it. Checkpoints written before sidecars existed are not checked."""
    side, name = sidecar(path), SIDECAR.format(name=path.name)
    try:
        recorded = side.read_text().split()[0]
    except FileNotFoundError:
        if manifest.get("manifest_sidecar"):
            raise DamagedCheckpoint(f"checkpoint {path}: {name}, the digest of its {MANIFEST}, is missing") from None
        return
    except (OSError, UnicodeDecodeError, IndexError):
        raise DamagedCheckpoint(f"checkpoint {path}: {name}, the digest of its {MANIFEST}, is unreadable") from None
    if recorded != manifest_digest(raw):
        raise DamagedCheckpoint(f"checkpoint {path}: {MANIFEST} does not match its digest in {name} (the manifest was "
                                "changed since the checkpoint was saved)")


def open_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint directory's manifest; CheckpointError if it is missing, garbage, or changed since it
    was saved (`_check_manifest_digest`)."""
    path = Path(path)
    m = _STEP.match(path.name)
    try:
        raw = (path / MANIFEST).read_bytes()
        manifest = json.loads(raw)
    except FileNotFoundError:
        raise DamagedCheckpoint(f"checkpoint {path} has no {MANIFEST}: not a complete partita checkpoint") from None
    except (OSError, UnicodeDecodeError, RecursionError, json.JSONDecodeError) as e:
        raise DamagedCheckpoint(f"checkpoint {path}: {MANIFEST} is not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DamagedCheckpoint(f"checkpoint {path}: {MANIFEST} is not a {FORMAT} manifest")
    step = manifest.get("step")
    if not isinstance(step, int) or step < 1 or (m is not None and int(m.group(1)) != step):
        raise DamagedCheckpoint(f"checkpoint {path}: manifest step {step!r} does not match the directory")
    if not isinstance(manifest.get("files"), dict):
        raise DamagedCheckpoint(f"checkpoint {path}: manifest has no file list")
    _check_manifest_digest(path, raw, manifest)
    return Checkpoint(path=path, step=step, manifest=manifest)


def validate(ckpt: Checkpoint, model: nn.Module, fingerprint: str, model_name: str, optimizer: str,
             steps: int, train: dict, data: dict | None = None) -> tuple[Metadata, list[str]]:
    """Check `ckpt` against the model to train (`model` may be on the meta device) before any step.
    Returns DCP's metadata and notes worth printing; raises CheckpointError with one line."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    path, man = ckpt.path, ckpt.manifest
    got = (man.get("model") or {}).get("fingerprint")
    if got != fingerprint:
        raise CheckpointError(f"checkpoint {path} was written for model {(man.get('model') or {}).get('name')!r} "
                              f"(fingerprint {got}), but --model {model_name} has fingerprint {fingerprint}")
    for name, entry in man["files"].items():
        f, size = path / name, recorded_size(entry)
        if not f.is_file():
            raise DamagedCheckpoint(f"checkpoint {path} is missing file {name}")
        if f.stat().st_size != size:
            raise DamagedCheckpoint(f"checkpoint {path}: file {name} has {f.stat().st_size} bytes, "
                                    f"the checkpoint recorded {size} (truncated or overwritten)")
    unlisted = sorted(f.name for f in path.iterdir() if f.name != MANIFEST and f.name not in man["files"])
    if unlisted:
        raise DamagedCheckpoint(f"checkpoint {path} holds {unlisted[0]}, which its {MANIFEST} does not list (a "
                                "file added, or its entry removed, since the checkpoint was saved)")
    md = read_metadata(path)
    for info in (md.storage_data or {}).values():
        rel = getattr(info, "relative_path", None)
        if rel is not None and not (path / rel).is_file():
            raise DamagedCheckpoint(f"checkpoint {path} is missing file {rel}")
    for key, t in model.state_dict().items():
        entry = md.state_dict_metadata.get(f"model.{key}")
        if not isinstance(entry, TensorStorageMetadata):
            raise CheckpointError(f"checkpoint {path} holds no tensor for {key!r} of --model {model_name}")
        if tuple(entry.size) != tuple(t.shape):
            raise CheckpointError(f"checkpoint {path} holds {key!r} of shape {tuple(entry.size)}, --model "
                                  f"{model_name} has {tuple(t.shape)}")
    saved_opt = (man.get("train") or {}).get("optimizer")
    if saved_opt != optimizer:
        raise CheckpointError(f"checkpoint {path} holds {saved_opt} optimizer state; the plan trains with {optimizer}")
    if ckpt.step >= steps:
        raise CheckpointError(f"checkpoint {path} is at step {ckpt.step}; --steps {steps} leaves nothing to train")
    notes = []
    for key in ("global_batch", "seq_len"):
        was, now = (man.get("train") or {}).get(key), train.get(key)
        if was != now:
            notes.append(f"note: checkpoint trained with {key} {was}, this run uses {now}")
    was = man.get("data")
    if data is not None and isinstance(was, dict):
        _check_data_content(path, was, data)
        if not _same_data(was, data):
            notes.append(f"note: the batches differ from those the checkpoint trained on (then {_data(was)}, now "
                         f"{_data(data)}), so the run does not continue the checkpoint's trajectory")
    return md, notes


def _same_data(was: dict, now: dict) -> bool:
    """Whether two data descriptions (runtime.data `describe()`) give the same batches: a token file by its
    content digest where both have one (the path may change), else every field."""
    if was.get("kind") == now.get("kind") == "file" and was.get("sha256") and now.get("sha256"):
        return was["sha256"] == now["sha256"] and was.get("seed") == now.get("seed")
    drop = {"sha256"}
    return {k: v for k, v in was.items() if k not in drop} == {k: v for k, v in now.items() if k not in drop}


def _check_data_content(path: Path, was: dict, now: dict) -> None:
    """CheckpointError when the token file the checkpoint trained on, at the same path, now holds other
    content: the run would silently continue on other batches."""
    if not (was.get("kind") == now.get("kind") == "file" and was.get("path") == now.get("path")):
        return
    then, here = was.get("sha256"), now.get("sha256")
    if then and here and then != here:
        raise CheckpointError(f"checkpoint {path} trained on token file {now.get('path')} with content sha256 "
                              f"{then[:16]}; the file now has sha256 {here[:16]} (it changed since the checkpoint "
                              "was saved): put the original file back to continue the run, or give the new data "
                              "under another file name to train on it from this checkpoint")


def _data(d: dict) -> str:
    where = {"file": d.get("path"), "dataset": f"dataset {d.get('factory')}"}.get(d.get("kind"), "synthetic")
    digest = f", sha256 {d['sha256'][:16]}" if d.get("sha256") else ""
    return f"{where}{digest}, seed {d.get('seed')}"


# ---- saving and loading --------------------------------------------------------------------------

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
    """Run a DCP save or load; its CheckpointException (not an Exception) becomes one CheckpointError line."""
    try:
        return action()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 -- CheckpointException derives from BaseException
        raise CheckpointError(f"{what} failed ({dcp_failure(e)})") from None


def save(root: str | os.PathLike, step: int, modules: list[nn.Module], optimizer: torch.optim.Optimizer,
         manifest: dict, rank: int, faults=None, keep: int = 0) -> Path:
    """Collective: every rank writes its share; returns the committed directory. A save that fails anywhere
    in the checkpoint directory (DCP's writes, the temporary directory, the hashes, the manifest, the rename,
    --keep's removals) raises CheckpointError on every rank, one line naming the newest checkpoint, which
    the atomic save left intact."""
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
    state = {**train_state(modules, optimizer), **rng_state(rank)}
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
    restore this rank's generators (module docstring). Returns a note when the generators were not restored.

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
    if ckpt.manifest.get("world_size") != world:
        note = (f"note: {ckpt.path} was written by {ckpt.manifest.get('world_size')} ranks, this run has {world}: "
                "random number generators restart from the seed (dropout masks differ from an uninterrupted run)")
    else:
        for key, value in rng_state(rank).items():
            if key in md.state_dict_metadata:
                rng[key] = torch.empty_like(value)
        if f"rng.rank{rank}.cpu" not in rng:
            note = f"note: {ckpt.path} holds no generator state: dropout masks differ from an uninterrupted run"
    _dcp(lambda: dcp.load({**state, **rng}, storage_reader=dcp.FileSystemReader(ckpt.path)),
         f"loading checkpoint {ckpt.path}")
    _set_rng_state(rng)
    return note

"""Reading a checkpoint and checking it against the model and the run before the first step (runtime.checkpoint's
docstring says what `validate` checks)."""
from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn


if TYPE_CHECKING:  # DCP (and DTensor under it) load when a checkpoint is read or written: ~1.3 s of every
    from torch.distributed.checkpoint.metadata import Metadata  # worker's start otherwise
from partita.runtime.checkpoint.integrity import recorded_size
from partita.runtime.checkpoint.layout import (FORMAT, MANIFEST, SIDECAR, _STEP, CheckpointError, DamagedCheckpoint,
                                               Checkpoint)


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

"""Content hashes of a checkpoint's files: written at save, checked before a resume loads them.

A manifest (runtime.checkpoint) records each file as {"bytes": size, "sha256": hex digest}. The work is
shared by the ranks: at save each rank hashes the shards it wrote (DCP names them `__<rank>_<n>.distcp`;
rank 0 also `.metadata`) and rank 0 gathers the digests into the manifest; before a resume the files are
dealt round-robin over the ranks, each hashes its share, and one all-reduce tells every rank which files
differ, so every rank reaches the same verdict. Each file is read once, by one rank.

SHA-256 (FIPS 180-4) detects any change of content, including the same-size edits a size check misses;
it is read in 8 MiB chunks, so memory stays flat whatever the shard size.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
import torch.distributed as dist

from partita.costmodel.errors import PartitaError
from partita.runtime.launcher.mesh import gather_text

ALGORITHM = "sha256"


CHUNK = 8 * 2**20


def digest(path: Path) -> str:
    h = hashlib.new(ALGORITHM)
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def written_by(rank: int, names: list[str]) -> list[str]:
    """The files of a DCP save this rank wrote: its shards, and DCP's .metadata on the coordinator (rank 0)."""
    return [n for n in names if n.startswith(f"__{rank}_") or (rank == 0 and n == ".metadata")]


def _hashed_here(directory: Path, rank: int, world: int) -> dict[str, dict]:
    """The entries this rank contributes: the files it wrote, and on rank 0 any file no rank claims (so
    nothing goes unrecorded)."""
    names = sorted(f.name for f in directory.iterdir() if f.is_file())
    mine = written_by(rank, names)
    if rank == 0:
        claimed = {n for r in range(world) for n in written_by(r, names)}
        mine += [n for n in names if n not in claimed]
    return {n: {"bytes": (directory / n).stat().st_size, ALGORITHM: digest(directory / n)} for n in mine}


def describe_files(directory: Path, rank: int) -> dict[str, dict]:
    """Collective: {file name: {"bytes", "sha256"}} of every file in a finished DCP save, on every rank, each
    file hashed by one rank (`_hashed_here`). A rank that cannot read its files ends every rank alike:
    PartitaError naming it."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    try:
        said = {"files": _hashed_here(directory, rank, world)}
    except OSError as e:
        said = {"error": f"rank {rank} cannot hash its files: {e.strerror or e}: {e.filename}"}
    files: dict[str, dict] = {}
    for text in gather_text(json.dumps(said)):
        got = json.loads(text)
        if "error" in got:
            raise PartitaError(got["error"])
        files.update(got["files"])
    return files


def recorded_size(entry) -> int | None:
    """A manifest entry's size: {"bytes": n, ...}, or a bare n (manifests written before content hashes)."""
    if isinstance(entry, dict):
        entry = entry.get("bytes")
    return entry if isinstance(entry, int) and not isinstance(entry, bool) else None


def mismatched(directory: Path, files: dict, rank: int, world: int, device: torch.device) -> list[str]:
    """Collective when a process group exists: the files whose content differs from their recorded hash.
    Entries without a hash (older manifests) are not checked here."""
    names = sorted(n for n, e in files.items() if isinstance(e, dict) and isinstance(e.get(ALGORITHM), str))
    bad = torch.zeros(len(names), dtype=torch.int32, device=device)
    for i in range(rank, len(names), world):
        path = directory / names[i]
        if not path.is_file() or digest(path) != files[names[i]][ALGORITHM]:
            bad[i] = 1
    if world > 1 and len(names):
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    return [n for n, b in zip(names, bad.tolist()) if b]

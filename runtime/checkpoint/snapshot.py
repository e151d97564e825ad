"""Snapshots of the training state in the nodes' memory, so that a failure costs a step or two, not the work since
the last checkpoint on disk (runtime.checkpoint.recovery reads them back, into any plan).

The idea is Gemini's (Wang et al., "Gemini: Fast Failure Recovery in Distributed Training with In-Memory
Checkpoints", SOSP 2023): every rank copies its state into host memory after the step, and a node's copy is also
kept by another node, so the loss of one machine loses no snapshot. torchrun restarts every worker after any
failure, so the copy must outlive the worker processes: it is a file on the node's tmpfs (/dev/shm), in the
directory the node's `partita run` process makes for it (SNAPSHOT_DIR_ENV, runtime.launcher.child) and removes
when the node's job ends.

Layout of a node's directory (one per node, never shared with another node):

    step-00000012/rank-00003.bin    the bytes of the tensors rank 3 held after step 12, one after another (each at
                                    a multiple of ALIGN): raw, no pickle, read back mapped (`read`)
    step-00000012/rank-00003.json   what they are: each key's dtype, shape and place in the .bin, its chunk (offsets
                                    and sizes in the global tensor, as DCP describes a shard), and the run they
                                    belong to. Written before the .bin is renamed into place, which commits the
                                    pair: a .json without its .bin is never read.

The copy runs in a thread of its own (`Writer`) beside the next step's forward and backward, whose optimizer step
waits for it. A rank's tensors are its own shards, keyed as a checkpoint keys them (runtime.checkpoint.train_state): each
parameter's weights and optimizer state, and its generators. A shard other ranks hold too (a data-parallel replica)
is cut along its first dimension among them, each writing its piece (`Layout.pieces`), so that the world's snapshot
holds each byte of the state once -- what one rank copies is the state over the world's size, not its whole shard.
Every byte then being on one node only, each rank also sends its pair to the rank of the same local index on the
next node (a ring), which keeps it beside its own (`Layout.ring`; none on one node). A node keeps its two newest
snapshots: a failure during one leaves the one before it whole.

A snapshot is a help, never a requirement: a rank whose node's tmpfs is full says so once, removes what it wrote of
that step and tries again at the next; the checkpoint on disk is where a failure resumes from meanwhile.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from partita.runtime.launcher.child import SNAPSHOT_DIR_ENV
from partita.runtime.launcher.mesh import gather_text

FORMAT = "partita.snapshot/1"
KEEP = 2
_STEP = re.compile(r"^step-(\d{8})$")


def node_dir() -> Path | None:
    """This node's snapshot directory, when the launcher made one."""
    d = os.environ.get(SNAPSHOT_DIR_ENV)
    return Path(d) if d and Path(d).is_dir() else None


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """The step directories in a node's snapshot directory, oldest first."""
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP.match(p.name))] \
        if root.is_dir() else []
    return sorted(found)


def chunk_of(t: torch.Tensor) -> tuple[torch.Tensor, list[int], list[int], list[int]] | None:
    """(the local tensor, its offsets and sizes in the global tensor, the global size), DCP's view of a shard; None
    for an empty shard (FSDP's padding rank)."""
    from torch.distributed.tensor import DTensor
    if isinstance(t, DTensor):
        chunks = t.__create_chunk_list__()
        local = t.to_local()
        if not chunks or local.numel() == 0:
            return None
        return local, list(chunks[0].offsets), list(chunks[0].sizes), list(t.shape)
    return t, [0] * t.dim(), list(t.shape), list(t.shape)


@dataclass
class Layout:
    """What every snapshot of this world shares, agreed once by all ranks (`agree`)."""

    world_id: str
    keys_total: int
    """Distinct keys of the whole state, less the generators: a snapshot that lacks one cannot be resumed from."""
    ring: list[tuple[int, int]]
    """(sender, receiver) rank pairs: each sender's snapshot is kept on the receiver's node too (none on one node)."""
    pieces: dict[str, tuple[int, int] | None] = field(default_factory=dict)
    """This rank's share of each chunk other ranks hold too (a replica): (start, length) along the local tensor's
    first dimension, or None where another holder writes it all; a key not here is written whole."""
    group: object = None
    """A gloo process group of every rank, for the ring's sends: the snapshot goes out from a thread of its own
    (`Writer`) while the training's collectives run on the others, and from the file's pages (CPU) under NCCL too."""


def _is_rng(key: str) -> bool:
    return key.startswith("rng.")


def _pieces(said: list[dict], rank: int) -> dict[str, tuple[int, int] | None]:
    """Each replicated chunk of this rank cut along its first dimension among the ranks that hold it, so that a
    snapshot holds each byte of the state once (as DCP's save writes a replica once); a chunk too short to cut (a
    scalar) goes whole to its first holder."""
    holders: dict[str, list[int]] = {}
    for r, s in enumerate(said):
        for key, offsets, _ in s["chunks"]:
            holders.setdefault(json.dumps([key, offsets]), []).append(r)
    out = {}
    for key, offsets, sizes in said[rank]["chunks"]:
        ranks = holders[json.dumps([key, offsets])]
        n, i = len(ranks), ranks.index(rank)
        if n == 1:
            continue
        if not sizes or sizes[0] < n:
            out[key] = None if i else (0, sizes[0] if sizes else 1)
        else:
            out[key] = (sizes[0] * i // n, sizes[0] * (i + 1) // n - sizes[0] * i // n)
    return out


def agree(state: dict[str, torch.Tensor], root: Path, rank: int) -> Layout:
    """Collective: the world's id, its key count, each rank's pieces and the ring, from every rank's chunks and node
    directory. With the replicas cut into pieces every byte is on one rank only, so a world of several nodes keeps
    each rank's snapshot on the next node too."""
    mine = {"dir": str(root), "id": uuid.uuid4().hex if rank == 0 else "",
            "chunks": [[k, c[1], c[2]] for k, t in state.items() if not _is_rng(k) and (c := chunk_of(t)) is not None]}
    said = [json.loads(t) for t in gather_text(json.dumps(mine))]
    nodes: dict[str, list[int]] = {}
    for r, s in enumerate(said):
        nodes.setdefault(s["dir"], []).append(r)
    order = list(nodes.values())
    ring = [(s, order[(i + 1) % len(order)][j % len(order[(i + 1) % len(order)])])
            for i, ranks in enumerate(order) for j, s in enumerate(ranks)] if len(order) > 1 else []
    keys = {c[0] for s in said for c in s["chunks"]}
    group = dist.new_group(backend="gloo") if ring else None
    return Layout(world_id=said[0]["id"], keys_total=len(keys), ring=ring, pieces=_pieces(said, rank), group=group)


ALIGN = 64
"""Each tensor's bytes start at a multiple of this in its file, so that a view of them has its dtype's alignment."""


def _placed(state: dict[str, torch.Tensor], pieces: dict) -> tuple[dict, list[tuple[torch.Tensor, int]], int]:
    """Where each local tensor (or its piece, Layout.pieces) goes in the rank's file: the index entries {key: chunk
    and byte place}, the (tensor, byte offset) pairs, and the file's size."""
    chunks, parts, at = {}, [], 0
    for key, t in state.items():
        c = chunk_of(t)
        if c is None or (key in pieces and pieces[key] is None):
            continue
        local, offsets, sizes, size = c
        if pieces.get(key) is not None and local.dim():
            start, length = pieces[key]
            local, offsets, sizes = local.narrow(0, start, length), [offsets[0] + start, *offsets[1:]], \
                [length, *sizes[1:]]
        n = local.numel() * local.element_size()
        chunks[key] = {"offsets": offsets, "sizes": sizes, "size": size, "dtype": str(local.dtype).split(".")[-1],
                       "shape": list(local.shape), "at": at, "bytes": n}
        parts.append((local.detach(), at))
        at += -(-n // ALIGN) * ALIGN
    return chunks, parts, at


def mapped(path: Path, size: int) -> torch.Tensor:
    """A file of `size` bytes, its space taken now (ENOSPC here, never a SIGBUS when a page of a full tmpfs is first
    written), as a uint8 tensor mapped onto it: what is copied into the tensor is in the file."""
    with open(path, "wb") as f:
        if size:
            os.posix_fallocate(f.fileno(), 0, size)
    return torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8) if size else \
        torch.empty(0, dtype=torch.uint8)


def read(path: Path, entry: dict, size: int) -> torch.Tensor:
    """One tensor of a snapshot file (`entry`: its index entry; `size`: the file's bytes), mapped, not copied."""
    raw = torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)
    return raw[entry["at"]:entry["at"] + entry["bytes"]].view(getattr(torch, entry["dtype"])).reshape(entry["shape"])


def _commit(folder: Path, writer: int, meta: bytes) -> None:
    """The .json, then the rename of the .bin that commits the pair (module docstring)."""
    path = folder / f"rank-{writer:05d}.json"
    part = path.with_name(path.name + ".part")
    part.write_bytes(meta)
    part.rename(path)
    (folder / f"rank-{writer:05d}.bin.part").rename(folder / f"rank-{writer:05d}.bin")


def _exchange(layout: Layout, rank: int, meta: bytes, data: torch.Tensor | None,
              folder: Path) -> list[tuple[int, bytes, bool]]:
    """Collective over the ring's pairs: send this rank's index and bytes to its receiver, and take its senders'
    into files of their own in `folder` (where their space can be had). Returns (sender, index, kept) each."""
    sends, recvs = [d for s, d in layout.ring if s == rank], [s for s, d in layout.ring if d == rank]
    mine = torch.frombuffer(bytearray(meta), dtype=torch.uint8)
    size = torch.tensor([mine.numel(), data.numel() if data is not None else -1], dtype=torch.long)
    sizes = {s: torch.zeros(2, dtype=torch.long) for s in recvs}
    _p2p([(size, d) for d in sends], [(sizes[s], s) for s in recvs], layout.group)
    metas = {s: torch.empty(int(sizes[s][0]), dtype=torch.uint8) for s in recvs}
    datas, kept = {}, {}
    for s in recvs:
        n = max(0, int(sizes[s][1]))
        try:
            datas[s], kept[s] = mapped(folder / f"rank-{s:05d}.bin.part", n), bool(sizes[s][1] >= 0)
        except OSError:  # no room on this node: received and dropped
            datas[s], kept[s] = torch.empty(n, dtype=torch.uint8), False
    out = [*([(mine, d) for d in sends]), *([(data, d) for d in sends if data is not None])]
    _p2p(out, [(metas[s], s) for s in recvs] + [(datas[s], s) for s in recvs if sizes[s][1] >= 0], layout.group)
    return [(s, metas[s].numpy().tobytes(), kept[s]) for s in recvs]


def _p2p(sends: list, recvs: list, group) -> None:
    """Point-to-point sends and receives of CPU tensors over the layout's gloo group (global ranks)."""
    works = [dist.isend(t, peer, group=group) for t, peer in sends] + \
        [dist.irecv(t, peer, group=group) for t, peer in recvs]
    for w in works:
        w.wait()


def write(root: Path, step: int, state: dict[str, torch.Tensor], info: dict, layout: Layout, rank: int) -> str | None:
    """Collective when the layout has a ring: this rank's snapshot of `step` into its node's directory, and the
    ring's copies it receives. Each tensor is copied once, from the device (or the CPU) straight into the file's
    pages. Returns a note when the node's tmpfs refused it (nothing is raised)."""
    chunks, parts, size = _placed(state, layout.pieces)
    meta = json.dumps({**info, "format": FORMAT, "step": step, "rank": rank, "world_id": layout.world_id,
                       "keys_total": layout.keys_total, "bytes": size, "chunks": chunks}).encode()
    folder, data, why = root / f"step-{step:08d}", None, None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        data = mapped(folder / f"rank-{rank:05d}.bin.part", size)
        for t, at in parts:
            data[at:at + t.numel() * t.element_size()].copy_(t.reshape(-1).view(torch.uint8))
    except OSError as e:
        why = e
    received = _exchange(layout, rank, meta, data, folder) if layout.ring else []
    try:
        if why is not None:
            raise why
        _commit(folder, rank, meta)
        for sender, theirs, kept in received:
            if kept:
                _commit(folder, sender, theirs)
    except OSError as e:  # free what this rank wrote of the step (its node-mates' files are theirs)
        for writer in [rank, *(sender for sender, _, _ in received)]:
            for name in (f"rank-{writer:05d}.{x}" for x in ("bin", "bin.part", "json", "json.part")):
                (folder / name).unlink(missing_ok=True)
        return f"note: the snapshot of step {step} did not fit in {root} ({e.strerror}); failures resume from disk"
    return None


def prune(root: Path | None, newest: int) -> None:
    """A node's local rank 0, after a snapshot or a resume at step `newest`: remove its steps beyond the newest KEEP
    up to `newest`, and any newer (left by a world that failed after it: never to be mixed with this one's)."""
    if root is None or int(os.environ.get("LOCAL_RANK", "0")) != 0:
        return
    found = step_dirs(root)
    kept = [s for s, _ in found if s <= newest][-KEEP:]
    for s, path in found:
        if s not in kept:
            shutil.rmtree(path, ignore_errors=True)


class Writer:
    """Snapshots written in a thread of their own, overlapped with the next step's forward and backward (as Gemini
    overlaps its copies with training): `start` after step k's optimizer step hands the thread step k's tensors, and
    `wait` -- before step k + 1's optimizer step changes them in place, at the last step, at a stop -- joins it.
    Only the optimizer step writes the weights and the optimizer state, so what the thread copies is step k's.
    On a GPU the copies run on a stream of their own, after the optimizer step's kernels (an event)."""

    def __init__(self, root: Path, layout: Layout, rank: int):
        self.root, self.layout, self.rank = root, layout, rank
        self.thread: threading.Thread | None = None
        self.result: list = []

    def start(self, step: int, state: dict[str, torch.Tensor], info: dict) -> None:
        self.wait()
        done = None
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            done = (torch.cuda.current_device(), torch.cuda.Event())  # the thread's device is not this one's else
            done[1].record()
        self.result = []
        self.thread = threading.Thread(target=self._run, args=(step, state, info, done), daemon=True,
                                       name=f"partita-snapshot-{step}")
        self.thread.start()

    def _run(self, step: int, state: dict, info: dict, done) -> None:
        try:
            if done is not None:
                with torch.cuda.device(done[0]):
                    side = torch.cuda.Stream()
                    side.wait_event(done[1])
                    with torch.cuda.stream(side):
                        note = write(self.root, step, state, info, self.layout, self.rank)
                    side.synchronize()
            else:
                note = write(self.root, step, state, info, self.layout, self.rank)
            prune(self.root, step)
            self.result = [note]
        except BaseException as e:  # noqa: BLE001 -- handed to the training thread at `wait`
            self.result = [e]

    def wait(self) -> str | None:
        """Join the snapshot in flight, if any: its note (a tmpfs that refused it), or raise what failed it."""
        if self.thread is None:
            return None
        self.thread.join()
        self.thread = None
        if self.result and isinstance(self.result[0], BaseException):
            raise self.result[0]
        return self.result[0] if self.result else None

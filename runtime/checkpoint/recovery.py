"""Resuming from the snapshots in the nodes' memory (runtime.checkpoint.snapshot), under any plan, when they are newer
than the newest checkpoint on disk.

After a failure every rank of the new world (the same size, or another plan for the nodes left) lists its node's
snapshot directory, and the ranks agree (`choose`, the same answer on every rank from the same gathered lists) on the
newest step whose snapshot is whole among the nodes still up:

- every file of that step belongs to one world of this run (the same run id, model fingerprint, training settings,
  seed and data as this run's manifest), and to the step's newest world where two wrote it;
- its chunks hold every key that world held (`keys_total`, generators aside), and every key whole: the distinct
  chunks of a key (a plan's shards of it, replicas once) add up to the key's size;
- every tensor of this run's model is there with its shape.

Then DCP loads it as it loads a checkpoint (runtime.checkpoint.saving.load_from), through `PeerReader`, a DCP
StorageReader whose storage is the ranks themselves: DCP's planner says which chunk of which key each rank needs
(the resharding into the new plan is DCP's own); the reader's global plan (on the coordinator) names, for each
chunk a rank's node does not hold, a rank of a node that does -- the least loaded one -- and in `read_data` every rank
sends the pieces asked of it and receives its own, point to point, in one order all ranks derive from the plan.
A chunk on the rank's own node is read from its tmpfs file.

Where no step is whole (a node and the one keeping its copy both lost, a snapshot that did not fit), the run resumes
from the checkpoint on disk, and says why.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist

from partita.runtime.checkpoint import snapshot
from partita.runtime.checkpoint.saving import load_from
from partita.runtime.launcher.mesh import gather_text

_IDENTITY = ("run_id", "model", "train", "seed", "data")
PLAIN_SYNC = ("synchronous", "compressed")
"""Sync modes without state of their own (planner.plan.sync): the others keep theirs in checkpoints only."""


def snapshots_off(plan, opts) -> str | None:
    """Why this run keeps no snapshots in memory though --snapshot-every asks for them; None otherwise. They need a
    node directory from the launcher and a sync mode without state of its own."""
    if not opts.snapshot_every:
        return None
    if snapshot.node_dir() is None:
        return "no node directory for snapshots (`partita run` and runtime.launch make one)"
    if plan.sync.mode not in PLAIN_SYNC:
        return f"sync mode {plan.sync.mode} keeps state of its own, which only checkpoints on disk hold"
    return None


def snapshots_on(plan, opts) -> bool:
    """Whether this run keeps snapshots in memory, and resumes from them."""
    return bool(opts.snapshot_every) and snapshots_off(plan, opts) is None


def identity(manifest: dict) -> dict:
    """What a snapshot must share with this run to be resumed: run id, model, training settings, seed, data."""
    return {k: manifest.get(k) for k in _IDENTITY}


def _listing(root: Path | None, lists: bool = True) -> dict:
    """This rank's node directory and, where it `lists` (a node's local rank 0: one listing a node is enough), its
    committed snapshot files (the index of each whose .bin exists)."""
    files = []
    for step, folder in snapshot.step_dirs(root) if root is not None and lists else []:
        for meta in sorted(folder.glob("rank-*.json")):
            if meta.with_suffix(".bin").is_file():
                try:
                    f = json.loads(meta.read_text())
                except (OSError, ValueError):
                    continue
                if well_formed(f, meta.with_suffix(".bin").stat().st_size):
                    files.append(f)
    return {"dir": str(root) if root is not None else "", "files": files}


def _ints(v, n: int | None = None) -> bool:
    return isinstance(v, list) and all(type(x) is int and x >= 0 for x in v) and (n is None or len(v) == n)


def well_formed(f: dict, size: int) -> bool:
    """Whether a snapshot index is one `snapshot.write` writes, for a .bin of `size` bytes: every tensor a known dtype
    and inside the file, its chunk inside its tensor. Anything else is passed over, never read."""
    if not (isinstance(f, dict) and f.get("format") == snapshot.FORMAT and type(f.get("step")) is int and
            type(f.get("rank")) is int and f.get("bytes") == size and isinstance(f.get("chunks"), dict)):
        return False
    for c in f["chunks"].values():
        if not (isinstance(c, dict) and isinstance(getattr(torch, str(c.get("dtype")), None), torch.dtype) and
                _ints(c.get("size")) and _ints(c.get("offsets"), len(c["size"])) and
                _ints(c.get("sizes"), len(c["size"])) and _ints(c.get("shape")) and _ints([c.get("at"), c.get("bytes")])
                and c["at"] + c["bytes"] <= size and math.prod(c["shape"]) == math.prod(c["sizes"]) and
                c["bytes"] == math.prod(c["shape"]) * getattr(torch, c["dtype"]).itemsize and
                all(o + n <= m for o, n, m in zip(c["offsets"], c["sizes"], c["size"]))):
            return False
    return True


@dataclass
class Choice:
    step: int
    world_size: int
    metadata: object
    holders: dict[tuple[str, tuple[int, ...]], list[int]]
    """Each chunk (key, offsets): the ranks of this world whose node holds it."""
    paths: dict[tuple[str, tuple[int, ...]], tuple[Path, dict, int]]
    """The chunks this rank's node holds: the file of each, its index entry, and the file's size."""


def _groups(said: list[dict], after: int) -> dict[tuple[int, str], list[tuple[str, dict]]]:
    """(step, world id) -> [(node directory, file)] of the steps after `after`; each directory's files once."""
    groups, seen = {}, set()
    for listing in said:
        if not listing["dir"] or not listing["files"] or listing["dir"] in seen:
            continue
        seen.add(listing["dir"])
        for f in listing["files"]:
            if isinstance(f.get("step"), int) and f["step"] > after and f.get("format") == snapshot.FORMAT:
                groups.setdefault((f["step"], f.get("world_id")), []).append((listing["dir"], f))
    return groups


def _whole(files: list[tuple[str, dict]], expect: dict, shapes: dict[str, tuple]) -> tuple[dict | None, str]:
    """The chunks of one step's files, {key: {offsets: (sizes, size, dtype, [dirs])}}, or None and why not."""
    chunks: dict[str, dict] = {}
    for where, f in files:
        if identity(f) != expect:
            return None, "written by another run or under other settings"
        for key, c in f["chunks"].items():
            entry = chunks.setdefault(key, {}).setdefault(tuple(c["offsets"]), (c["sizes"], c["size"], c["dtype"], []))
            entry[3].append(where)
    keys = [k for k in chunks if not k.startswith("rng.")]
    if len(keys) < files[0][1]["keys_total"]:
        total = files[0][1]["keys_total"]
        return None, f"{total - len(keys)} of its {total} tensors were only on the nodes lost"
    for key in keys:
        parts = chunks[key].values()
        size = next(iter(parts))[1]
        if sum(math.prod(p[0]) for p in parts) != math.prod(size):
            return None, f"part of {key} was only on the nodes lost"
    for key, shape in shapes.items():
        have = chunks.get(f"model.{key}")
        if have is None or tuple(next(iter(have.values()))[1]) != tuple(shape):
            return None, f"it holds no {key} of this model's shape"
    return chunks, ""


def choose(said: list[dict], rank: int, after: int, expect: dict, shapes: dict[str, tuple]) -> tuple[Choice | None,
                                                                                                     str]:
    """The newest whole step after `after` (module docstring), from every rank's `_listing`; or None and why."""
    from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, Metadata, TensorProperties,
                                                       TensorStorageMetadata)
    groups, why = _groups(said, after), ""
    for (step, _), files in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[1][0][1].get("time", 0)),
                                   reverse=True):
        chunks, missing = _whole(files, expect, shapes)
        if chunks is None:
            why = why or f"the snapshot of step {step} is not whole: {missing}"  # the newest step's reason
            continue
        md, holders, paths = Metadata(state_dict_metadata={}), {}, {}
        for key, parts in chunks.items():
            size, dtype = next(iter(parts.values()))[1], next(iter(parts.values()))[2]
            md.state_dict_metadata[key] = TensorStorageMetadata(
                properties=TensorProperties(dtype=getattr(torch, dtype)), size=torch.Size(size),
                chunks=[ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(p[0])) for o, p in parts.items()])
            for offsets, (_, _, _, dirs) in parts.items():
                holders[(key, offsets)] = [r for r, s in enumerate(said) if s["dir"] in dirs]
                if said[rank]["dir"] in dirs:
                    mine = next(f for d, f in files if d == said[rank]["dir"] and
                                list(offsets) == f["chunks"].get(key, {}).get("offsets"))
                    paths[(key, offsets)] = (Path(said[rank]["dir"]) / f"step-{step:08d}" /
                                             f"rank-{mine['rank']:05d}.bin", mine["chunks"][key], mine["bytes"])
        return Choice(step, files[0][1]["world_size"], md, holders, paths), ""
    return None, why


class PeerReader:
    """A DCP StorageReader over the ranks' snapshots (module docstring)."""

    def __init__(self, choice: Choice, device: torch.device):
        self.choice, self.device = choice, device

    def reset(self, checkpoint_id=None) -> None:
        pass

    def read_metadata(self):
        return self.choice.metadata

    def set_up_storage_reader(self, metadata, is_coordinator: bool, **kwargs) -> None:
        pass

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        """Coordinator: who sends each chunk a rank's node lacks (the holder that has sent least so far)."""
        sent = [0] * len(plans)
        sends, recvs, seq = [[] for _ in plans], [[] for _ in plans], 0
        for r, plan in enumerate(plans):
            for i, item in enumerate(plan.items):
                key = (item.storage_index.fqn, tuple(item.storage_index.offset))
                holders = self.choice.holders[key]
                if r in holders:
                    continue
                src = min(holders, key=lambda h: (sent[h], h))
                sent[src] += math.prod(item.lengths)
                sends[src].append((seq, r, *key[:1], list(key[1]), list(item.storage_offsets), list(item.lengths)))
                recvs[r].append((seq, i, src))
                seq += 1
        return [replace(p, storage_data={"send": sends[r], "recv": recvs[r]}) for r, p in enumerate(plans)]

    def _block(self, fqn: str, offsets, start, lengths) -> torch.Tensor:
        t = snapshot.read(*self.choice.paths[(fqn, tuple(offsets))])
        for dim, (s, n) in enumerate(zip(start, lengths)):
            t = t.narrow(dim, s, n)
        return t

    def read_data(self, plan, planner):
        ops = sorted([(s[0], "send", s) for s in plan.storage_data["send"]] +
                     [(r[0], "recv", r) for r in plan.storage_data["recv"]])
        incoming, works, remote = [], [], {r[1] for r in plan.storage_data["recv"]}
        for seq, kind, op in ops:
            if kind == "send":
                _, dst, fqn, offsets, start, lengths = op
                works.append(dist.isend(self._block(fqn, offsets, start, lengths).contiguous().to(self.device), dst,
                                        tag=seq))
            else:
                _, i, src = op
                item = plan.items[i]
                dtype = self.choice.metadata.state_dict_metadata[item.storage_index.fqn].properties.dtype
                buf = torch.empty(tuple(item.lengths), dtype=dtype, device=self.device)
                works.append(dist.irecv(buf, src, tag=seq))
                incoming.append((item, buf))
        for i, item in enumerate(plan.items):
            if i not in remote:
                _commit(planner, item, self._block(item.storage_index.fqn, item.storage_index.offset,
                                                   item.storage_offsets, item.lengths))
        for w in works:
            w.wait()
        for item, buf in incoming:
            _commit(planner, item, buf)
        done = torch.futures.Future()
        done.set_result(None)
        return done

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return False


def _commit(planner, item, source: torch.Tensor) -> None:
    target = planner.resolve_tensor(item).detach()
    target.copy_(source)
    planner.commit_tensor(item, target)


@dataclass
class Recovered:
    step: int
    world_size: int
    """The world that wrote the snapshot."""
    note: str | None
    """load_from's note (generators not restored), if any."""


def recover(modules, params, optimizer, after: int, manifest: dict,
            device: torch.device) -> tuple[Recovered | None, str | None]:
    """Collective: load the newest whole snapshot newer than step `after` (the checkpoint on disk, or 0) into this
    rank's model and optimizer. Returns (what was loaded, or None: nothing was), and why no snapshot served where
    some newer than `after` exist. `manifest`: this run's checkpoint manifest, whose identity every snapshot file
    must share."""
    rank, root = dist.get_rank(), snapshot.node_dir()
    lists = int(os.environ.get("LOCAL_RANK", "0")) == 0
    said = [json.loads(t) for t in gather_text(json.dumps(_listing(root, lists)))]
    shapes = {k: tuple(v.shape) for m in modules for k, v in m.state_dict().items()}
    choice, why = choose(said, rank, after, identity(manifest), shapes)
    if choice is None:
        snapshot.prune(root, after)
        return None, (f"note: {why}; resuming from the checkpoint on disk" if why else None)
    note = load_from(choice.metadata, PeerReader(choice, device), choice.world_size,
                     f"the snapshot of step {choice.step}", modules, params, optimizer,
                     f"loading the snapshot of step {choice.step} from the nodes' memory")
    snapshot.prune(root, choice.step)  # every rank's reads are done: DCP's load ends in a gather
    return Recovered(choice.step, choice.world_size, note), None

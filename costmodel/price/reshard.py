"""Moving a tensor between two placements on a device mesh: which collectives, how many bytes, how long.

A placement gives, per mesh axis, Replicate (R), Shard(dim) (S(d)) or Partial(sum) (P: each rank holds
a summand). One mesh axis changes at a time (the rules of DTensor's `redistribute`):

    S(d) -> R      all-gather       over the axis                 send s,          receive (n-1) s
    P    -> R      all-reduce                                     send and receive 2 (n-1)/n s (ring)
    P    -> S(d)   reduce-scatter                                 send and receive   (n-1)/n s
    S(i) -> S(j)   all-to-all                                     send and receive   (n-1)/n s
    R    -> S(d)   local (each rank keeps its chunk)              nothing
    R    -> P      local (one rank keeps the value, others zero)  nothing
    S(d) -> P      all-gather then local (DTensor 2.13 refuses this step; modelled through R)

where n is the size of the mesh axis and s the bytes each rank feeds the collective. The steps and their
order follow DTensor's greedy planner (torch.distributed.tensor._redistribute, torch 2.13): axes are
visited from the innermost out, and a target Shard(d) whose earlier axes shard d differently from the
source (nested sharding, e.g. (S(0), S(0)) -> (R, S(0))) is first replicated; then the remaining changes
are made from the outermost axis in. Byte counts are those of rank 0, which holds the largest shard of
an uneven split, with DTensor's padding of uneven shards (padded chunks are what goes on the wire).

On CPU (gloo has no all-to-all in DTensor) DTensor replaces S(i) -> S(j) by an all-gather and a local
chunk: pass `alltoall=False` to cost that path. DTensor merges consecutive same-kind collectives into
one over a flattened mesh only when the user flattened the mesh; this model does not merge.

Times come from `partita.costmodel.price.comm` on the mesh axis's group (ranks laid out row-major over the mesh,
node-major over the cluster).
"""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

from partita.costmodel.price import comm
from partita.costmodel.errors import PartitaError
from partita.costmodel.hardware import Cluster


@dataclass(frozen=True)
class Placement:
    kind: str                # "R" | "S" | "P"
    dim: int | None = None   # tensor dim, for "S"
    reduce_op: str = "sum"   # for "P"

    def __str__(self) -> str:
        return {"R": "R", "S": f"S({self.dim})", "P": f"P({self.reduce_op})"}[self.kind]

    def is_shard(self, dim: int | None = None) -> bool:
        return self.kind == "S" and (dim is None or self.dim == dim)


R = Placement("R")
P = Placement("P")


def S(dim: int) -> Placement:
    return Placement("S", dim)


_PLACEMENT_RE = re.compile(r"^(R|Replicate|S|Shard|P|Partial)(?:\((?:dim=)?([a-z_]*\d*)\))?$", re.I)


def placement(p) -> Placement:
    """A Placement from "R"/"Replicate()", "S(0)"/"Shard(0)", "P"/"Partial(sum)", or a DTensor placement."""
    if isinstance(p, Placement):
        return p
    if isinstance(p, str):
        m = _PLACEMENT_RE.match(p.replace(" ", ""))
        if m:
            kind, arg = m.group(1)[0].upper(), m.group(2) or ""
            if kind == "S" and arg.isdigit():
                return S(int(arg))
            if kind == "R" and not arg:
                return R
            if kind == "P" and not arg.isdigit():
                return Placement("P", reduce_op=arg or "sum")
        raise PartitaError(f"placement {p!r} not understood; accepted: R, S(dim), P, Replicate(), "
                           f"Shard(dim), Partial(sum)")
    if hasattr(p, "is_shard") and hasattr(p, "is_replicate"):  # torch.distributed.tensor placements
        if p.is_replicate():
            return R
        if p.is_partial():
            return Placement("P", reduce_op=getattr(p, "reduce_op", "sum"))
        if p.is_shard() and type(p).__name__ == "Shard":
            return S(p.dim)
    raise PartitaError(f"placement {p!r} not supported; accepted: Replicate, Shard(dim), Partial")


@dataclass(frozen=True)
class ReshardStep:
    """One collective (or local step) on one mesh axis, seen from rank 0."""

    mesh_axis: int
    src: Placement
    dst: Placement
    collective: str          # "all_gather" | "all_reduce" | "reduce_scatter" | "all_to_all" | "local"
    group_size: int
    input_shape: tuple       # the local tensor fed to the collective (padded as DTensor pads)
    output_shape: tuple      # the local tensor after the step
    send_bytes: float        # per rank, bandwidth-optimal algorithm
    recv_bytes: float
    time_s: float


@dataclass(frozen=True)
class Reshard:
    steps: tuple

    @property
    def send_bytes(self) -> float:
        return sum(s.send_bytes for s in self.steps)

    @property
    def recv_bytes(self) -> float:
        return sum(s.recv_bytes for s in self.steps)

    @property
    def time_s(self) -> float:
        return sum(s.time_s for s in self.steps)

    @property
    def collectives(self) -> Counter:
        """Collective kind -> count (local steps excluded)."""
        return Counter(s.collective for s in self.steps if s.collective != "local")


def local_shape(global_shape, placements, mesh_shape) -> tuple:
    """Rank 0's local shape (the largest shard: chunks of ceil(size / n), as torch.chunk)."""
    shape = list(global_shape)
    for p, n in zip(placements, mesh_shape):
        if p.kind == "S":
            shape[p.dim] = -(-shape[p.dim] // n)
    return tuple(shape)


def _plan(src: list, dst: list, mesh_shape) -> list[tuple[int, Placement, Placement]]:
    """DTensor's greedy order of per-axis changes (module docstring)."""
    steps, cur = [], list(src)
    num_shards = math.prod(n for p, n in zip(src, mesh_shape) if p.kind == "S")
    if num_shards > 1 and len(src) > 1:
        for axis in reversed(range(len(cur))):
            target = dst[axis]
            if target.kind == "S":
                before_cur = [i for i in range(axis) if cur[i].is_shard(target.dim)]
                before_dst = [i for i in range(axis) if dst[i].is_shard(target.dim)]
                if before_cur != before_dst:
                    target = R
            if cur[axis] != target:
                steps.append((axis, cur[axis], target))
                cur[axis] = target
    for axis in range(len(cur)):
        if cur[axis] != dst[axis]:
            steps.append((axis, cur[axis], dst[axis]))
            cur[axis] = dst[axis]
    return steps


def _numel(shape) -> int:
    return math.prod(shape)


def reshard(global_shape, src, dst, mesh_shape, *, itemsize: int = 4, cluster: Cluster | None = None,
            alltoall: bool = True) -> Reshard:
    """The steps that move a tensor of `global_shape` from placements `src` to `dst` on a mesh.

    `src`/`dst` hold one placement per mesh axis (Placement, string or DTensor placement). Times are
    0 without a `cluster`. `alltoall=False` costs DTensor's CPU path (all-gather + chunk for S(i)->S(j)).
    """
    mesh_shape = tuple(int(n) for n in mesh_shape)
    src, dst = [placement(p) for p in src], [placement(p) for p in dst]
    if not (len(src) == len(dst) == len(mesh_shape)):
        raise PartitaError(f"placements {[str(p) for p in src]} -> {[str(p) for p in dst]} need one entry "
                           f"per mesh axis of mesh {list(mesh_shape)}")
    ndim = len(global_shape)
    for p in (*src, *dst):
        if p.kind == "S" and not -ndim <= p.dim < ndim:
            raise PartitaError(f"placement {p} names dim {p.dim} of a {ndim}-d tensor {tuple(global_shape)}")
    src = [S(p.dim % ndim) if p.kind == "S" else p for p in src]
    dst = [S(p.dim % ndim) if p.kind == "S" else p for p in dst]
    for a, b in zip(src, dst):
        if a.kind == b.kind == "P" and a.reduce_op != b.reduce_op:
            raise PartitaError(f"cannot change a partial reduction from {a} to {b}")

    changes = []
    for axis, a, b in _plan(src, dst, mesh_shape):
        if a.kind == "S" and b.kind == "P":  # not a DTensor step: go through Replicate
            changes += [(axis, a, R), (axis, R, b)]
        else:
            changes.append((axis, a, b))

    cur, steps = list(src), []
    for axis, a, b in changes:
        n = mesh_shape[axis]
        before = local_shape(global_shape, cur, mesh_shape)
        cur[axis] = b
        after = local_shape(global_shape, cur, mesh_shape)
        if n == 1:
            continue
        group = comm.group_for(cluster, n, math.prod(mesh_shape[axis + 1:])) if cluster else None
        steps.append(_step(axis, a, b, n, before, after, itemsize, cluster, group, alltoall))
    return Reshard(tuple(steps))


def _step(axis, a, b, n, before, after, itemsize, cluster, group, alltoall) -> ReshardStep:
    def timed(fn, nbytes):
        return fn(cluster, group, nbytes) if cluster is not None else 0.0

    inp, kind = tuple(before), "local"
    send = recv = t = 0.0
    if a.kind == "S" and b.kind == "R":
        kind, s = "all_gather", _numel(inp) * itemsize
        send, recv, t = s, (n - 1) * s, timed(comm.all_gather, n * s)
    elif a.kind == "P" and b.kind == "R":
        kind, s = "all_reduce", _numel(inp) * itemsize
        send = recv = 2 * (n - 1) / n * s
        t = timed(comm.all_reduce, s)
    elif a.kind == "P" and b.kind == "S":
        shape = list(inp)
        shape[b.dim] = -(-shape[b.dim] // n) * n      # padded to a multiple of n
        inp, kind = tuple(shape), "reduce_scatter"
        s = _numel(inp) * itemsize
        send = recv = (n - 1) / n * s
        t = timed(comm.reduce_scatter, s)
    elif a.kind == "S" and b.kind == "S" and a.dim != b.dim:
        shape = list(inp)
        shape[b.dim] = -(-shape[b.dim] // n) * n      # the new shard dim, padded to a multiple of n
        s = _numel(shape) * itemsize
        if alltoall:
            inp, kind = tuple(shape), "all_to_all"
            send = recv = (n - 1) / n * s
            t = timed(comm.all_to_all, s)
        else:  # DTensor on CPU: all-gather the old shard dim (unpadded new dim), keep one chunk
            kind, s = "all_gather", _numel(inp) * itemsize
            send, recv, t = s, (n - 1) * s, timed(comm.all_gather, n * s)
    return ReshardStep(mesh_axis=axis, src=a, dst=b, collective=kind, group_size=n, input_shape=inp,
                       output_shape=tuple(after), send_bytes=send, recv_bytes=recv, time_s=t)

"""Run a test's worker in spawned gloo processes and read back what rank 0 wrote (tests/runtime); and
`teardown`, how every multi-process test worker (spawned here or launched by torchrun) ends its group:
the runtime's (runtime.launcher.mesh.teardown), every rank's collectives done before any tears down."""
from __future__ import annotations

import json
import os
import tempfile

import torch.multiprocessing as mp

from partita.runtime.launcher.mesh import teardown  # noqa: F401 -- the runtime's own: barrier (gloo), then destroy


def spawned_json(worker, nprocs: int = 2):
    """Call `worker(rank, nprocs, store_path, out_path)` in `nprocs` spawned processes with OMP_NUM_THREADS=1
    (the workers meet on a FileStore at store_path) and return the JSON written to out_path."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        old = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"
        try:
            mp.start_processes(worker, args=(nprocs, os.path.join(tmp, "store"), out), nprocs=nprocs, join=True,
                               start_method="spawn")
        finally:
            os.environ.pop("OMP_NUM_THREADS") if old is None else os.environ.__setitem__("OMP_NUM_THREADS", old)
        with open(out) as f:
            return json.load(f)


def gather_and_end(rows, out: str) -> None:
    """Every rank's `rows` gathered, the group torn down, and the list (by rank) written to `out` by rank 0: how a
    spawned worker hands back what it measured."""
    import torch.distributed as dist
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, rows)
    rank = dist.get_rank()
    teardown()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(every, f)

"""What a snapshot in memory costs on this machine (issue 41): the bytes/s one rank writes its state into its node's
tmpfs (runtime.checkpoint.snapshot.write), beside one plain copy of the same bytes, and the read back.

One process, one "rank" without a ring: a state of fp32 tensors of SIZES MiB (eight tensors, as a model's are
several), written as snapshots of consecutive steps into a fresh directory under /dev/shm (the node directory a
launcher makes), two kept as a run keeps them. The best of REPEATS each:

- write: `snapshot.write` -- one copy straight into the file's pages, which the tmpfs allocates as they are first
  written (the page faults are part of the figure);
- copy: `tensor.clone()` of the same tensors, into memory the allocator may reuse: what a copy costs without new pages;
- read: every tensor read back mapped (`snapshot.read`) and copied once, as a recovery does into the model.

The write figure is what `partita plan --snapshot-bandwidth` states for a machine (the planner assumes
planner.estimate.resilience.DEFAULT_SNAPSHOT_BW where the user states none). On a GPU node the copy starts on the
device and also crosses the host link; this machine has no GPU.

    python -m benchmarks.snapshots     # writes benchmarks/results/snapshots.json (~20 s)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import write

SIZES = (64, 256, 1024)
REPEATS = 3


def _best(action) -> float:
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        action()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure() -> dict:
    import torch
    from partita.runtime.checkpoint import snapshot
    torch.set_num_threads(1)
    os.environ["LOCAL_RANK"] = "0"
    root = "/dev/shm" if os.path.isdir("/dev/shm") else None
    rows = []
    for mib in SIZES:
        state = {f"model.w{i}": torch.randn(mib * 2**20 // 4 // 8) for i in range(8)}
        size = sum(t.numel() * t.element_size() for t in state.values())
        layout = snapshot.Layout(world_id="bench", keys_total=len(state), ring=[])
        folder = Path(tempfile.mkdtemp(prefix="partita-bench-snapshots-", dir=root))
        step = [0]

        def snap():
            step[0] += 1
            assert snapshot.write(folder, step[0], state, {}, layout, 0) is None
            snapshot.prune(folder, step[0])
        try:
            wrote = _best(snap)
            copied = _best(lambda: [t.clone() for t in state.values()])
            meta = json.loads((folder / f"step-{step[0]:08d}" / "rank-00000.json").read_text())
            data = folder / f"step-{step[0]:08d}" / "rank-00000.bin"
            read = _best(lambda: [snapshot.read(data, e, meta["bytes"]).clone() for e in meta["chunks"].values()])
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        rows.append({"mib": mib, "bytes": size, "write_s": wrote, "copy_s": copied, "read_s": read,
                     "write_gb_s": size / wrote / 1e9, "copy_gb_s": size / copied / 1e9, "read_gb_s": size / read / 1e9})
        print(f"{mib:>5} MiB: write {rows[-1]['write_gb_s']:.2f} GB/s, copy {rows[-1]['copy_gb_s']:.2f} GB/s, "
              f"read {rows[-1]['read_gb_s']:.2f} GB/s", flush=True)
    largest = rows[-1]
    return {"directory": root or tempfile.gettempdir(), "repeats": REPEATS, "rows": rows,
            "write_gb_s": largest["write_gb_s"], "write_vs_copy": largest["copy_s"] and largest["write_s"] / largest["copy_s"],
            "command": "python -m benchmarks.snapshots"}


def main(argv=None) -> int:
    argparse.ArgumentParser(prog="python -m benchmarks.snapshots", description=__doc__.split("\n")[0]).parse_args(argv)
    print(f"wrote {write('snapshots', measure())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

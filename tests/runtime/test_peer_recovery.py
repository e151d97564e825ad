"""Resuming from the nodes' memory (runtime.checkpoint.snapshot, runtime.checkpoint.recovery; issue 41, item 2).

One 4-process gloo job on two "nodes" (ranks 0-1 and 2-3, each node its own snapshot directory) trains tiny-gpt 3
steps with a snapshot after every step and a checkpoint on disk after step 2 (and the last, step 3, which the test
then removes: the failure came before it was written). Node b is lost; node a's two ranks form a new world and
continue under another plan from the snapshot of step 3 in node a's memory. Their losses and weights equal those of
the same plan resumed by hand from the step-3 checkpoint on disk, to the last bit. Two cases:

- pp=2 dp=2 (DDP inside each stage) -> dp=2: each pipeline stage is on one node only, so every rank's snapshot is
  also kept by the other node (the ring); plain tensors in, plain tensors out;
- FSDP2 over 4 ranks (ZeRO-3) -> tp=2: every rank's shards are its own (the ring again); DTensor shards in, DTensor
  shards of another layout out.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from spawned import spawned_json, teardown

from partita import runtime

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from test_plans_match_single_process import make_plan  # noqa: E402

STEPS = 6


CASES = {"pp2-dp2 to dp2": (make_plan(pp=2, dp=2, micro=2, mb=1), make_plan(dp=2, micro=1, mb=2)),
         "fsdp4 to tp2": ({**make_plan(dp=4, micro=1, mb=1), "zero_stage": 3}, make_plan(tp=2, micro=1, mb=4))}


def _first(rank: int, base: Path, store_path: str, before: dict) -> None:
    """The 4-rank world to step 3, a snapshot after every step."""
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 4), rank=rank, world_size=4)
    try:
        runtime.run(before, "tiny-gpt", steps=3, checkpoint_dir=base / "ck", checkpoint_every=2, snapshot_every=1,
                    print_report=False)
    finally:
        teardown()


def _worker(rank: int, world: int, store_path: str, out: str) -> None:
    before, after = CASES[os.environ["PEER_RECOVERY_CASE"]]
    torch.set_num_threads(1)
    base = Path(out).parent
    node = base / ("node-a" if rank < 2 else "node-b")
    node.mkdir(exist_ok=True)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank % 2), WORLD_SIZE=str(world), PARTITA_SNAPSHOT_DIR=str(node))
    _first(rank, base, store_path, before)
    if rank >= 2:  # node b is lost
        return
    kept = {d.name: sorted(f.name for f in d.iterdir()) for d in sorted(node.iterdir())}
    times = {}  # how many times node a's snapshot of step 3 holds each key's elements
    for meta in (node / "step-00000003").glob("*.json"):
        for key, c in json.loads(meta.read_text())["chunks"].items():
            times[key] = times.get(key, 0) + math.prod(c["sizes"]) / math.prod(c["size"])
    dist.init_process_group("gloo", store=dist.FileStore(store_path + "-after", 2), rank=rank, world_size=2)
    os.environ["WORLD_SIZE"] = "2"
    ck, ref = base / "ck", base / "ck-ref"
    try:
        if rank == 0:  # the checkpoint of step 3 was never written; a copy keeps it for the run resumed by hand
            shutil.copytree(ck, ref)
            shutil.rmtree(ck / "step-00000003")
            (ck / ".partita-digests" / "step-00000003.sha256").unlink()
        dist.barrier()
        plan = after
        memory = runtime.run(plan, "tiny-gpt", steps=STEPS, checkpoint_dir=ck, resume=True, snapshot_every=1,
                             print_report=False)
        by_hand = runtime.run(plan, "tiny-gpt", steps=STEPS, checkpoint_dir=ref, resume=True, print_report=False)
    finally:
        teardown()
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"kept": kept, "times": times, **{name: {"losses": r.losses, "first": r.first_step, "from": r.resumed_from,
                                               "checksum": r.param_checksum}
                                        for name, r in (("memory", memory), ("by_hand", by_hand))}}, f)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_lost_node_resumes_from_its_peers_memory_under_a_new_plan_as_from_disk(case, monkeypatch):
    monkeypatch.setenv("PEER_RECOVERY_CASE", case)  # the spawned workers inherit it
    out = spawned_json(_worker, nprocs=4)
    # node a kept its own ranks' snapshots and node b's (each stage is on one node only), of steps 2 and 3
    assert list(out["kept"]) == ["step-00000002", "step-00000003"], out["kept"]
    assert out["kept"]["step-00000003"] == [f"rank-{r:05d}.{s}" for r in range(4) for s in ("bin", "json")]
    # the replicas were cut into pieces: each element of the state once (the generators are each rank's own)
    assert {k: v for k, v in out["times"].items() if not k.startswith("rng.")} == \
        {k: 1.0 for k in out["times"] if not k.startswith("rng.")}, out["times"]
    memory, by_hand = out["memory"], out["by_hand"]
    assert memory["first"] == by_hand["first"] == 3, out
    assert memory["from"] == "the snapshot of step 3 in the nodes' memory", out
    assert by_hand["from"].endswith("step-00000003"), out
    assert len(memory["losses"]) == STEPS - 3
    assert memory["losses"] == by_hand["losses"] and memory["checksum"] == by_hand["checksum"], out


# ---- the choice of a snapshot, without processes ----------------------------------------------------------------

def _file(step: int, rank: int, chunks: dict, world: str = "w1", keys_total: int = 2, **identity) -> dict:
    base = {"run_id": "r", "model": {"fingerprint": "f"}, "train": {}, "seed": 0, "data": {}}
    return {**base, **identity, "format": "partita.snapshot/1", "step": step, "rank": rank, "world_id": world,
            "world_size": 2, "keys_total": keys_total, "time": step, "bytes": 64,
            "chunks": {k: {"offsets": o, "sizes": s, "size": [4], "dtype": "float32"} for k, (o, s) in chunks.items()}}


def _said(*nodes: list[dict]) -> list[dict]:
    return [{"dir": f"/shm/node{i}", "files": files} for i, files in enumerate(nodes)]


def test_the_newest_whole_step_is_chosen_and_a_missing_shard_falls_back_with_its_reason():
    from partita.runtime.checkpoint.recovery import choose, identity
    expect = identity({"run_id": "r", "model": {"fingerprint": "f"}, "train": {}, "seed": 0, "data": {}})
    shapes = {"w": (4,)}
    halves = [{"model.w": ([0], [2]), "optim.w.exp_avg": ([0], [2])}, {"model.w": ([2], [2]),
                                                                        "optim.w.exp_avg": ([2], [2])}]
    whole = _said([_file(5, 0, halves[0]), _file(5, 1, halves[1]), _file(4, 0, halves[0])])
    choice, why = choose(whole, 0, 3, expect, shapes)
    assert choice.step == 5 and why == "" and choice.world_size == 2
    assert choice.holders[("model.w", (2,))] == [0]
    assert [tuple(c.offsets) for c in choice.metadata.state_dict_metadata["model.w"].chunks] == [(0,), (2,)]
    # step 5's second half was only on a node that is gone: step 4 is not whole either, nothing serves
    lost = _said([_file(5, 0, halves[0]), _file(4, 0, halves[0])])
    choice, why = choose(lost, 0, 3, expect, shapes)
    assert choice is None and why == "the snapshot of step 5 is not whole: part of model.w was only on the nodes lost"
    # not newer than the checkpoint on disk: nothing to say
    assert choose(whole, 0, 5, expect, shapes) == (None, "")
    # a key only the lost node held (keys_total), another run's files, another model's shape
    one_key = _said([_file(5, 0, {"model.w": ([0], [4])})])
    assert "1 of its 2 tensors were only on the nodes lost" in choose(one_key, 0, 3, expect, shapes)[1]
    other = _said([_file(5, 0, {"model.w": ([0], [4]), "optim.w.exp_avg": ([0], [4])}, run_id="s")])
    assert "written by another run" in choose(other, 0, 3, expect, shapes)[1]
    assert "holds no w of this model's shape" in choose(whole, 0, 3, expect, {"w": (8,)})[1]
    # the replicas of one chunk on two nodes: either serves, and each node reads its own
    both = _said([_file(5, 0, {"model.w": ([0], [4]), "optim.w.exp_avg": ([0], [4])})],
                 [_file(5, 1, {"model.w": ([0], [4]), "optim.w.exp_avg": ([0], [4])})])
    choice, _ = choose(both, 1, 3, expect, shapes)
    assert choice.holders[("model.w", (0,))] == [0, 1]
    assert choice.paths[("model.w", (0,))][0] == Path("/shm/node1/step-00000005/rank-00001.bin")


def test_snapshots_are_off_without_a_node_directory_or_under_a_sync_mode_with_state_of_its_own(tmp_path,
                                                                                              monkeypatch):
    from types import SimpleNamespace as NS
    from partita.runtime.checkpoint.recovery import snapshots_off, snapshots_on
    plain, diloco, asked = NS(sync=NS(mode="synchronous")), NS(sync=NS(mode="diloco")), NS(snapshot_every=2)
    monkeypatch.delenv("PARTITA_SNAPSHOT_DIR", raising=False)
    assert "no node directory" in snapshots_off(plain, asked) and not snapshots_on(plain, asked)
    monkeypatch.setenv("PARTITA_SNAPSHOT_DIR", str(tmp_path))
    assert snapshots_on(plain, asked) and "diloco keeps state of its own" in snapshots_off(diloco, asked)
    assert snapshots_off(plain, NS(snapshot_every=0)) is None and not snapshots_on(plain, NS(snapshot_every=0))


def test_the_nodes_launcher_process_makes_the_snapshot_directory_and_removes_it_after_the_job(tmp_path):
    from partita.runtime.launcher.child import SNAPSHOT_DIR_ENV, SNAPSHOT_ROOT_ENV, run_forwarding_signals
    seen = tmp_path / "seen"
    code = run_forwarding_signals([sys.executable, "-c", f"import os, pathlib; d = os.environ['{SNAPSHOT_DIR_ENV}']; "
                                   f"pathlib.Path({str(seen)!r}).write_text(d if os.path.isdir(d) else '')"],
                                  {**os.environ, SNAPSHOT_ROOT_ENV: str(tmp_path)})
    made = Path(seen.read_text())
    assert code == 0 and made.parent == tmp_path and made.name.startswith("partita-snapshots-")
    assert not made.exists()


def test_a_node_keeps_its_two_newest_snapshots_and_one_that_does_not_fit_leaves_nothing_of_itself(tmp_path,
                                                                                                  monkeypatch):
    import errno
    from partita.runtime.checkpoint import snapshot
    monkeypatch.setenv("LOCAL_RANK", "0")
    layout, state = snapshot.Layout(world_id="w", keys_total=1, ring=[]), {"model.w": torch.arange(4.0)}
    (tmp_path / "step-00000009").mkdir()  # left by a world that failed after step 9 was begun
    for step in (1, 2, 3):
        assert snapshot.write(tmp_path, step, state, {"run_id": "r"}, layout, 0) is None
        snapshot.prune(tmp_path, step)
    assert [s for s, _ in snapshot.step_dirs(tmp_path)] == [2, 3]
    meta = json.loads((tmp_path / "step-00000003" / "rank-00000.json").read_text())
    assert meta["chunks"]["model.w"] == {"offsets": [0], "sizes": [4], "size": [4], "dtype": "float32", "shape": [4],
                                         "at": 0, "bytes": 16}
    assert torch.equal(snapshot.read(tmp_path / "step-00000003" / "rank-00000.bin", meta["chunks"]["model.w"],
                                     meta["bytes"]), torch.arange(4.0))
    mate = tmp_path / "step-00000004"
    mate.mkdir()
    (mate / "rank-00001.bin").write_bytes(b"a node-mate's")

    def full(fd, offset, length):  # the tmpfs has no room for the file
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "posix_fallocate", full)
    note = snapshot.write(tmp_path, 4, state, {}, layout, 0)
    assert note == (f"note: the snapshot of step 4 did not fit in {tmp_path} (No space left on device); failures "
                    "resume from disk")
    assert [p.name for p in mate.iterdir()] == ["rank-00001.bin"]


def test_a_snapshot_index_that_is_not_one_written_here_is_passed_over_never_read(tmp_path, monkeypatch):
    from partita.runtime.checkpoint import recovery, snapshot
    monkeypatch.setenv("LOCAL_RANK", "0")
    layout = snapshot.Layout(world_id="w", keys_total=1, ring=[])
    snapshot.write(tmp_path, 1, {"model.w": torch.arange(6.0).reshape(2, 3)}, {}, layout, 0)
    index = tmp_path / "step-00000001" / "rank-00000.json"
    good = json.loads(index.read_text())
    assert [f["step"] for f in recovery._listing(tmp_path)["files"]] == [1]
    entry = good["chunks"]["model.w"]
    for bad in ({"dtype": "load"}, {"at": 64}, {"bytes": 8}, {"shape": [3, 3]}, {"offsets": [1, 0]},
                {"sizes": [2, 3, 1]}, {"at": -1}):
        index.write_text(json.dumps({**good, "chunks": {"model.w": {**entry, **bad}}}))
        assert recovery._listing(tmp_path)["files"] == [], bad
    index.write_text(json.dumps({**good, "bytes": good["bytes"] + 1}))  # not the .bin's size
    assert recovery._listing(tmp_path)["files"] == []


def test_a_snapshot_is_written_beside_the_next_step_and_joined_before_its_optimizer_step(tmp_path, monkeypatch):
    import threading
    from partita.runtime.checkpoint import snapshot
    from partita.runtime.loop.trainer import SnapshotHook
    monkeypatch.setenv("LOCAL_RANK", "0")
    release, writing, order = threading.Event(), threading.Event(), []
    real = snapshot.write

    def held(*args):  # the write waits until the test lets it go: the training thread is not waiting for it
        writing.set()
        release.wait(30)
        order.append("written")
        return real(*args)
    monkeypatch.setattr(snapshot, "write", held)
    monkeypatch.setattr(snapshot, "agree", lambda state, root, rank: snapshot.Layout("w", 1, []))
    w = torch.nn.Parameter(torch.arange(4.0))
    opt = torch.optim.SGD([w], lr=1.0)
    executor, topo = type("E", (), {"modules": [torch.nn.Module()]})(), type("T", (), {"rank": 0})()
    executor.modules[0].w = w
    hook = SnapshotHook(1, 3, tmp_path, executor, opt, {}, topo)
    hook.checkpoint(1, 0)  # after step 1: the thread starts and the step returns
    assert writing.wait(30) and hook.writer.thread.is_alive() and order == []
    order.append("next forward and backward")
    release.set()
    hook.before_optimizer(2)  # step 2's optimizer step waits for the snapshot of step 1
    assert order == ["next forward and backward", "written"] and hook.writer.thread is None
    meta = json.loads((tmp_path / "step-00000001" / "rank-00000.json").read_text())
    assert torch.equal(snapshot.read(tmp_path / "step-00000001" / "rank-00000.bin", meta["chunks"]["model.w"],
                                     meta["bytes"]), torch.arange(4.0))

    def broken(*args):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(snapshot, "write", broken)
    hook.checkpoint(2, 0)
    with pytest.raises(OSError, match="Input/output error"):  # a failure in the thread reaches the training
        hook.before_optimizer(3)


def test_the_snapshot_directories_of_a_killed_launcher_are_removed_by_the_next_and_a_live_ones_kept(tmp_path):
    import subprocess
    from partita.runtime.launcher import child
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid no process has now
    prefix = child._snapshot_prefix()
    stale, live = tmp_path / f"{prefix}{dead.pid}-abc", tmp_path / f"{prefix}{os.getpid()}-def"
    other = tmp_path / f"partita-snapshots-999999999-{dead.pid}-ghi"  # another pid namespace's: never judged
    for d in (stale, live, other):
        (d / "step-00000001").mkdir(parents=True)
    code = child.run_forwarding_signals([sys.executable, "-c", "pass"], {**os.environ,
                                                                        child.SNAPSHOT_ROOT_ENV: str(tmp_path)})
    assert code == 0 and not stale.exists() and live.is_dir() and other.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name])  # its own is gone too

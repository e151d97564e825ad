"""Ranks that each looked at shared state alone end alike (runtime.launcher.mesh.first_said, runtime.checkpoint.resume.common_candidates),
in one 2-process gloo job: a refusal on one rank ends both with its line; a checkpoint only rank 0 can see yet is
passed over by both, and both resume from the same one; a checkpoint no rank but one can see stops both.
Before, rank 0 waited in a collective for a rank that had ended (the CI hang of issue 29's two-runs case), and
ranks with different checkpoint lists called the content-hash collectives a different number of times."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from spawned import spawned_json, teardown

from partita.runtime import checkpoint as ckpt
from partita.runtime.launcher.mesh import first_said
from partita.runtime.checkpoint.resume import Candidates, choose_intact, common_candidates


def _candidate(root: str, step: int):
    return SimpleNamespace(checkpoint=SimpleNamespace(path=Path(root) / f"step-{step:08d}", manifest={"files": {}}),
                           metadata=None, notes=[])


def _worker(rank: int, world: int, store_path: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    root, results = "/ck", {}
    results["said"] = first_said("rank 1 refuses" if rank == 1 else None)
    results["nobody"] = first_said(None)
    seen = [_candidate(root, 2), _candidate(root, 1)] if rank == 0 else [_candidate(root, 1)]
    agreed = common_candidates(Candidates(found=seen, skipped=["an older note"] if rank == 0 else []), root)
    chosen, notes = choose_intact(agreed, root, SimpleNamespace(rank=rank, device=torch.device("cpu")))
    results["found"] = [c.checkpoint.path.name for c in agreed.found]
    results["chosen"], results["notes"] = chosen.checkpoint.path.name, notes
    try:
        common_candidates(Candidates(found=[_candidate(root, 1)] if rank == 1 else []), root)
        results["none_common"] = None
    except ckpt.CheckpointError as e:
        results["none_common"] = str(e)
    everyone = [None] * world
    dist.all_gather_object(everyone, results)
    if rank == 0:
        Path(out).write_text(json.dumps(everyone))
    teardown()


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return spawned_json(_worker)


def test_a_refusal_on_one_rank_is_every_ranks(ranks):
    assert [r["said"] for r in ranks] == [[1, "rank 1 refuses"]] * 2
    assert [r["nobody"] for r in ranks] == [None, None]


def test_a_checkpoint_one_rank_cannot_see_is_passed_over_by_all(ranks):
    for r in ranks:
        assert r["found"] == ["step-00000001"] and r["chosen"] == "step-00000001", r
        assert r["notes"] == ["an older note: resuming from /ck/step-00000001, the newest intact checkpoint",
                              "checkpoint /ck/step-00000002: rank 1 could not read it: resuming from "
                              "/ck/step-00000001, the newest intact checkpoint"], r


def test_no_checkpoint_every_rank_can_read_stops_every_rank(ranks):
    assert [r["none_common"] for r in ranks] == ["checkpoint /ck/step-00000001: rank 0 could not read it; no "
                                                 "checkpoint every rank can read is in /ck to resume from"] * 2

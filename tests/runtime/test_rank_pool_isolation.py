"""The session's long-lived gloo ranks (tests/rank_pool.py) start each job as a torchrun worker would: with
DTensor's caches empty. Those caches hold DeviceMesh objects, which compare equal across jobs (same shape, ranks
and names) while their process groups died with the job before: a later job that made fewer groups could be
handed a cached mesh naming a group that no longer exists."""
import json
from pathlib import Path

import rank_pool

JOB = Path(__file__).with_name("dtensor_job.py")


def test_a_job_after_a_dtensor_job_starts_with_empty_caches_and_runs(tmp_path):
    pool = rank_pool.shared()
    first = pool.run(2, [str(tmp_path / "a.json"), "6"], cwd=tmp_path, script=str(JOB))
    assert first.returncode == 0, first.stderr
    # the same ops on a mesh whose groups now have earlier names: a cached spec's mesh would name groups 6 and 7
    second = pool.run(2, [str(tmp_path / "b.json"), "0"], cwd=tmp_path, script=str(JOB))
    assert second.returncode == 0, second.stderr
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in "ab")
    assert b["cached_at_start"] == 0 and a["sum"] == b["sum"] == 56.0, (a, b)  # the first job filled some

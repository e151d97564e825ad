"""The test pool itself (tests/rank_pool.py): a worker lost to a signal is named with it, and a job past its time
limit shows where each rank waited and what its finished ranks said."""
from __future__ import annotations

import os

import pytest
from rank_pool import RankPool

SCRIPT = """
import os, signal, sys
print(os.getpid())
what = sys.argv[1]
if what == "abort":
    os.kill(os.getpid(), signal.SIGABRT)
if what == "rank1-fails" and os.environ["RANK"] == "1":
    sys.stderr.write("rank 1 gave up here\\n")
    raise SystemExit(3)
if what in ("hang", "rank1-fails"):
    import threading

    def waiting_here():
        threading.Event().wait()
    waiting_here()
"""


def test_a_crash_or_a_hang_is_named_with_the_stacks_and_the_finished_ranks_output(tmp_path, capfd):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    pool = RankPool(size=2)
    try:
        done = pool.run(1, ["ok"], cwd=tmp_path, script=script)
        assert done.returncode == 0 and int(done.stdout.split()[0]) != os.getpid()
        with pytest.raises(RuntimeError, match="lost its worker to SIGABRT"):
            pool.run(1, ["abort"], cwd=tmp_path, script=script)
        assert "Fatal Python error: Aborted" in capfd.readouterr().err
        # A timed job gets workers that have imported torch: the abort restarted the pool, and a worker still
        # importing when the time limit ends shows only its import's stack (CI at stop 67, under load).
        pool.run(2, ["ok"], cwd=tmp_path, script=script)
        with pytest.raises(RuntimeError, match="did not finish in its time limit"):
            pool.run(2, ["hang"], cwd=tmp_path, script=script, timeout=3)
        assert capfd.readouterr().err.count("waiting_here") == 2  # where each of the 2 ranks waited
        pool.run(2, ["ok"], cwd=tmp_path, script=script)  # the hang restarted the pool too
        with pytest.raises(RuntimeError, match="rank 1 finished with exit code 3; its stderr ends:\nrank 1 gave up here"):
            pool.run(2, ["rank1-fails"], cwd=tmp_path, script=script, timeout=3)
    finally:
        pool.close()

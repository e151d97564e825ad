"""Issue 30 item 11: absurd sizes cost bounded work or one line up front.

A global batch of 1e12 used to run `range(global batch)` to find micro-batch sizes (minutes; 1e20: over 11
minutes), and a cluster of 99,999,999 nodes took 180 s to refuse. Divisors are now found in O(sqrt n) and only
up to the largest micro-batch or pipeline depth the search considers; batches beyond 2^30 samples and
clusters beyond 2^20 devices are refused before capture."""
from __future__ import annotations

import subprocess
import sys

import pytest

import partita.planner as planner
from partita.costmodel.errors import PartitaError
from partita.planner.enumerate.space import MAX_GLOBAL_BATCH, divisors


@pytest.mark.parametrize("n", [1, 2, 12, 36, 97, 360, 1024, 9973 * 2, 2**20 * 3])
def test_divisors_are_every_divisor_up_to_the_bound(n):
    brute = [d for d in range(1, n + 1) if n % d == 0]
    assert divisors(n) == brute
    for cap in (1, 7, 64, n):
        assert divisors(n, cap) == [d for d in brute if d <= cap]


def test_the_largest_global_batch_plans_in_bounded_time():
    """2^30 samples on 8 devices: the old search enumerated range(2^27) per data-parallel degree; a
    subprocess with a deadline, so the old code fails rather than hangs the suite."""
    r = subprocess.run([sys.executable, "-m", "partita.cli", "plan", "--model", "tiny-gpt", "--cluster",
                        "8xA100-80GB", "--global-batch", str(MAX_GLOBAL_BATCH), "--json"],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert '"global_batch": 1073741824' in r.stdout


@pytest.mark.parametrize("cluster, batch, message", [
    ("8xA100-80GB", 10**20, r"^global batch 100,000,000,000,000,000,000 is beyond what partita plans: at most "
                            r"1,073,741,824 \(2\^30\) samples per step$"),
    ("99999999x8xA100-80GB", 8, r"^the cluster has 799,999,992 devices, beyond what partita plans: at most "
                                r"1,048,576 \(2\^20\)$"),
])
def test_absurd_sizes_are_one_line_before_capture(cluster, batch, message, monkeypatch):
    from partita.planner import api
    monkeypatch.setattr(api, "capture", lambda *a, **k: pytest.fail("captured before refusing"))
    with pytest.raises(PartitaError, match=message):
        planner.plan("tiny-gpt", cluster=cluster, train=planner.TrainConfig(global_batch=batch))

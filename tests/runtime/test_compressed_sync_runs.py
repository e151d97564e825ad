"""The compressed sync mode's runtime hook (runtime.loop.sync.Compressed: DDP's bf16_compress_hook) on real 2-rank
gloo runs (tests/rank_pool.py): tiny-gpt, dp = 2 DDP replicas, plain SGD at lr 0.5, the runs' default seed.

- Step 1's loss is computed before any update and equals the synchronous run's exactly; after that the losses
  differ (each averaged gradient was rounded to bf16) but stay within bf16's rounding of synchronous training.
- --verify is refused in one line before anything trains (the rounding is by design).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "runtime"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
import rank_pool  # noqa: E402
from test_trainer_hooks import _plan_file  # noqa: E402

FLAGS = ["--model", "tiny-gpt", "--steps", "6", "--lr", "0.5", "--log-every", "0"]


def _run(tmp_path: Path, name: str, sync: dict | None, *extra: str):
    plan, out = _plan_file(tmp_path, name, sync), tmp_path / f"{name}.losses.json"
    done = rank_pool.shared().run(2, [str(plan), *FLAGS, *extra, "--losses-out", str(out)], cwd=ROOT, timeout=300)
    return done, (json.loads(out.read_text())["losses"] if done.returncode == 0 else None)


def test_bf16_gradients_train_within_their_rounding_of_synchronous_dp(tmp_path):
    done, sync = _run(tmp_path, "synchronous", None)
    assert done.returncode == 0, done.stderr[-3000:]
    done, bf16 = _run(tmp_path, "compressed", {"mode": "compressed"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert bf16[0] == sync[0]  # before any update
    diffs = [abs(a - b) for a, b in zip(bf16[1:], sync[1:])]
    assert max(diffs) > 0, (bf16, sync)  # the hook rounded the gradients: not synchronous DP bit for bit
    assert max(diffs) < 2e-2 * max(sync), (bf16, sync)  # a few bf16 roundings (2^-8 = 3.9e-3 each), no more


def test_verify_is_refused_in_one_line(tmp_path):
    done, _ = _run(tmp_path, "verify", {"mode": "compressed"}, "--verify")
    assert done.returncode != 0
    assert "--verify compares with single-process fp32 training, and the compressed sync mode rounds" in done.stderr

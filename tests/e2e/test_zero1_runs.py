"""ZeRO-1 plans run under torchrun on gloo (torch's ZeroRedundancyOptimizer, runtime/parallel/zero1.py) and train
exactly like one process (fp32: 1e-5), holding half of Adam's state per rank on 2 ranks; their checkpoints
hold every parameter's optimizer state, written by the rank that owns it, and resume exactly."""
from __future__ import annotations

import pytest

from partita.costmodel import resolve_model
from partita.runtime.checkpoint import latest, read_metadata
from tests.e2e.test_plans_match_single_process import STEPS, assert_matches, launch, make_plan


def _zero1(**mesh) -> dict:
    plan = make_plan(micro=2, **mesh)
    plan["zero_stage"] = 1
    return plan


def _checkpointed(tmp_path):
    """One 2-rank ZeRO-1 run of STEPS steps with --verify, checkpointed after the last: (proc, out, dir)."""
    ckpt = tmp_path / "ckpt"
    proc, out = launch(tmp_path, _zero1(dp=2), 2,
                       flags=("--checkpoint-dir", str(ckpt), "--checkpoint-every", str(STEPS)))
    return proc, out, ckpt


def test_zero1_trains_like_one_process_with_half_the_optimizer_state(tmp_path):
    proc, out, ckpt = _checkpointed(tmp_path)
    assert_matches(proc, out)
    # resident before a step: parameters (4 N) + DDP's gradient buckets (4 N) + Adam's two moments of the
    # parameters this rank owns (8 N / 2), where ZeRO-0 holds 16 N
    model = resolve_model("tiny-gpt").build()
    n = sum(p.numel() for p in model.parameters())
    assert out["memory_detail"]["resident_bytes"] < 13 * n
    # every parameter's Adam state is in the checkpoint, from whichever rank owns it
    saved = {k for k in read_metadata(latest(ckpt)).state_dict_metadata if k.startswith("optim.")}
    assert saved == {f"optim.{name}.{k}" for name, _ in model.named_parameters()
                     for k in ("step", "exp_avg", "exp_avg_sq")}


@pytest.mark.slow
def test_zero1_resumes_exactly_and_runs_beside_a_pipeline(tmp_path):
    """Resuming restores each rank's own parameters' Adam state (losses of steps 4-5 as the one-process
    reference's); a pp=2 x dp=2 ZeRO-1 plan (hand-averaged gradients, then the sharded step) trains exactly."""
    first = tmp_path / "first"
    first.mkdir()
    proc, out, ckpt = _checkpointed(first)
    assert_matches(proc, out)
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    proc, out = launch(resumed, _zero1(dp=2), 2, steps=STEPS + 2, flags=("--checkpoint-dir", str(ckpt), "--resume"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert out["first_step"] == STEPS and len(out["losses"]) == 2
    assert max(abs(a - b) for a, b in zip(out["losses"], out["reference_losses"])) <= 1e-5
    piped = tmp_path / "piped"
    piped.mkdir()
    assert_matches(*launch(piped, _zero1(pp=2, dp=2), 4))

"""DCP checkpoints across plans and world sizes, torchrun restarts after a killed rank or a crash mid-save,
and a NaN loss -- each against the single-process reference (--verify: fp32 losses within 1e-5).

Both tests launch torchrun more than once (or restart inside one launch): `slow`.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import partita.runtime as runtime
from test_plan_elements import element_plan  # sibling test module
from test_plans_match_single_process import ROOT, _env, make_plan

pytestmark = pytest.mark.slow


def torchrun(tmp_path: Path, name: str, plan: dict, ranks: int, *args: str, restarts: int = 0, env=None,
             model: str = "tiny-gpt"):
    """torchrun runtime.train on `plan` with `args`; returns (CompletedProcess, --losses-out JSON or None)."""
    plan_file, out = tmp_path / f"{name}.json", tmp_path / f"{name}.out.json"
    plan_file.write_text(json.dumps(plan))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
           *([f"--max-restarts={restarts}"] if restarts else []),
           "-m", "partita.runtime.train", str(plan_file), "--model", model, "--losses-out", str(out), *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(**(env or {})), capture_output=True, text=True, timeout=300)
    return proc, (json.loads(out.read_text()) if out.exists() else None)


def pooled(tmp_path: Path, name: str, plan: dict, *args: str, model: str = "tiny-gpt"):
    """As `torchrun`, on the test session's long-lived gloo workers (tests/rank_pool.py): the workers' own entry
    point, for runs no launcher behaviour is part of."""
    import rank_pool
    plan_file, out = tmp_path / f"{name}.json", tmp_path / f"{name}.out.json"
    plan_file.write_text(json.dumps(plan))
    proc = rank_pool.run_plan(plan_file, model, "--losses-out", str(out), *args, cwd=ROOT)
    return proc, (json.loads(out.read_text()) if out.exists() else None)


def dirs(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(("step-", ".step-")))


def test_resume_on_another_plan_and_world_size_then_stop_on_nan(tmp_path):
    """Steps 1-2 on 4 ranks (pp=2 x dp=2, ZeRO-3; the rank pool), checkpoint; steps 3-4 on 2 ranks (tp=2, no ZeRO),
    launched by runtime.launch; then steps 3-5 on one rank (the pool), where a NaN at step 4 stops the run and keeps step 3's
    checkpoint. Global batch 8 throughout."""
    ck = tmp_path / "ck"
    proc, out = pooled(tmp_path, "a", element_plan(zero=3, pp=2, dp=2, micro=2), "--steps", "2", "--verify",
                       "--checkpoint-dir", str(ck), "--checkpoint-every", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert out["max_abs_diff"] <= 1e-5 and dirs(ck) == ["step-00000002"]
    manifest = json.loads((ck / "step-00000002" / "partita.json").read_text())
    assert manifest["world_size"] == 4 and manifest["plan"]["zero_stage"] == 3
    assert len(list((ck / "step-00000002").glob("__*_0.distcp"))) == 4

    plan_b = tmp_path / "b.json"
    plan_b.write_text(json.dumps(element_plan(tp=2, micro=2, mb=4)))
    code = runtime.launch(plan_b, "tiny-gpt", 4, verify=True, checkpoint_dir=ck, resume=True,
                          losses_out=tmp_path / "b.out.json", env={"PYTHONPATH": str(ROOT)})
    out_b = json.loads((tmp_path / "b.out.json").read_text())
    assert code == 0
    assert out_b["first_step"] == 2 and out_b["resumed_from"] == str(ck / "step-00000002")
    assert len(out_b["losses"]) == 2 and out_b["max_abs_diff"] <= 1e-5, out_b
    assert out_b["param_max_abs_diff"] <= 1e-4
    print(f"4 ranks -> 2 ranks: max_abs_diff={out['max_abs_diff']:.2e} then {out_b['max_abs_diff']:.2e}, "
          f"param diff {out_b['param_max_abs_diff']:.2e}")

    import rank_pool
    (tmp_path / "c.json").write_text(json.dumps(make_plan(micro=2, mb=4)))
    proc = rank_pool.run_plan(tmp_path / "c.json", "tiny-gpt", "--steps", "5", "--checkpoint-dir", str(ck),
                              "--checkpoint-every", "1", "--resume", cwd=ROOT, env={"PARTITA_FAULT": "nan,step=4"})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stderr.strip() == (f"partita: error: loss is nan at step 4: training stopped before that step's "
                                   f"optimizer update; the newest checkpoint, {ck / 'step-00000003'}, holds the weights "
                                   f"step 4 started from; the one before it is {ck / 'step-00000002'}")
    assert dirs(ck) == ["step-00000002", "step-00000003"]


def test_killed_rank_and_crash_mid_save_resume_from_the_last_checkpoint(tmp_path):
    """One torchrun launch, --max-restarts 2, checkpoints every 2 of 6 steps. Attempt 1: rank 1 dies in
    step 3. Attempt 2 resumes from step 2 and rank 0 dies while saving step 4 (shards and DCP metadata
    written, not committed). Attempt 3 resumes from step 2 again (the half-written step 4 is ignored and
    removed) and finishes: the losses of steps 3-6 and the final parameters are those of the uninterrupted
    single-process run."""
    ck = tmp_path / "ck"
    proc, out = torchrun(tmp_path, "tp2", make_plan(tp=2), 2, "--steps", "6", "--verify", "--checkpoint-dir", str(ck),
                         "--checkpoint-every", "2", "--max-restarts", "2", restarts=2,
                         env={"PARTITA_FAULT": "rank=1,step=3;save,step=4"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rank 1 dies during step 3" in proc.stderr
    assert "rank 0 dies while saving the checkpoint of step 4" in proc.stderr
    assert f"removed {ck / '.step-00000004.tmp'}: a checkpoint save that never finished" in proc.stdout
    assert f"resumed from {ck / 'step-00000002'} (after step 2), torchrun attempt 3" in proc.stdout
    assert out["attempt"] == 3 and out["restarts"] == 2 and out["first_step"] == 2 and len(out["losses"]) == 4
    assert out["max_abs_diff"] <= 1e-5, out
    assert abs(out["param_checksum"] - out["reference_param_checksum"]) <= 1e-6 * abs(out["reference_param_checksum"])
    assert out["param_max_abs_diff"] <= 1e-4
    assert dirs(ck) == ["step-00000002", "step-00000004", "step-00000006"]
    print(f"after 2 restarts: max_abs_diff={out['max_abs_diff']:.2e}, checksum {out['param_checksum']:.8e} vs "
          f"{out['reference_param_checksum']:.8e}, param diff {out['param_max_abs_diff']:.2e}")


def test_dropout_resumes_bit_exactly_on_two_ranks(tmp_path):
    """dp=2 (DDP), a dropout model: 4 steps straight vs 2 steps + checkpoint + resume for 2 more (on the rank pool:
    each run a fresh process group on long-lived workers, whose global RNG the previous job left elsewhere): each rank's generator state travels with the checkpoint (rng.rank0/1), so steps 3-4 draw the
    same masks and the losses are bit-identical."""
    model = "gpt:layers=2,hidden=64,heads=4,vocab=128,seq=32,dropout=0.1"
    plan, ck = make_plan(model, dp=2), tmp_path / "ck"
    proc, straight = pooled(tmp_path, "straight", plan, "--steps", "4", model=model)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc, _ = pooled(tmp_path, "first", plan, "--steps", "2", "--checkpoint-dir", str(ck), "--checkpoint-every", "2",
                     model=model)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    keys = runtime.checkpoint.read_metadata(ck / "step-00000002").state_dict_metadata
    assert {"rng.rank0.cpu", "rng.rank1.cpu"} <= set(keys)
    proc, resumed = pooled(tmp_path, "resumed", plan, "--steps", "4", "--checkpoint-dir", str(ck), "--resume",
                           model=model)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert resumed["first_step"] == 2 and resumed["losses"] == straight["losses"][2:], (resumed, straight)
    print(f"straight {straight['losses']}, resumed {resumed['losses']}")

"""Hand-built plans run under torchrun on gloo must train exactly like one process (fp32: 1e-5).

Each case is a real `torch.distributed.run` launch (~4-12 s on 2 cores); the 4-rank ones are `slow`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: also for the worker scripts importing this
import rank_pool  # noqa: E402

from partita.costmodel import model_fingerprint, resolve_model
from partita.planner.plan import Plan
from partita.runtime.launcher.checks import build_meta

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3


def make_plan(model: str = "tiny-gpt", *, pp=1, dp=1, tp=1, micro=1, mb=2, schedule="1F1B",
              fingerprint=True) -> dict:
    """A plan dict as the planner would write it: blocks split evenly over stages, Megatron-style TP."""
    meta = build_meta(resolve_model(model))
    layers = len(meta.blocks)
    top = [n for n, _ in meta.named_children() if n != "blocks"]
    head, tail = [n for n in top if n not in ("ln_f", "head")], ["ln_f", "head"]
    stages = []
    for s in range(pp):
        mods = [f"blocks.{i}" for i in range(s * layers // pp, (s + 1) * layers // pp)]
        mods = (head if s == 0 else []) + mods + (tail if s == pp - 1 else [])
        stages.append({"index": s, "modules": mods, "split_at": None if s == 0 else mods[0]})
    placements = {}
    if tp > 1:
        for name, mod in meta.named_modules():
            if isinstance(mod, nn.Linear) and name.startswith("blocks."):
                placements[name] = "rowwise" if name.endswith(("proj", "fc2")) else "colwise"
    plan = {
        "schema": "partita.plan/1",
        "model": {"name": model, **({"fingerprint": model_fingerprint(meta)} if fingerprint else {})},
        "cluster": {"spec": f"{pp * dp * tp}xcpu", "num_devices": pp * dp * tp},
        "train": {"global_batch": dp * micro * mb, "seq_len": resolve_model(model).seq_len, "dtype": "fp32"},
        "mesh": {"pp": pp, "dp": dp, "tp": tp},
        "schedule": {"name": schedule, "num_microbatches": micro, "micro_batch_size": mb},
        "stages": stages,
        "blocks": [{"fqn": f"blocks.{i}", "stage": i * pp // layers, "sharding": "tensor" if tp > 1 else "replicate"}
                   for i in range(layers)],
        "placements": placements,
        "predicted": {"step_time_s": 0.01, "peak_memory_bytes": 2_000_000},
    }
    Plan.from_dict(plan)  # the same validation the runtime applies
    return plan


def _env(**extra) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **extra}


def launch(tmp_path: Path, plan: dict, ranks: int, model: str = "tiny-gpt", env: dict | None = None,
           flags: tuple[str, ...] = (), steps: int = STEPS):
    """Run the plan on `ranks` gloo ranks with --verify (and `flags`), as torchrun's workers would run it, on
    the session's long-lived ranks (tests/rank_pool.py); returns (its end: returncode, stdout, stderr, and
    the losses-out JSON or None)."""
    plan_file, out = tmp_path / "plan.json", tmp_path / "out.json"
    plan_file.write_text(json.dumps(plan))
    argv = [str(plan_file), "--model", model, "--steps", str(steps), "--verify", "--losses-out", str(out), *flags]
    proc = rank_pool.shared().run(ranks, argv, cwd=ROOT, env=env)
    return proc, (json.loads(out.read_text()) if out.exists() else None)


def assert_matches(proc, out):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert out["reference_losses"] is not None and len(out["losses"]) == STEPS
    assert out["max_abs_diff"] <= 1e-5, out
    assert max(abs(a - b) for a, b in zip(out["losses"], out["reference_losses"])) <= 1e-5
    assert out["step_time_s"] > 0 and out["peak_memory_bytes"] > 0
    print(f"max_abs_diff={out['max_abs_diff']:.2e}")


CASES = [  # id, ranks, model, plan kwargs
    pytest.param(2, "tiny-gpt", dict(dp=2, micro=2), id="dp2-ddp-accum2"),
    pytest.param(2, "tiny-gpt", dict(tp=2), id="tp2"),
    pytest.param(2, "tiny-gpt", dict(pp=2, micro=4, schedule="1F1B"), id="pp2-1f1b-x4"),
    pytest.param(1, "tiny-gpt", dict(micro=4), id="accum4"),
    pytest.param(4, "tiny-gpt", dict(pp=2, dp=2, micro=2, schedule="GPipe"), id="pp2xdp2-gpipe",
                 marks=pytest.mark.slow),
    pytest.param(4, "tiny-gpt", dict(tp=2, dp=2, micro=2), id="tp2xdp2", marks=pytest.mark.slow),
    pytest.param(4, "tiny-llama", dict(pp=2, tp=2, micro=2), id="llama-pp2xtp2", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("ranks,model,kw", CASES)
def test_plan_matches_single_process(tmp_path, ranks, model, kw):
    proc, out = launch(tmp_path, make_plan(model, **kw), ranks, model)
    assert_matches(proc, out)


def test_verify_fails_when_gradients_are_not_synchronised(tmp_path):
    """A deliberately wrong run (dp gradients never averaged: the test worker tests/runtime/injected_bugs.py
    patches the runtime, then runs runtime.train) must make --verify and torchrun fail, naming what diverged.
    More injected bugs, in bf16 too: tests/runtime/test_verify_injected_bugs.py."""
    plan_file, out_file = tmp_path / "plan.json", tmp_path / "out.json"
    plan_file.write_text(json.dumps(make_plan(dp=2)))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(ROOT / "tests" / "runtime" / "injected_bugs.py"), "skip-dp-grad-sync", "train", str(plan_file),
           "--model", "tiny-gpt", "--steps", str(STEPS), "--verify", "--losses-out", str(out_file)]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert f"verify FAILED: losses, step {STEPS}" in proc.stdout and "parameters after step" in proc.stdout
    out = json.loads(out_file.read_text())
    assert out["verified"] is False and out["max_abs_diff"] > 1e-5


def _direct(tmp_path: Path, plan: dict, model="tiny-gpt", *args: str, **env):
    """The entry point without torchrun (WORLD_SIZE unset = 1): the checks run before any process group."""
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    cmd = [sys.executable, "-m", "partita.runtime.train", str(tmp_path / "plan.json"), "--model", model, "--steps", "1", *args]
    return subprocess.run(cmd, cwd=ROOT, env=_env(**env), capture_output=True, text=True, timeout=120)


def _one_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("partita: error:"), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    return lines[0]


def test_world_size_mismatch_exits_2(tmp_path):
    proc = _direct(tmp_path, make_plan(dp=2))
    assert proc.returncode == 2
    assert "plan is for 2 ranks" in _one_line(proc) and "WORLD_SIZE is 1" in proc.stderr


def test_fingerprint_mismatch_exits_2(tmp_path):
    proc = _direct(tmp_path, make_plan("tiny-gpt"), model="tiny-llama")
    assert proc.returncode == 2
    assert "fingerprint" in _one_line(proc)


def test_fingerprint_mismatch_under_torchrun_fails_before_training(tmp_path):
    proc, out = launch(tmp_path, make_plan("tiny-gpt", dp=2), 2, model="tiny-llama")
    assert proc.returncode != 0 and out is None
    assert proc.stderr.count("partita: error:") == 1 and "fingerprint" in proc.stderr
    assert "step time" not in proc.stdout

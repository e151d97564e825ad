"""A model with loss=fused trains under a data-parallel plan with the fused cross-entropy on every rank
and in the single-process reference (runtime.loop.recipe.lm_loss), and matches it under --verify."""
from __future__ import annotations

import json

import pytest

from partita.costmodel.models import resolve_model
from partita.runtime.loop.recipe import loss_for
from rank_pool import cli, run_plan
from test_plans_match_single_process import ROOT

MODEL = "gpt:layers=2,hidden=64,heads=4,vocab=128,seq=32,loss=fused"


def test_the_runtime_trains_with_the_fused_loss(tmp_path, monkeypatch):
    import partita.costmodel.models.losses as losses
    calls = []
    real = losses._FusedCrossEntropy.apply
    monkeypatch.setattr(losses._FusedCrossEntropy, "apply", lambda *a: calls.append(1) or real(*a))
    import torch
    spec = resolve_model(MODEL)
    loss = loss_for(spec)(spec.build(), (torch.zeros(2, 32, dtype=torch.long), torch.zeros(2, 32, dtype=torch.long)))
    assert calls and loss.ndim == 0  # the recipe's loss for this model is the fused one

    plan, out = tmp_path / "plan.json", tmp_path / "out.json"
    made = cli("plan", "--model", MODEL, "--cluster", "2xcpu", "--global-batch", "4", "--dp", "2", "--out", str(plan),
               cwd=ROOT)
    assert made.returncode == 0, made.stderr
    profile = tmp_path / "profile.json"
    proc = run_plan(plan, MODEL, "--steps", "2", "--verify", "--losses-out", str(out), "--profile-out", str(profile),
                    cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    assert len(res["losses"]) == 2 and res["max_abs_diff"] <= 1e-5, res

    # --profile-out (runtime.loop.profile): the last step's operators on rank 0, largest self time first; every
    # Linear runs once forward and twice backward (dX, dW), as matrix products
    prof = json.loads(profile.read_text())
    assert (prof["step"], prof["rank"], prof["device"], prof["time"]) == (2, 0, "cpu", "cpu"), prof
    assert 0 < prof["step_time_s"] <= res["step_times_s"][-1]  # rank 0's time of the step; the report's is the slowest rank's
    times = [o["self_cpu_s"] for o in prof["ops"]]
    assert times == sorted(times, reverse=True) and prof["total_s"] == pytest.approx(sum(times))
    products = [o for o in prof["ops"] if o["name"] in ("aten::mm", "aten::addmm")]  # a row per input shapes
    linears = sum(isinstance(m, torch.nn.Linear) for m in spec.build().modules())
    assert sum(o["calls"] for o in products) >= 3 * linears, products
    assert any([64, 128] in o["shapes"] or [128, 64] in o["shapes"] for o in products), products  # the head's

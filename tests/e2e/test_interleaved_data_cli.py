"""`partita run` end to end: an interleaved 1F1B plan (pp=2, 2 virtual stages per rank) of a 4-layer GPT
trained on a token file, with checkpoints, under --verify (fp32: losses within 1e-5 of one process)."""
from __future__ import annotations

import json

import numpy as np

from partita.planner.plan import Plan
from rank_pool import run_plan
from test_plans_match_single_process import ROOT, make_plan

GPT4 = "gpt:layers=4,hidden=64,heads=4,seq=32,vocab=256"


def interleaved_plan(model=GPT4, *, pp=2, v=2, micro=4, mb=1) -> dict:
    """make_plan's layout over pp x v stages in model order; stage i runs on pipeline rank i % pp."""
    plan = make_plan(model, pp=pp * v, micro=micro, mb=mb)
    plan["mesh"]["pp"] = plan["cluster"]["num_devices"] = pp
    plan["schedule"].update(name="Interleaved1F1B", virtual_stages=v)
    Plan.from_dict(plan)
    return plan


def test_partita_run_interleaved_1f1b_on_a_token_file(tmp_path):
    np.random.default_rng(0).integers(0, 256, size=20_000).astype("<u2").tofile(tmp_path / "tokens.bin")
    (tmp_path / "plan.json").write_text(json.dumps(interleaved_plan()))
    ck, out = tmp_path / "ck", tmp_path / "out.json"
    proc = run_plan(tmp_path / "plan.json", GPT4, "--steps", "4", "--verify", "--data", str(tmp_path / "tokens.bin"),
                    "--checkpoint-dir", str(ck), "--checkpoint-every", "2", "--losses-out", str(out), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    assert len(res["losses"]) == 4 and res["max_abs_diff"] <= 1e-5, res
    assert "Interleaved1F1B v=2, 4 micro-batches of " in proc.stdout and f"tokens of {tmp_path / 'tokens.bin'}" in proc.stdout
    assert res["tokens_per_s"] > 0 and "tokens/s" in proc.stdout
    assert sorted(p.name for p in ck.iterdir() if p.name.startswith("step-")) == ["step-00000002", "step-00000004"]
    manifest = json.loads((ck / "step-00000004" / "partita.json").read_text())
    assert manifest["data"]["kind"] == "file" and manifest["data"]["tokens"] == 20_000
    assert manifest["plan"]["schedule"]["virtual_stages"] == 2
    print(f"max_abs_diff={res['max_abs_diff']:.2e}, param diff {res['param_max_abs_diff']:.2e}")

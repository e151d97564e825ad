"""A plan with fewer micro-batches than stages (issue #45 item 4) runs as planned: `partita plan --pp 2` at a
global batch of one micro-batch plans GPipe (planner.plan.schedules), and its 2 gloo ranks train like one
process (fp32: 1e-5; --verify), on the session's long-lived ranks (tests/rank_pool.py)."""
from __future__ import annotations

from rank_pool import cli, run_plan

from partita.planner.plan import Plan

MODEL = "gpt:layers=2,hidden=32,heads=2,seq=16,vocab=64"


def test_one_microbatch_over_two_pipeline_ranks_trains_like_one_process(tmp_path):
    out = tmp_path / "plan.json"
    planned = cli("plan", "--model", MODEL, "--cluster", "2xcpu", "--global-batch", "2", "--dtype", "fp32",
                  "--pp", "2", "--micro-batch", "2", "--recompute", "none", "--offload", "off", "--out", str(out),
                  cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr[-2000:]
    plan = Plan.load(out)
    assert (plan.mesh.pp, plan.schedule.name, plan.schedule.num_microbatches) == (2, "GPipe", 1)
    run = run_plan(out, MODEL, "--steps", "2", "--verify", cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "verify: OK" in run.stdout, run.stdout

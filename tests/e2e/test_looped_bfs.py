"""A schedule added as one registry entry (planner.plan.schedules): LoopedBFS planned by the search when asked
for, and run by `partita run` on 2 ranks (pp=2, 2 chunks per rank) with losses equal to one process's."""
from __future__ import annotations

import json

from partita import planner
from partita.costmodel import resolve_model
from partita.planner.enumerate.space import TrainConfig
from rank_pool import run_plan
from test_plans_match_single_process import ROOT

GPT4 = "gpt:layers=4,hidden=64,heads=4,seq=32,vocab=256"


def test_looped_bfs_plans_and_runs_end_to_end(tmp_path):
    plan = planner.plan(resolve_model(GPT4), cluster="2xcpu", pp=2, virtual_stages=2,
                        train=TrainConfig(global_batch=4, dtype="fp32", schedule="LoopedBFS"))
    assert (plan.schedule.name, plan.schedule.virtual_stages, len(plan.stages)) == ("LoopedBFS", 2, 4)
    plan.save(tmp_path / "plan.json")
    out = tmp_path / "out.json"
    proc = run_plan(tmp_path / "plan.json", GPT4, "--steps", "3", "--verify", "--losses-out", str(out), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    assert len(res["losses"]) == 3 and res["max_abs_diff"] <= 1e-5, res
    assert "LoopedBFS v=2" in proc.stdout, proc.stdout

"""A plan with a pinned, uneven pipeline split (`partita plan --stage-layers 1,2`) runs as planned: 2 gloo
ranks, pp=2, stage 0 one block, stage 1 two, trained like one process (fp32: 1e-5; --verify)."""
from __future__ import annotations

import partita
from partita.planner.enumerate.space import TrainConfig

from test_plans_match_single_process import assert_matches, launch  # sibling test module

MODEL = "gpt:layers=3,hidden=32,heads=2,seq=16,vocab=64"


def test_a_pinned_split_runs_on_two_pipeline_ranks(tmp_path):
    plan = partita.plan(MODEL, cluster="2xcpu", train=TrainConfig(global_batch=4, dtype="fp32"),
                        stage_layers=(1, 2), micro_batch=1, recompute="none", offload=False)
    d = plan.to_dict()
    assert d["mesh"]["pp"] == 2 and [[m for m in s["modules"] if m.startswith("blocks.")] for s in d["stages"]] \
        == [["blocks.0"], ["blocks.1", "blocks.2"]]
    proc, out = launch(tmp_path, d, 2, model=MODEL)
    assert_matches(proc, out)

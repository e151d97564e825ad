"""Issue 46 item 3: `hf:bart` -- planned whole, encoder and decoder -- trains on 2 data-parallel gloo ranks like one
process (--verify). Planned as BartForCausalLM (its decoder alone), the run failed at step 2 with DDP's "Expected
to have finished reduction in the prior iteration ... parameters that were not used" (the idle cross-attention).

One plan and one 2-rank run of 3 steps on a tiny BART (hidden 64, 32 tokens).
"""
from __future__ import annotations

import json

import pytest
from rank_pool import run_plan

from partita.planner.api import plan
from partita.planner.enumerate.space import TrainConfig
from test_plans_match_single_process import ROOT

BART = "hf:bart:d_model=64,encoder_ffn_dim=128,decoder_ffn_dim=128,vocab_size=256,seq=32"


@pytest.mark.slow
def test_bart_trains_whole_on_dp2_like_one_process(tmp_path):
    p = plan(BART, cluster="2xcpu", train=TrainConfig(global_batch=4, dtype="fp32"), dp=2)
    assert p.model["config"]["model"] == "BartForConditionalGeneration" and p.mesh.dp == 2
    p.save(tmp_path / "plan.json")
    losses = tmp_path / "losses.json"
    done = run_plan(tmp_path / "plan.json", BART, "--steps", "3", "--lr", "1e-3", "--verify", "--log-every", "0",
                    "--losses-out", str(losses), cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    r = json.loads(losses.read_text())
    assert r["verified"] is True and all(c["passed"] for c in r["checks"]), r["checks"]
    assert len(r["losses"]) == 3 and r["losses"][2] != r["losses"][0]
    assert "verify: OK" in done.stdout.splitlines()

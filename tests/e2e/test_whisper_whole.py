"""Issue 30 item 7: a tiny Whisper, planned whole (encoder and decoder), trains on 2 gloo ranks like one process.
It used to be planned as its text decoder alone, whose idle cross-attention made DDP fail ("Expected to have
finished reduction in the prior iteration ... parameters that were not used")."""
from __future__ import annotations

import json

import pytest
import rank_pool

from partita.planner.api import plan
from partita.planner.enumerate.space import TrainConfig
from test_plans_match_single_process import ROOT

WHISPER = ("hf:whisper:d_model=64,encoder_layers=2,decoder_layers=2,encoder_attention_heads=4,decoder_attention_heads=4,"
           "encoder_ffn_dim=128,decoder_ffn_dim=128,num_mel_bins=16,max_source_positions=32,vocab_size=256,"
           "max_target_positions=64,seq=32")


@pytest.mark.slow
def test_whisper_trains_whole_under_data_parallelism_with_verify(tmp_path):
    p = plan(WHISPER, cluster="2xcpu", train=TrainConfig(global_batch=4, dtype="fp32"), dp=2)
    p.save(tmp_path / "plan.json")
    out = str(tmp_path / "out")
    proc = rank_pool.shared().run(2, [out, str(tmp_path / "plan.json"), WHISPER], cwd=ROOT, timeout=600,
                                  script=ROOT / "tests" / "e2e" / "pipeline_job.py")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "out.rank0.json").read_text())[WHISPER]
    assert res["verified"] is True and res["max_abs_diff"] <= 1e-5 and res["losses"][2] != res["losses"][0]

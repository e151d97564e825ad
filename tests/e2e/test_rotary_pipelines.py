"""Issue 30 item 1: pipelines over the rotary HuggingFace families train like one process.

Llama, Mistral, Qwen2, Gemma and Phi-3 compute their rotary cos/sin once and give them to every layer; a
pipeline of more than two stages then had a skip connection from stage 0 to stage 2 that torch's schedules
refuse ("Backward of skip connections not supported yet"), so `partita run --pp 2 --verify` crashed on the
first step. runtime.parallel.pp.relay relays such values stage by stage. Each family is planned with pp=2 and two
model chunks per rank (interleaved 1F1B: four stages, so stage 0's tables must reach stages 2 and 3) and
trained 3 steps with --verify's checks in one torchrun launch (tests/e2e/pipeline_job.py). So are Gemma-2, BLOOM
(its ALiBi biases relayed likewise) and Mamba, which item 6 made plannable.
"""
from __future__ import annotations

import pytest

from partita.planner.enumerate.space import TrainConfig
from test_pipeline_tied_and_own_loss import pipelines_in_one_launch

SMALL = "num_hidden_layers=4,hidden_size=64,intermediate_size=128,num_attention_heads=4,num_key_value_heads=2,vocab_size=256"
ROTARY = [f"hf:{family}:{SMALL}" for family in ("llama", "mistral", "qwen2", "phi3")] + [f"hf:gemma:{SMALL},head_dim=16"]
EAGER = [f"hf:gemma2:{SMALL},head_dim=16",  # soft-capped attention, rotary tables: eager attention (item 6)
         "hf:bloom:n_layer=4,hidden_size=64,n_head=4,vocab_size=256",  # ALiBi biases made once, given to every layer
         "hf:mamba:num_hidden_layers=4,hidden_size=64,state_size=8,intermediate_size=128,vocab_size=256"]  # no attention


@pytest.mark.slow
def test_rotary_families_run_interleaved_pipelines_with_verify(tmp_path):
    models = ROTARY + EAGER
    ranks = pipelines_in_one_launch(tmp_path, models, TrainConfig(global_batch=4, dtype="fp32"), stages=4, pp=2,
                                    virtual_stages=2)
    for model in models:
        res = ranks[0][model]
        assert res["verified"] is True and res["max_abs_diff"] <= 1e-5, (model, res)
        assert ranks[1][model]["losses"] == res["losses"] and res["losses"][2] != res["losses"][0]

"""partita.runtime.parallel.pp.split on models with their own loss, in one process (no process group: the Pipe's stage modules
run one after the other): the stages' output is the model's logits and the pipeline's loss computed from
them equals the model's own loss; tied parameters are found on both stages that use them."""
from __future__ import annotations

import pytest
import torch

from partita.costmodel import resolve_model
from partita.planner.api import plan
from partita.planner.enumerate.space import TrainConfig
from partita.runtime.parallel import pp
from partita.runtime.loop.recipe import build_model

MODELS = ["hf:gpt2:n_layer=2,n_embd=64,n_head=4,vocab_size=128",  # tied wte / lm_head
          "hf:llama",                                              # rotary embedding, untied
          "hf:bert"]                                               # masked LM; two ties (decoder weight, bias)


@pytest.mark.parametrize("name", MODELS)
def test_pipeline_loss_from_the_last_stage_equals_the_models_own_loss(name):
    spec = resolve_model(name)
    p = plan(spec, cluster="2xcpu", train=TrainConfig(global_batch=4, dtype="fp32"), pp=2)
    model = build_model(spec, seed=0)
    torch.manual_seed(1)
    ids = torch.randint(0, spec.config["vocab_size"], spec.example_inputs(p.schedule.micro_batch_size)[0].shape)
    batch = (ids, ids)  # labels = the inputs, as runtime.data makes HF batches
    want = spec.loss_fn(model, *batch)
    pipe = pp.split(model, p, torch.zeros(p.schedule.micro_batch_size, spec.seq_len, dtype=torch.long))
    assert "forward" not in model.__dict__  # the tracing forward is gone again
    out = pipe.get_stage_module(0)(batch[0])
    out = pipe.get_stage_module(1)(*(out if isinstance(out, tuple) else (out,)))
    loss_fn = getattr(pipe, pp.PIPE_LOSS)
    assert loss_fn is not None
    torch.testing.assert_close(loss_fn(out, batch[1]), want, rtol=1e-5, atol=1e-6)
    for names in getattr(pipe, pp.PIPE_TIED):
        holders = [i for i in range(2) if set(names) & {n for n, _ in pipe.get_stage_module(i).named_parameters(
            remove_duplicate=False)}]
        if names[0].endswith(("wte.weight", "word_embeddings.weight")):
            assert holders == [0, 1], names  # embedding on stage 0, LM head on stage 1: two copies


SHARED_TABLES = ["hf:llama:num_hidden_layers=4,hidden_size=64,intermediate_size=128,num_attention_heads=4,"
                 "num_key_value_heads=2,vocab_size=256",  # rotary cos/sin, made once and given to every layer
                 "hf:falcon:num_hidden_layers=4,hidden_size=64,num_attention_heads=4,vocab_size=256"]  # + a mask


@pytest.mark.parametrize("name", SHARED_TABLES)
def test_values_given_to_every_layer_are_relayed_so_only_neighbouring_stages_talk(name):
    """Four stages of a model that computes its rotary tables (and Falcon its causal mask) once, before the
    first layer: each stage module is fed only the previous stage's outputs (what a pipeline schedule
    sends), and the last one's logits equal the whole model's. Without the relay, stage 2 needs tensors
    of stage 0 (torch: 'Backward of skip connections not supported yet')."""
    spec = resolve_model(name)
    p = plan(spec, cluster="2xcpu", train=TrainConfig(global_batch=4, dtype="fp32"), pp=2, virtual_stages=2)
    assert len(p.stages) == 4
    model = build_model(spec, seed=0)
    ids = torch.randint(0, 256, (2, spec.seq_len), generator=torch.Generator().manual_seed(0))
    pipe = pp.split(model, p, torch.zeros(p.schedule.micro_batch_size, spec.seq_len, dtype=torch.long))
    out = (ids,)
    for i in range(4):
        out = pipe.get_stage_module(i)(*out)
        out = out if isinstance(out, tuple) else (out,)
    with pp._logits_forward(model):
        want = model(ids)
    torch.testing.assert_close(out[0], want, rtol=0, atol=0)
    stage0 = pipe.get_stage_module(0).state_dict()
    assert not [k for k in stage0 if "rotary" in k]  # HF's non-persistent inv_freq stays out of checkpoints

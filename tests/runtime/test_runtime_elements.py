"""ZeRO/FSDP, state offload and precision applied by `parallelize` on a fake process group, and the
pre-flight checks of the per-block elements (one process)."""
import dataclasses

import pytest
import torch
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, fully_shard

from partita.costmodel import resolve_model
from partita.planner.plan import Plan, PlanError
from partita.runtime.parallel.apply import parallelize
from partita.runtime.launcher.checks import preflight
from partita.runtime.data import SyntheticTokens
from partita.runtime.loop.recipe import build_model, lm_loss
from test_recompute_offload import OpCounter  # sibling test module

GPT = resolve_model("tiny-gpt")


MEGATRON = {f"blocks.{i}.{name}": "rowwise" if name.endswith(("proj", "fc2")) else "colwise"
            for i in range(2) for name in ("attn.q", "attn.k", "attn.v", "attn.proj", "mlp.fc1", "mlp.fc2")}


def plan_dict(dp=2, tp=1, zero=3, dtype="fp32", placements=None, optimizer="adam", **choices) -> dict:
    """tiny-gpt on one stage; `choices` maps a block FQN to its recompute/offload fields. With tp > 1 the
    placements default to blocks.0's q and proj only."""
    if placements is None:
        placements = {"blocks.0.attn.q": "colwise", "blocks.0.attn.proj": "rowwise"} if tp > 1 else {}
    return {"schema": "partita.plan/1", "model": {"name": "tiny-gpt"}, "cluster": {},
            "train": {"global_batch": 2 * dp, "dtype": dtype, "optimizer": optimizer}, "zero_stage": zero, "placements": placements,
            "mesh": {"pp": 1, "dp": dp, "tp": tp}, "schedule": {"name": "GPipe", "num_microbatches": 1, "micro_batch_size": 2},
            "stages": [{"index": 0, "modules": ["tok_emb", "pos_emb", "blocks", "ln_f", "head"], "split_at": None}],
            "blocks": [{"fqn": f, "stage": 0, "sharding": "replicate", **choices.get(f, {})}
                       for f in ("tok_emb", "blocks.0", "blocks.1", "head")]}


# (the `topo` fixture: tests/runtime/conftest.py)

def unit(module):
    return fully_shard.state(module)._fsdp_param_group


def forward(model):
    return model(torch.zeros(2, GPT.seq_len, dtype=torch.long))


def test_zero3_shards_each_block_and_offloads_only_the_chosen_states(topo):
    model = build_model(GPT, 0)
    total = sum(p.numel() for p in model.parameters())
    plan = Plan.from_dict(plan_dict(zero=3, **{"blocks.0": {"offload_states": True},
                                               "blocks.1": {"recompute": "full"}}))
    applied = parallelize(model, plan, topo(2, 1))
    assert applied.fsdp_units == 5 and applied.reshard_after_forward is True  # 4 blocks + the root
    assert applied.local_params * 2 == total  # every parameter sharded over dp=2
    assert applied.offload_states == ["blocks.0"] and applied.recompute == {"blocks.1": "full"}
    for fqn in ("", "tok_emb", "blocks.0", "blocks.1", "head"):
        assert isinstance(model.get_submodule(fqn), FSDPModule), fqn
    assert isinstance(unit(model.blocks[0]).offload_policy, CPUOffloadPolicy)
    assert not isinstance(unit(model.blocks[1]).offload_policy, CPUOffloadPolicy)
    assert not isinstance(unit(model).offload_policy, CPUOffloadPolicy)
    assert unit(model.blocks[1]).post_forward_mesh_info is not None  # resharded after forward
    forward(model).sum().backward()  # the wrapped forwards run under FSDP's hooks
    assert model.blocks[1].attn.q.weight.grad is not None


def test_zero2_keeps_parameters_gathered_after_forward(topo):
    model = build_model(GPT, 0)
    applied = parallelize(model, Plan.from_dict(plan_dict(zero=2)), topo(2, 1))
    assert applied.reshard_after_forward is False
    assert all(unit(model.get_submodule(f)).post_forward_mesh_info is None for f in ("", "blocks.0", "head"))


def test_a_block_of_a_zero3_plan_can_keep_its_parameters_gathered(topo):
    """A block's own zero_stage 2 in a ZeRO-3 plan: that block alone is not resharded after forward."""
    model = build_model(GPT, 0)
    parallelize(model, Plan.from_dict(plan_dict(zero=3, **{"blocks.0": {"zero_stage": 2}})), topo(2, 1))
    assert unit(model.blocks[0]).post_forward_mesh_info is None
    assert unit(model.blocks[1]).post_forward_mesh_info is not None
    with pytest.raises(PlanError, match="zero_stage"):
        Plan.from_dict(plan_dict(zero=0, dp=1, **{"blocks.0": {"zero_stage": 2}}))
    with pytest.raises(PlanError, match="zero_stage is 1"):
        Plan.from_dict(plan_dict(zero=3, **{"blocks.0": {"zero_stage": 1}}))


def test_zero3_with_tp_shards_weights_over_both_axes(topo):
    model = build_model(GPT, 0)
    applied = parallelize(model, Plan.from_dict(plan_dict(dp=2, tp=2, zero=3)), topo(2, 2))
    assert applied.tp_layers == 2 and applied.fsdp_units == 5
    q = model.blocks[0].attn.q.weight
    assert q.device_mesh.mesh_dim_names == ("dp", "tp") and q.to_local().shape == (16, 64)  # 64 rows / tp / dp
    assert model.blocks[1].attn.q.weight.to_local().shape == (32, 64)  # not tensor-parallel: dp only


def backward_ops(model) -> dict:
    inputs, targets = SyntheticTokens(GPT, 2, seed=0).batch(0)
    loss = lm_loss(model(inputs), targets)
    with OpCounter() as ops:
        loss.backward()
    return ops.counts


@pytest.mark.parametrize("dp,tp,zero,dtype", [(2, 2, 3, "fp32"), (1, 2, 0, "bf16"), (2, 1, 2, "bf16")])
def test_selective_recompute_finds_parameters_under_fsdp_tp_and_bf16(topo, dp, tp, zero, dtype):
    """FSDP's gathered parameters, DTensor parameters and autocast's bf16 copies are all parameters: no
    linear layer, norm or attention is re-run, and no tensor-parallel all-reduce either. The "op" policy
    counts the same products: it re-runs k and proj of each block (the 2nd and 4th of q k v proj fc1 fc2)."""
    mesh = topo(dp, tp)
    ops = {}
    for mode in ("none", "selective", "op"):
        model = build_model(GPT, 0)
        choices = {f: {"recompute": mode} for f in ("blocks.0", "blocks.1")}
        parallelize(model, Plan.from_dict(plan_dict(dp, tp, zero, dtype, MEGATRON if tp > 1 else {}, **choices)), mesh)
        ops[mode] = backward_ops(model)
    sel = ops["selective"]
    assert sel["addmm"] == sel["native_layer_norm"] == sel["_scaled_dot_product_flash_attention_for_cpu"] == 0
    assert sel["gelu"] == 2 and ops["none"]["gelu"] == 0
    assert sel["all_reduce"] == ops["none"]["all_reduce"]
    op = ops["op"]
    assert op["addmm"] == 4 and op["native_layer_norm"] == 4 and op["_scaled_dot_product_flash_attention_for_cpu"] == 0
    assert op["all_reduce"] == ops["none"]["all_reduce"]


@pytest.mark.parametrize("zero,dtype,want", [(3, "bf16", torch.bfloat16), (0, "bf16", torch.bfloat16),
                                             (3, "fp32", torch.float32), (0, "fp32", torch.float32)])
def test_precision_follows_the_plan(topo, zero, dtype, want):
    model = build_model(GPT, 0)
    applied = parallelize(model, Plan.from_dict(plan_dict(dp=1, zero=zero, dtype=dtype)), topo(1, 1))
    assert forward(model).dtype == want
    assert all(p.dtype == torch.float32 for p in model.parameters())  # fp32 master weights
    assert ("FSDP2" in applied.precision) == (zero == 3 and dtype == "bf16")


@pytest.mark.parametrize("over,msg", [
    (dict(zero=1, tp=2, dp=1), "ZeRO-1 with tp=2 is not run"),
    (dict(dtype="fp16"), "fp16"),
    (dict(optimizer="lamb"), "'lamb'; this runtime builds adam and sgd"),
    (dict(**{"blocks.1": {"recompute": "full", "offload_activations": True}}), "nothing to offload"),
])
def test_preflight_refuses_what_is_not_executed(over, msg):
    with pytest.raises(PlanError, match=msg) as e:
        preflight(Plan.from_dict(plan_dict(**over)), GPT, 2)
    assert "\n" not in str(e.value)


STAGES = {  # tiny-gpt in 4 or 2 pipeline stages: (stages, {block: stage})
    4: ([{"index": 0, "modules": ["tok_emb", "pos_emb"], "split_at": None},
         {"index": 1, "modules": ["blocks.0"], "split_at": "blocks.0"},
         {"index": 2, "modules": ["blocks.1"], "split_at": "blocks.1"},
         {"index": 3, "modules": ["ln_f", "head"], "split_at": "ln_f"}], {"blocks.0": 1, "blocks.1": 2}),
    2: ([{"index": 0, "modules": ["tok_emb", "pos_emb", "blocks.0"], "split_at": None},
         {"index": 1, "modules": ["blocks.1", "ln_f", "head"], "split_at": "blocks.1"}], {"blocks.0": 0, "blocks.1": 1}),
}


def interleaved_plan(pp=2, v=2, micro=2) -> dict:
    """tiny-gpt under Interleaved1F1B: pp x v stages, stage i on pipeline rank i % pp."""
    stages, owner = STAGES[pp * v]
    d = plan_dict(dp=1)
    d.update(mesh={"pp": pp, "dp": 1, "tp": 1}, train={"global_batch": micro, "dtype": "fp32"}, stages=stages,
             schedule={"name": "Interleaved1F1B", "num_microbatches": micro, "micro_batch_size": 1, "virtual_stages": v},
             blocks=[{"fqn": f, "stage": s, "sharding": "replicate"} for f, s in owner.items()])
    return d


def test_preflight_accepts_interleaved_schedules_torch_can_run():
    assert preflight(Plan.from_dict(interleaved_plan()), GPT, 2) == []
    assert preflight(Plan.from_dict(interleaved_plan(micro=4)), GPT, 2) == []
    with pytest.raises(PlanError, match="num_microbatches 5 must be a multiple of 2"):
        preflight(Plan.from_dict(interleaved_plan(micro=5)), GPT, 2)
    with pytest.raises(PlanError, match="Interleaved1F1B .* needs pp >= 2"):
        preflight(Plan.from_dict(interleaved_plan(pp=1, v=2)), GPT, 1)


def test_preflight_refuses_to_pipeline_a_model_with_its_own_loss():
    """A HuggingFace causal LM is pipelined (its last stage computes HF's loss from the logits,
    planner.plan.executable); a user's loss_fn(module, *batch) is not, in the planner's words."""
    hf = resolve_model("hf:llama")
    user = dataclasses.replace(hf, name="user-llama", config={},
                               loss_fn=lambda module, ids, labels: module(input_ids=ids, labels=labels).loss)
    d = {"schema": "partita.plan/1", "model": {"name": "hf:llama"}, "cluster": {},
         "train": {"global_batch": 2}, "mesh": {"pp": 2, "dp": 1, "tp": 1},
         "schedule": {"name": "1F1B", "num_microbatches": 2, "micro_batch_size": 1},
         "stages": [{"index": 0, "modules": ["model.embed_tokens", "model.layers.0"], "split_at": None},
                    {"index": 1, "modules": ["model.layers.1", "model.norm", "lm_head"], "split_at": "model.layers.1"}],
         "blocks": []}
    assert preflight(Plan.from_dict(d), hf, 2) == []
    with pytest.raises(PlanError, match="computes its own loss .* use a plan with pp=1"):
        preflight(Plan.from_dict(d), user, 2)


def test_preflight_checks_block_names_and_stages():
    d = plan_dict()
    d["blocks"][1]["fqn"] = "blocks.9"
    with pytest.raises(PlanError, match="'blocks.9'"):
        preflight(Plan.from_dict(d), GPT, 2)
    d = plan_dict()
    d["blocks"].append(dict(d["blocks"][1]))
    with pytest.raises(PlanError, match="second time"):
        preflight(Plan.from_dict(d), GPT, 2)
    d = plan_dict(dp=1)
    d.update(mesh={"pp": 2, "dp": 1, "tp": 1}, schedule={"name": "GPipe", "num_microbatches": 2, "micro_batch_size": 1},
             stages=[{"index": 0, "modules": ["tok_emb", "pos_emb", "blocks.0"], "split_at": None},
                     {"index": 1, "modules": ["blocks.1", "ln_f", "head"], "split_at": "blocks.1"}])
    d["blocks"][1]["stage"] = 1  # blocks.0, which stage 0 holds
    with pytest.raises(PlanError, match="stages\\[0\\] holds it"):
        preflight(Plan.from_dict(d), GPT, 2)


def test_preflight_notes_the_precision_recipe():
    assert preflight(Plan.from_dict(plan_dict()), GPT, 2) == []
    notes = preflight(Plan.from_dict(plan_dict(dtype="bf16")), GPT, 2)
    assert notes == ["precision: bf16 compute on fp32 master weights (FSDP2 MixedPrecisionPolicy, fp32 gradient reduction)"]

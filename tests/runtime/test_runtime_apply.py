"""Plan application checked in one process: pre-flight errors, pipeline split, TP shard shapes on a fake PG."""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from partita.costmodel import resolve_model
from partita.planner.plan import Plan, PlanError
from partita.runtime.parallel import pp as pipeline_parallel
from partita.runtime.launcher.checks import preflight
from partita.runtime.loop.recipe import build_model
from partita.runtime.parallel.tp import apply_tp, styles


def plan_dict(**over) -> dict:
    d = {"schema": "partita.plan/1", "model": {"name": "tiny-gpt"}, "cluster": {}, "train": {"global_batch": 4},
         "mesh": {"pp": 2, "dp": 1, "tp": 1}, "schedule": {"name": "1F1B", "num_microbatches": 2, "micro_batch_size": 2},
         "stages": [{"index": 0, "modules": ["tok_emb", "pos_emb", "blocks.0"], "split_at": None},
                    {"index": 1, "modules": ["blocks.1", "ln_f", "head"], "split_at": "blocks.1"}],
         "blocks": [], "placements": {}}
    d.update(over)
    return d


@pytest.fixture
def fake_pg():
    def init(world_size):
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    yield init
    if dist.is_initialized():
        dist.destroy_process_group()


GPT = resolve_model("tiny-gpt")


@pytest.mark.parametrize("over,msg", [
    (dict(mesh={"pp": 2, "dp": 2, "tp": 1}, train={"global_batch": 8}), "plan is for 4 ranks"),
    (dict(model={"name": "x", "fingerprint": "sha256:0"}), "fingerprint"),
    (dict(train={"global_batch": 4, "seq_len": 64}), "seq_len 32"),
    (dict(stages=[{"index": 0, "modules": ["tok_emb"], "split_at": None},
                  {"index": 1, "modules": ["head"], "split_at": "blocks.9"}]), "'blocks.9'"),
    (dict(schedule={"name": "1F1B", "num_microbatches": 1, "micro_batch_size": 4}), "1F1B needs"),
])
def test_preflight_says_what_differs(over, msg):
    with pytest.raises(PlanError, match=msg.replace("(", r"\(")) as e:
        preflight(Plan.from_dict(plan_dict(**over)), GPT, 2)
    assert "\n" not in str(e.value)


def test_preflight_checks_placements():
    tp = dict(mesh={"pp": 1, "dp": 1, "tp": 2},
              stages=[{"index": 0, "modules": ["tok_emb", "pos_emb", "blocks", "ln_f", "head"], "split_at": None}],
              schedule={"name": "GPipe", "num_microbatches": 1, "micro_batch_size": 4})
    with pytest.raises(PlanError, match="nn.Linear"):
        preflight(Plan.from_dict(plan_dict(**tp, placements={"blocks.0.ln1": "colwise"})), GPT, 2)
    tp3 = dict(tp, mesh={"pp": 1, "dp": 1, "tp": 3}, train={"global_batch": 4})
    with pytest.raises(PlanError, match="does not divide"):
        preflight(Plan.from_dict(plan_dict(**tp3, placements={"blocks.0.attn.q": "colwise"})), GPT, 3)
    assert preflight(Plan.from_dict(plan_dict(**tp, placements={"head": "colwise"})), GPT, 2) == []


def test_pipeline_split_keeps_fqns_and_checks_ownership():
    plan = Plan.from_dict(plan_dict())
    model = build_model(GPT, 0)
    pipe = pipeline_parallel.split(model, plan, torch.zeros(2, GPT.seq_len, dtype=torch.long))
    names = [{n for n, _ in pipe.get_stage_module(i).named_parameters()} for i in range(2)]
    assert names[0] | names[1] == {n for n, _ in model.named_parameters()} and not names[0] & names[1]
    assert "blocks.0.attn.q.weight" in names[0] and "head.weight" in names[1]
    wrong = plan_dict()
    wrong["stages"][0]["modules"].append("ln_f")  # the split puts ln_f on stage 1
    wrong["stages"][1]["modules"].remove("ln_f")
    with pytest.raises(PlanError, match="'ln_f' on stage 0"):
        pipeline_parallel.split(build_model(GPT, 0), Plan.from_dict(wrong), torch.zeros(2, GPT.seq_len, dtype=torch.long))


def test_styles_pair_colwise_with_rowwise_siblings():
    s = styles({"blocks.0.attn.q": "colwise", "blocks.0.attn.proj": "rowwise", "head": "colwise", "x.fc": "rowwise"})
    assert s["blocks.0.attn.q"].output_layouts == (Shard(-1),)
    assert s["head"].output_layouts == (Replicate(),)  # a lone colwise layer gathers its output
    assert s["x.fc"].input_layouts == (Replicate(),)  # a lone rowwise layer takes a replicated input


@pytest.mark.parametrize("pipelined", [False, True])
def test_tp_shards_user_and_outlined_linears(fake_pg, pipelined):
    """tp=2 on a fake process group: each placed Linear holds half its weight; the rest stay plain."""
    fake_pg(2)
    mesh = init_device_mesh("cpu", (1, 1, 2), mesh_dim_names=("pp", "dp", "tp"))
    model = build_model(GPT, 0)
    placements = {"blocks.1.attn.q": "colwise", "blocks.1.attn.proj": "rowwise", "head": "colwise"}
    target = model
    if pipelined:
        plan = Plan.from_dict(plan_dict())
        target = pipeline_parallel.split(model, plan, torch.zeros(2, GPT.seq_len, dtype=torch.long)).get_stage_module(1)
    assert apply_tp(target, placements, mesh["tp"]) == 3
    params = dict(target.named_parameters())
    assert params["blocks.1.attn.q.weight"].to_local().shape == (32, 64)
    assert params["blocks.1.attn.proj.weight"].to_local().shape == (64, 32)
    assert params["blocks.1.attn.proj.bias"].placements == (Replicate(),)
    assert params["head.weight"].to_local().shape == (128, 64)
    assert not isinstance(params["blocks.1.attn.k.weight"], DTensor)

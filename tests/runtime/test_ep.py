"""Expert parallelism's pieces (runtime/parallel/ep.py): in one 2-process gloo job, the all_to_all dispatch and combine of
sharded experts against the unsharded layer in one process -- partita's MoE (router included) and
transformers' MixtralExperts, routing uneven and routing that leaves one rank's experts without a token --
forward, input gradients and expert gradients after `sync_expert_grads`; and, in one process, which plans and
modules it refuses. Runs of whole plans under --verify: tests/e2e/test_ep_runs.py."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from spawned import spawned_json, teardown

from partita.costmodel.models.gpt import MoE, MoEExperts, GPTConfig
from partita.planner.plan import Mesh, PlanError
from partita.runtime.parallel import ep as expert_parallel

CFG = GPTConfig(layers=1, hidden=16, heads=2, vocab=32, seq=8, ffn=24, family="llama", experts=4, top_k=2)
TOKENS = 12


def _mixtral_experts(implementation: str):
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts
    cfg = MixtralConfig(hidden_size=CFG.hidden, intermediate_size=CFG.ffn, num_local_experts=CFG.experts,
                        num_experts_per_tok=CFG.top_k)
    cfg._experts_implementation = implementation  # what the model class sets: "grouped_mm" (its default) or "eager"
    return MixtralExperts(cfg)


def _init(module: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(0)
    for p in module.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return module


def _inputs(rank: int, case: str):
    """This rank's tokens, routing (for the experts-only cases) and loss weights; the same on every process."""
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(TOKENS, CFG.hidden, generator=g)
    if case == "one-rank-idle":  # every token to experts 0 and 1: ep rank 1 (experts 2, 3) receives nothing
        index = torch.stack([torch.randint(0, 2, (TOKENS,), generator=g)] * 2, 1)
        index[:, 1] = 1 - index[:, 0]
    else:
        index = torch.stack([torch.randperm(CFG.experts, generator=g)[:CFG.top_k] for _ in range(TOKENS)])
    weights = torch.rand(TOKENS, CFG.top_k, generator=g).softmax(-1)
    target = torch.randn(TOKENS, CFG.hidden, generator=g)
    return x, index, weights, target


def _call(module, case, x, index, weights):
    return module(x.unsqueeze(0)).squeeze(0) if case == "moe-router" else module(x, index, weights)


def _build(case):
    if case == "moe-router":
        return _init(MoE(CFG))
    if case.startswith("mixtral"):
        return _init(_mixtral_experts("eager" if case.endswith("eager") else "grouped_mm"))
    return _init(MoEExperts(CFG))


CASES = ("moe-router", "preset-experts", "mixtral-experts", "mixtral-experts-eager", "one-rank-idle")


def _reference(case: str, world: int) -> dict:
    """The unsharded module in one process on every rank's tokens; loss = mean over ranks of each rank's loss."""
    module = _build(case)
    xs = [_inputs(r, case)[0].requires_grad_() for r in range(world)]
    outs, loss = [], 0
    for r in range(world):
        _, index, weights, target = _inputs(r, case)
        out = _call(module, case, xs[r], index, weights)
        outs.append(out.detach())
        loss = loss + (out * target).sum() / world
    loss.backward()
    return {"outs": outs, "x_grads": [x.grad for x in xs],
            "grads": {n: p.grad.clone() for n, p in module.named_parameters()}}


def _worker(rank: int, world: int, store: str, out: str):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    mesh = Mesh(dp=world, ep=world)
    results = {}
    for case in CASES:
        for bug in ("right", "no-grad-sync"):
            ref = _reference(case, world)
            module = _build(case)
            layers = expert_parallel.shard_experts(module, mesh, rank)
            x, index, weights, target = _inputs(rank, case)
            x.requires_grad_()
            y = _call(module, case, x, index, weights)
            (y * target).sum().backward()  # this rank's loss; the global loss is the mean over the ranks
            if bug == "right":
                expert_parallel.sync_expert_grads(list(module.parameters()))
            dense = [p for p in module.parameters() if not hasattr(p, expert_parallel.EP_ATTR)]
            for p in dense:  # what DDP does for the router: the mean over the ranks
                dist.all_reduce(p.grad)
                p.grad /= world
            diff = {"layers": layers, "out": (y.detach() - ref["outs"][rank]).abs().max().item(),
                    "x_grad": (x.grad / world - ref["x_grads"][rank]).abs().max().item(), "grads": 0.0, "scale": 0.0,
                    "local": {n: list(p.shape) for n, p in module.named_parameters()}}
            g = expert_parallel.expert_groups(mesh, rank)
            for n, p in module.named_parameters():
                want = ref["grads"][n]
                if hasattr(p, expert_parallel.EP_ATTR):
                    k = p.shape[0]
                    want = want[g.index * k:(g.index + 1) * k]
                got = p.grad if p.grad is not None else torch.zeros_like(p)
                diff["grads"] = max(diff["grads"], (got - want).abs().max().item())
                diff["scale"] = max(diff["scale"], want.abs().max().item())
            results[f"{case}/{bug}"] = diff
    gathered = [None] * world
    dist.all_gather_object(gathered, results)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(gathered, f)
    teardown()  # every rank's collectives done before any tears down (spawned.teardown)


@pytest.fixture(scope="module")
def ep_runs() -> list[dict]:
    pytest.importorskip("transformers")
    return spawned_json(_worker)


@pytest.mark.parametrize("case", CASES)
def test_sharded_experts_equal_the_unsharded_layer(ep_runs, case):
    for rank, results in enumerate(ep_runs):
        r = results[f"{case}/right"]
        assert r["layers"] == 1
        assert all(shape[0] == CFG.experts // 2 for n, shape in r["local"].items() if "router" not in n), r["local"]
        assert r["out"] < 1e-5 and r["x_grad"] < 1e-5, (rank, r)
        assert r["grads"] < 1e-5, (rank, r)
    assert max(results[f"{case}/right"]["scale"] for results in ep_runs) > 1e-2  # gradients were compared


@pytest.mark.parametrize("case", CASES)
def test_expert_gradients_need_the_sync(ep_runs, case):
    """Without sync_expert_grads a rank's expert gradient is the ep group's sum, dp times too large."""
    runs = [results[f"{case}/no-grad-sync"] for results in ep_runs]
    assert all(r["out"] < 1e-5 for r in runs) and max(r["grads"] for r in runs) > 1e-3, runs


def _plan(**kw):
    mesh = {"pp": 1, "dp": 2, "cp": 1, "tp": 1, "ep": 2, **{k: v for k, v in kw.items() if k != "zero"}}
    return SimpleNamespace(mesh=Mesh(**mesh), zero_stage=kw.get("zero", 0))


@pytest.mark.parametrize("kw,needle", [
    (dict(tp=2), "ep=2 with tp=2 is not run by partita's runtime"),
    (dict(pp=2), "ep=2 with pp=2 is not run by partita's runtime"),
    (dict(cp=2), "cp=2 with ep=2 is not run by partita's runtime"),
    (dict(dp=3, ep=3), "mesh.ep=3 does not divide the 4 experts of 'blocks.0.mlp.experts'"),
])
def test_unsupported_ep_plans_are_refused_in_one_line(kw, needle):
    from partita.costmodel.models import resolve_model
    from partita.runtime.launcher.checks import build_meta
    spec = resolve_model("tiny-moe")
    with pytest.raises(PlanError) as e:
        expert_parallel.check_plan(_plan(**kw), spec, build_meta(spec))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_dense_model_has_no_experts_to_shard():
    from partita.costmodel.models import resolve_model
    from partita.runtime.launcher.checks import build_meta
    spec = resolve_model("tiny-llama")
    with pytest.raises(PlanError, match="has no mixture-of-experts layers"):
        expert_parallel.check_plan(_plan(), spec, build_meta(spec))
    moe = resolve_model("tiny-moe")
    for zero in (0, 2, 3):  # accepted: DDP, or FSDP2 with the experts their own units
        expert_parallel.check_plan(_plan(zero=zero), moe, build_meta(moe))
    assert list(expert_parallel.experts_modules(build_meta(moe))) == ["blocks.0.mlp.experts", "blocks.1.mlp.experts"]


def test_experts_modules_of_transformers_moe_families():
    pytest.importorskip("transformers")
    from partita.costmodel.models import resolve_model
    from partita.runtime.launcher.checks import build_meta
    tiny = "num_hidden_layers=1,hidden_size=32,intermediate_size=48,num_attention_heads=2,num_key_value_heads=1"
    for spec, n in ((f"hf:mixtral:{tiny},num_local_experts=4", 4),
                    (f"hf:qwen2_moe:{tiny},num_experts=4,moe_intermediate_size=16,shared_expert_intermediate_size=16", 4),
                    (f"hf:qwen3_moe:{tiny},num_experts=4,moe_intermediate_size=16", 4)):
        found = expert_parallel.experts_modules(build_meta(resolve_model(spec)))
        assert list(found) == ["model.layers.0.mlp.experts"], (spec, list(found))
        assert found["model.layers.0.mlp.experts"].num_experts == n


def test_router_aux_loss_and_checkpoints_under_ep():
    """A router load-balancing loss is computed over each rank's tokens (ep or not): --verify gets a note; an ep
    run refuses checkpoints (the expert shards are plain tensors DCP would take for replicas)."""
    pytest.importorskip("transformers")
    from partita.costmodel import PartitaError
    from partita.costmodel.models import resolve_model
    tiny = ("hf:mixtral:num_hidden_layers=1,hidden_size=32,intermediate_size=48,num_attention_heads=2,"
            "num_key_value_heads=1,num_local_experts=4")
    dp_only = _plan(ep=1)
    assert expert_parallel.check_run(dp_only, resolve_model(tiny), None, verify=True) == []
    notes = expert_parallel.check_run(dp_only, resolve_model(tiny + ",output_router_logits=true"), None, verify=True)
    assert len(notes) == 1 and "router load-balancing loss" in notes[0] and "coefficient 0.001" in notes[0]
    assert expert_parallel.check_run(_plan(), resolve_model("tiny-moe"), None, verify=True) == []
    with pytest.raises(PartitaError, match="checkpoints of expert-parallel runs"):
        expert_parallel.check_run(_plan(), resolve_model("tiny-moe"), "/nonexistent", verify=False)

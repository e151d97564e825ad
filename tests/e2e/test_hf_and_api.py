"""HuggingFace models (hf:llama, built from its config) planned and run under data parallelism (DDP),
FSDP (ZeRO-3) and tensor parallelism, and the Python API (partita.plan_and_run, runtime.run), all in one
torchrun launch of a user script (api_job.py) on 2 gloo ranks; fp32 losses within 1e-5 of one process.

The TP, FSDP and DDP plans come from the planner itself (its search restricted to each mesh), so they
also show what planner.enumerate.strategies makes of Llama: q/k/v/gate/up column-parallel, o/down row-parallel.
"""
from __future__ import annotations

import json

import pytest
import rank_pool

from partita.costmodel import resolve_model
from partita.costmodel.hardware import parse_cluster
from partita.costmodel.capture import capture
from partita.planner.api import _fingerprint
from partita.planner.estimate.build import build_plan
from partita.planner.plan import Plan
from partita.planner.search import SearchSpace, TrainConfig, search
from test_plans_match_single_process import ROOT

SPACES = {  # the planner's search restricted to one kind of parallelism on 2 CPU ranks
    "tp": SearchSpace(tp=(2,), pp=(1,), zero=(0,), recompute=("none",), offload=False),
    "fsdp": SearchSpace(tp=(1,), pp=(1,), zero=(3,), recompute=("none",), offload=False),
    "ddp": SearchSpace(tp=(1,), pp=(1,), zero=(0,), recompute=("none",), offload=False),
}


@pytest.fixture(scope="module")
def hf_plans(tmp_path_factory) -> dict[str, Plan]:
    spec = resolve_model("hf:llama")
    graph = capture(spec, dtype="fp32")
    train, cluster = TrainConfig(global_batch=4, dtype="fp32"), parse_cluster("2xcpu")
    return {name: build_plan(search(graph, cluster, train, space=space), spec.name, _fingerprint(spec), spec.config)
            for name, space in SPACES.items()}


def test_planner_shards_llama_megatron_style(hf_plans):
    tp = hf_plans["tp"]
    assert (tp.mesh.tp, tp.mesh.dp, tp.mesh.pp) == (2, 1, 1) and tp.placements
    for fqn, style in tp.placements.items():
        name = fqn.rsplit(".", 1)[1]
        if name in ("embed_tokens", "lm_head"):  # split over the vocabulary
            assert style == "vocab", (fqn, style)
            continue
        if style == "sequence":  # norms of a sequence-parallel plan
            assert name in ("input_layernorm", "post_attention_layernorm", "norm"), (fqn, style)
            continue
        want = "rowwise" if fqn.endswith(("o_proj", "down_proj")) else "colwise"
        assert style == want and name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                          "up_proj", "down_proj"), (fqn, style)
    assert tp.placements.get("model.embed_tokens") == "vocab"
    assert hf_plans["fsdp"].zero_stage == 3 and hf_plans["fsdp"].mesh.dp == 2
    assert hf_plans["ddp"].zero_stage == 0 and hf_plans["ddp"].mesh.dp == 2


def test_hf_llama_and_the_python_api_under_torchrun(tmp_path, hf_plans):
    paths = []
    for name, plan in hf_plans.items():
        plan.save(tmp_path / f"{name}.json")
        paths.append(str(tmp_path / f"{name}.json"))
    out = str(tmp_path / "out")
    proc = rank_pool.shared().run(2, [out, *paths], cwd=ROOT, timeout=600, script=ROOT / "tests" / "e2e" / "api_job.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = [json.loads((tmp_path / f"out.rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0].keys() == ranks[1].keys() == {"plan_and_run", *paths}
    for key, res in ranks[0].items():
        assert res["verified"] is True and res["max_abs_diff"] <= 1e-5, (key, res)
        assert len(res["losses"]) == 3 and 6.0 < res["losses"][0] < 7.5  # ~ln(1024): random tokens
        assert ranks[1][key]["losses"] == res["losses"] and ranks[1][key]["verified"] is True
        print(f"{key.rsplit('/', 1)[-1]}: max_abs_diff={res['max_abs_diff']:.2e} ({res['applied']})")
    for p in paths:  # return_model: rank 0 gets the trained model in one process, with every shard gathered
        got = ranks[0][p]["model"]
        assert got["type"] == "LlamaForCausalLM" and ranks[1][p]["model"] is None, (p, got)
        assert got["checksum"] == pytest.approx(got["param_checksum"], rel=1e-9, abs=1e-6), (p, got)
        assert got["file_is_the_model"], (p, got)  # --save-final's file and the returned module: one gather
    applied = {name: ranks[0][p]["applied"] for name, p in zip(hf_plans, paths)}
    assert "tensor-parallel layers" in applied["tp"] and "FSDP2" in applied["fsdp"] and applied["ddp"] == "no FSDP"
    planned = Plan.load(out + ".plan.json")  # rank 0's plan, as every rank received it
    assert planned.model["name"] == "hf:llama" and planned.mesh.world_size == 2
    assert "partita run: hf:llama on 2 rank(s)" in proc.stdout and proc.stdout.count("verify: max |loss") == 4

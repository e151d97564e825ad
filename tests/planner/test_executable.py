"""partita.planner.plan.executable: the planner plans only what the runtime executes, and the runtime's pre-flight checks
consult the same description -- a plan the planner makes is never refused by `partita.runtime.launcher.checks.preflight`
(issue 12). Tied weights split over the first and last pipeline stage are charged (memory of both copies,
one gradient all-reduce per step). Single process: planning and pre-flight need no process group."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from partita.costmodel.price import comm

from partita.costmodel import resolve_model
from partita.costmodel.errors import PartitaError
from partita.costmodel.hardware import parse_cluster
from partita.costmodel.models import ModelSpec
from partita.planner.plan import executable
from partita.planner.api import plan
from partita.planner.plan.explain import explain
from partita.planner.plan import PlanError, Stage
from partita.planner.enumerate.space import TrainConfig
from partita.runtime.launcher.checks import preflight

E2E = str(Path(__file__).resolve().parents[1] / "e2e")  # tests/e2e/two_tower.py: the user's factory
GPT2 = "hf:gpt2:n_layer=4,n_embd=64,n_head=4,vocab_size=128"
FP32 = dict(dtype="fp32")


class _TokenModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(64, 16)
        self.blocks = nn.Sequential(*(nn.Linear(16, 16) for _ in range(4)))
        self.head = nn.Linear(16, 64)

    def forward(self, tokens):
        return self.head(self.blocks(self.emb(tokens)))


def _user_loss(module, tokens, targets):
    return F.cross_entropy(module(tokens).flatten(0, 1), targets.flatten())


def _loss_fn_spec() -> ModelSpec:
    """A user's model with its own loss_fn(module, tokens, targets), given to the planner as a ModelSpec."""
    ids = lambda b: torch.zeros(b, 8, dtype=torch.long)
    return ModelSpec(name="user-token-model", build=_TokenModel, example_inputs=lambda b: (ids(b), ids(b)),
                     seq_len=8, vocab=64, loss_fn=_user_loss)


def test_hf_gpt2_at_global_batch_7_is_pipelined_and_the_runtime_accepts_the_plan():
    p = plan(GPT2, cluster="4xcpu", train=TrainConfig(global_batch=7, **FP32))
    assert p.mesh.pp > 1  # dp must divide 7: the four ranks go to pipeline stages
    assert preflight(p, resolve_model(GPT2), p.mesh.world_size) == []
    tied = p.predicted["tied_weights"]
    assert [t["params"] for t in tied] == [["transformer.wte.weight", "lm_head.weight"]]
    assert tied[0]["pp_ranks"] == [0, p.mesh.pp - 1] and tied[0]["allreduce_s"] > 0
    assert "pipeline" not in p.solver


def test_a_loss_fn_model_is_planned_without_a_pipeline_and_says_why():
    spec = _loss_fn_spec()
    p = plan(spec, cluster="2xcpu", train=TrainConfig(global_batch=4, **FP32))
    assert p.mesh.pp == 1
    # the planner sees the model's name only: not a MODEL string, so the runtime will be given its loss_fn
    assert "runs with the loss_fn given at run time, which a pipeline cannot split" in p.solver["pipeline"]
    assert "pipeline not planned: model 'user-token-model' is not a MODEL string" in explain(p, width=300)
    assert preflight(p, spec, 2) == []  # the runtime runs what was planned
    with pytest.raises(PartitaError, match=r"^pp=2 cannot run: model 'user-token-model' is not a MODEL string .* pp=1$"):
        plan(spec, cluster="2xcpu", train=TrainConfig(global_batch=4, **FP32), pp=2)


def test_the_runtime_refuses_a_hand_written_pipeline_for_a_loss_fn_model_with_the_planners_words():
    spec = _loss_fn_spec()
    p = plan(spec, cluster="2xcpu", train=TrainConfig(global_batch=4, **FP32), dp=1, tp=2)
    blocks = [dataclasses.replace(b, stage=0 if b.fqn in ("emb", "blocks.0", "blocks.1") else 1) for b in p.blocks]
    piped = dataclasses.replace(
        p, mesh=dataclasses.replace(p.mesh, pp=2, tp=1), placements={}, blocks=blocks,
        schedule=dataclasses.replace(p.schedule, name="1F1B", num_microbatches=2, micro_batch_size=2),
        stages=[Stage(index=0, modules=["emb", "blocks.0", "blocks.1"]),
                Stage(index=1, modules=["blocks.2", "blocks.3", "head"], split_at="blocks.2")])
    with pytest.raises(PlanError) as err:
        preflight(piped, spec, 2)
    assert str(err.value) == executable.pipeline_refusal(spec)


def test_model_kinds_and_what_a_pipeline_runs(two_tower):
    assert executable.model_kind(resolve_model("tiny-gpt")) == "lm"
    assert executable.model_kind(resolve_model(two_tower)) == "lm"  # a factory's token model
    assert executable.token_model_shape(resolve_model(two_tower)) == (96, 16)
    assert executable.model_kind(resolve_model(GPT2)) == "hf-causal"
    assert executable.model_kind(resolve_model("hf:bert")) == "hf-mlm"
    assert executable.model_kind(resolve_model("hf:t5")) == "seq2seq"
    assert "sequence-to-sequence" in executable.pipeline_refusal(resolve_model("hf:t5"))
    for classifier in ("hf:bert-cls", "hf:vit"):  # tests/e2e/test_hf_classifiers.py runs them at pp=1
        assert executable.model_kind(resolve_model(classifier)) == "hf-classifier"
        assert "is a HuggingFace classifier" in executable.pipeline_refusal(resolve_model(classifier))
    assert executable.model_kind(_loss_fn_spec()) == "own-loss"
    assert "BatchNorm" in executable.pipeline_refusal(resolve_model("tiny-resnet"))
    assert executable.pipeline_refusal_for("tiny-gpt") is None
    assert "not a MODEL string" in executable.pipeline_refusal_for("no-such-model")


def test_the_runtime_and_the_planner_list_the_same_schedules():
    from partita.runtime.parallel.pp import SCHEDULES
    from partita.planner.enumerate.space import SCHEDULE_CHOICES
    assert tuple(SCHEDULES) == executable.SCHEDULES
    assert set(SCHEDULE_CHOICES) - {"auto"} == set(executable.SCHEDULES)


def test_a_tied_head_split_from_its_embedding_is_charged(two_tower):
    train = TrainConfig(global_batch=4, **FP32)
    piped = plan(two_tower, cluster="2xcpu", train=train, pp=2)
    single = plan(two_tower, cluster="2xcpu", train=train, pp=1)
    assert "tied_weights" not in single.predicted  # one stage holds both owners: nothing to charge
    (tied,) = piped.predicted["tied_weights"]
    assert tied["params"] == ["tok_emb.weight", "head.weight"] and tied["pp_ranks"] == [0, 1]
    numel = 96 * 32
    assert tied["numel"] == numel and tied["grad_bytes"] == 4 * numel
    cluster = parse_cluster("2xcpu")
    want = comm.all_reduce(cluster, comm.group_for(cluster, 2, 1), 4 * numel)
    assert tied["allreduce_s"] == pytest.approx(want)
    # the copy on the last stage: fp32 parameter + gradient + Adam's two moments (+ master copy: none in fp32)
    last = piped.predicted["memory_per_stage"][1]
    assert last["model_states"] >= tied["state_bytes"] >= 16 * numel
    # the all-reduce is in the step: the breakdown's data-parallel share of the last stage's flush
    assert piped.predicted["breakdown"]["dp_comm_s"] >= tied["allreduce_s"]
    text = explain(piped, width=300)
    assert "tied weight tok_emb.weight = head.weight on pipeline ranks 0 and 1" in text
    assert "gradient all-reduce of 12.00 KiB" in text
    assert preflight(piped, resolve_model(two_tower), 2) == []


def test_a_priced_zero_stage_the_runtime_does_not_run_is_flagged():
    """ZeRO-1 runs (torch's ZeroRedundancyOptimizer) beside data and pipeline parallelism; beside tensor
    parallelism it is priced when the user fixes both (Megatron's distributed optimizer), flagged, refused."""
    train = TrainConfig(global_batch=4, **FP32)
    runs = plan("tiny-gpt", cluster="2xcpu", train=train, dp=2, zero=1)
    assert runs.zero_stage == 1 and "not_executed" not in runs.solver
    assert preflight(runs, resolve_model("tiny-gpt"), 2) == []
    p = plan("tiny-gpt", cluster="4xcpu", train=train, dp=2, tp=2, zero=1)
    assert p.zero_stage == 1 and p.mesh.tp == 2
    assert "ZeRO-1 with tp=2 is not run by partita's runtime" in explain(p, width=300)
    with pytest.raises(PlanError, match="ZeRO-1 with tp=2"):
        preflight(p, resolve_model("tiny-gpt"), 4)
    # fixing ZeRO-1 alone never hands back a tensor-parallel plan the runtime refuses
    assert plan("tiny-gpt", cluster="4xcpu", train=train, zero=1).mesh.tp == 1
    assert "not_executed" not in plan("tiny-gpt", cluster="2xcpu", train=train).solver

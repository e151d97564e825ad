"""Context and expert parallelism as planner choices (planner.enumerate.cp_ep): what they cost, when the search takes
them, and one line when a model cannot run them."""

import pytest

from partita import planner
from partita.costmodel.errors import PartitaError
from partita.costmodel.hardware import parse_cluster as make_cluster
from partita.costmodel.price.memory import state_bytes
from partita.costmodel.models import resolve_model
from partita.costmodel.capture import capture
from partita.planner.enumerate.candidates import split_model
from partita.planner.enumerate.cp_ep import attention_kv_bytes, experts_of
from partita.planner.enumerate.options import Variant, cost_variant
from partita.planner.enumerate.space import TrainConfig
from partita.planner.enumerate.strategies import replicate_option

LONG = TrainConfig(global_batch=64, seq_len=131072)
MIXTRAL = ("hf:mixtral:num_hidden_layers=2,hidden_size=128,num_attention_heads=4,vocab_size=512,"
           "intermediate_size=256,num_key_value_heads=2,num_local_experts=4,num_experts_per_tok=2")


def test_kv_bytes_are_the_keys_and_values_of_a_sample():
    g = capture(resolve_model("tiny-llama"), "fp32", 1)
    # 2 (K and V) x 32 tokens x 2 kv heads x 16 head dims x 4 bytes, one attention per block
    assert attention_kv_bytes(g, split_model(g)[1][0]) == 2 * 32 * 2 * 16 * 4


def test_a_cp_layer_runs_a_cp_th_of_the_work_and_pays_the_kv_gathers():
    g = capture(resolve_model("llama3-8b"), "bf16", 1)
    cluster, sb = make_cluster("8x8xH100-80GB"), state_bytes("bf16", "adam")
    base = replicate_option(g, split_model(g)[1][0], cluster, 1)
    one = cost_variant(Variant(base), cluster, sb, 3, 8, 1, 1)
    four = cost_variant(Variant(base), cluster, sb, 3, 8 * 4, 1, 1 / 4, cp=4)
    assert one.cp_comm == 0 and four.cp_comm > 0
    # a quarter of the work, and of each GEMM's rows: a little further from peak
    assert one.compute / 4 < four.compute < 1.15 * one.compute / 4
    kv = base.kv_bytes  # the gathered K and V stay for the backward: 3/4 of a whole sequence's
    assert four.act == pytest.approx(one.act / 4 + kv * 3 / 4, rel=1e-6)
    assert four.state == pytest.approx(one.state / 4, rel=1e-6)  # sharded over dp x cp ranks
    assert four.timing.exposed["cp"] == four.cp_comm and four.time > four.cp_comm


def test_cp_priced_as_asked_and_reported():
    p = planner.plan("llama3-8b", cluster="8x8xH100-80GB", train=LONG, cp=4)
    assert p.mesh.cp == 4 and p.mesh.world_size == 64
    pred = p.predicted
    assert pred["breakdown"]["cp_comm_s"] > 0
    assert sum(pred["breakdown"].values()) == pytest.approx(pred["step_time_s"], rel=1e-6)
    assert any("context parallelism" in a for a in pred["assumptions"])
    assert p.to_dict()["mesh"]["cp"] == 4


def test_the_search_takes_cp_where_long_sequences_need_it():
    p = planner.plan("llama3-8b", cluster="8x8xH100-80GB", train=LONG)
    assert p.mesh.cp > 1
    short = planner.plan("llama3-8b", cluster="8x8xH100-80GB", train=TrainConfig(global_batch=64, seq_len=4096))
    assert short.mesh.cp == 1


@pytest.mark.parametrize("model, cp, needle", [
    ("gpt:layers=2,hidden=64,heads=4,vocab=256,seq=64,attention=math", 2, "attention=sdpa"),
    ("tiny-llama", 3, "not divisible by 6"),
])
def test_a_cp_the_model_cannot_run_is_one_line(model, cp, needle):
    with pytest.raises(PartitaError, match=needle):
        planner.plan(model, cluster="1x6xcpu" if cp == 3 else "1x2xcpu", train=TrainConfig(global_batch=6), cp=cp)


def test_experts_are_found_and_sharded_by_ep():
    g = capture(resolve_model(MIXTRAL), "bf16", 1)
    layer = split_model(g)[1][0]
    e = experts_of(g, layer)
    assert e.count == 4 and e.numel == 4 * 3 * 128 * 256
    assert e.dispatch_bytes == 64 * 2 * 128 * 2  # 64 tokens x top-2 rows of 128 bf16 values
    assert experts_of(capture(resolve_model("tiny-llama"), "fp32", 1), "blocks.0") is None
    cluster, sb = make_cluster("1x8xH100-80GB"), state_bytes("bf16", "adam")
    base = replicate_option(g, layer, cluster, 1)
    one = cost_variant(Variant(base), cluster, sb, 0, 8, 1, 1)
    two = cost_variant(Variant(base), cluster, sb, 0, 8, 1, 1, ep=2)
    per_param = sb.param + sb.grad + sb.optimizer
    assert one.state - two.state == pytest.approx(per_param * e.numel / 2)
    assert one.ep_comm == 0 and two.ep_comm > 0 and two.compute > one.compute  # the busiest rank paces


def test_ep_planned_as_asked_and_refused_for_dense_models():
    p = planner.plan(MIXTRAL, cluster="1x8xH100-80GB", train=TrainConfig(global_batch=8, seq_len=64), ep=4)
    assert p.mesh.ep == 4 and p.mesh.dp % 4 == 0
    assert any("expert parallelism" in a for a in p.predicted["assumptions"])
    with pytest.raises(PartitaError, match="ep=2 cannot run: .*has none"):
        planner.plan("tiny-llama", cluster="1x2xcpu", train=TrainConfig(global_batch=2), ep=2)
    with pytest.raises(PartitaError, match="mesh.ep"):
        planner.Plan.from_dict({**p.to_dict(), "mesh": {**p.to_dict()["mesh"], "ep": 3}})


def test_the_search_stays_inside_what_the_runtime_runs_and_a_fixed_what_if_says_so():
    # searched: cp never meets pp (runtime/parallel/cp.py cannot split a pipeline stage's traced attention)
    p = planner.plan("llama3-8b", cluster="8x8xH100-80GB", train=LONG, cp=4)
    assert p.mesh.pp == 1 and "not_executed" not in p.solver
    # fixed by the user, as a published run was: priced, and the plan says the runtime will not run it
    q = planner.plan("llama3-8b", cluster="8x8xH100-80GB", train=LONG, cp=4, pp=2, tp=8)
    assert (q.mesh.cp, q.mesh.pp) == (4, 2)
    assert "cp=4 with pp=2 is not run by partita's runtime" in q.solver["not_executed"]
    # a model whose attention the runtime does not split: never searched, priced when fixed
    hf = "hf:llama:num_hidden_layers=2,hidden_size=64,num_attention_heads=4,vocab_size=256,intermediate_size=128,seq=32768"
    assert planner.plan(hf, cluster="1x8xH100-80GB", train=TrainConfig(global_batch=8)).mesh.cp == 1
    fixed = planner.plan(hf, cluster="1x8xH100-80GB", train=TrainConfig(global_batch=8), cp=2)
    assert fixed.mesh.cp == 2 and "partita's GPT and Llama models" in fixed.solver["not_executed"]


def test_a_moe_routers_softmax_is_not_explicit_attention():
    # tiny-moe attends with sdpa; its router's softmax over experts must not read as attention=math
    p = planner.plan("tiny-moe", cluster="1x2xcpu", train=TrainConfig(global_batch=2), cp=2)
    assert p.mesh.cp == 2 and "not_executed" not in p.solver

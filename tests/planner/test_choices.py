"""The planner's choices on cases built to need them, and the plans' integrity."""
import json

import pytest

import partita.planner as planner
from partita.costmodel.hardware import parse_cluster
from partita.costmodel.price.memory import state_bytes
from partita.costmodel.models import resolve_model
from partita.planner.plan import Plan
from partita.planner.search import SearchSpace, search
from partita.planner.solve.bounds import stage_bound
from partita.costmodel.errors import InfeasibleError, PartitaError


def test_pure_data_parallel_when_the_model_fits_and_communication_is_cheap():
    plan = planner.plan("megatron-1.7b", cluster="4x8xA100-80GB", train=planner.TrainConfig(global_batch=512))
    assert (plan.mesh.pp, plan.mesh.tp, plan.mesh.dp) == (1, 1, 32)
    assert not plan.placements


def test_tensor_and_pipeline_parallel_when_data_parallel_cannot_fit(graph_of):
    """Without ZeRO, recompute or offload, 175B replicas cannot fit: the plan must split the model."""
    cluster = parse_cluster("16x8xA100-80GB")
    train = planner.TrainConfig(global_batch=256)
    plain = SearchSpace(zero=(0,), recompute=("none",), offload=False)
    result = search(graph_of("gpt3-175b", "bf16"), cluster, train, space=plain)
    dp_only = [c for c in result.every_candidate() if c.pp == 1 and c.tp == 1]
    assert dp_only and all(c.solution is None or not c.solution.feasible for c in dp_only)
    assert all(stage_bound(c.problem) == float("inf") for c in dp_only if c.solution is None)  # never solved: no fit
    best = result.best
    assert best.pp * best.tp > 1
    assert best.solution.stage_mem.max() <= cluster.device.usable_memory()
    # the full space (ZeRO, recompute, offload) contains that space, so it is never slower
    full = search(graph_of("gpt3-175b", "bf16"), cluster, train)
    assert full.best.step_time <= best.step_time * (1 + 5e-3)


def test_tensor_parallel_splits_layers_megatron_style(graph_of):
    """Without ZeRO, an 18B model must be split; tensor parallelism inside a node beats deeper pipelines."""
    from partita.planner.estimate.build import build_plan
    plain = SearchSpace(zero=(0,), recompute=("none",), offload=False)
    result = search(graph_of("megatron-18b", "bf16"), parse_cluster("32x8xA100-80GB"),
                    planner.TrainConfig(global_batch=1024), space=plain)
    plan = build_plan(result, "megatron-18b", "", {})
    assert plan.mesh.tp > 1
    assert plan.placements["blocks.0.attn.q"] == "colwise" and plan.placements["blocks.0.mlp.fc2"] == "rowwise"
    assert plan.placements["blocks.39.attn.proj"] == "rowwise"


def _independent_state_bytes(plan: Plan, graph) -> tuple[list[float], list[float]]:
    """Model-state bytes per stage, and of them the gradients', recomputed from the plan's blocks and
    placements alone."""
    sb = state_bytes(plan.train["dtype"], plan.train["optimizer"])
    per_stage = [0.0] * plan.mesh.pp
    grads = [0.0] * plan.mesh.pp
    for block in plan.blocks:
        numel = 0
        for n in graph.nodes_of(block.fqn):
            d = graph.g.nodes[n]
            for pname, count in d["params"].items():
                style = plan.placements.get(d["module"])
                split = style in ("colwise", "vocab") or (style == "rowwise" and not pname.endswith("bias"))
                numel += count // plan.mesh.tp if split else count
        # ZeRO (REFERENCE.md): stage 1 shards optimizer state, 2 also gradients, 3 also parameters
        shard = {0: (1, 1, 1), 1: (1, 1, plan.mesh.dp), 2: (1, plan.mesh.dp, plan.mesh.dp),
                 3: (plan.mesh.dp,) * 3}[block.zero_stage or plan.zero_stage]
        zero = block.zero_stage or plan.zero_stage
        if not block.offload_states:  # offloaded shards live in host memory
            rank = block.stage % plan.mesh.pp  # interleaved: stage i runs on pipeline rank i % pp
            if plan.mesh.pp > 1 and zero >= 2 and plan.mesh.dp > 1:
                # torch.distributed.pipelining keeps an FSDP stage's parameters gathered and its gradients
                # whole, accumulated in fp32, until the step's last backward
                per_stage[rank] += numel * (sb.param + sb.grad_comm + sb.optimizer / plan.mesh.dp)
                grads[rank] += numel * sb.grad_comm
            else:
                per_stage[rank] += numel * (sb.param / shard[0] + sb.grad / shard[1] + sb.optimizer / shard[2])
                grads[rank] += numel * sb.grad / shard[1]
    return per_stage, grads


@pytest.mark.parametrize("model,cluster,batch", [("gpt3-175b", "64x8xA100-80GB", 512),
                                                 ("megatron-39b", "8x8xA100-40GB", 256)])
def test_plans_respect_every_devices_memory(model, cluster, batch, graph_of):
    plan = planner.plan(model, cluster=cluster, train=planner.TrainConfig(global_batch=batch))
    cap = parse_cluster(cluster).device.usable_memory()
    rows = plan.predicted["memory_per_stage"]
    assert len(rows) == plan.mesh.pp
    assert all(r["total"] <= cap for r in rows) and plan.predicted["peak_memory_bytes"] <= cap
    states, grads = _independent_state_bytes(plan, graph_of(model, "bf16"))
    m = plan.schedule.num_microbatches
    for i, (r, s, g) in enumerate(zip(rows, states, grads)):
        # at the forward/backward peak a stage whose first backward comes before its micro-batches run out
        # (m <= in flight: p - i in 1F1B, m in GPipe) has made no gradient yet
        in_flight = m if plan.schedule.name == "GPipe" else min(plan.mesh.pp - i, m)
        absent = r["phase"] == "forward/backward" and m <= in_flight
        if plan.schedule.name in ("1F1B", "GPipe"):
            assert r["model_states"] == pytest.approx(s - g * absent, rel=1e-6)
        else:
            assert r["model_states"] in (pytest.approx(s, rel=1e-6), pytest.approx(s - g, rel=1e-6))
    # stages hold every block once, contiguously, in model order
    mods = [m for st in plan.stages for m in st.modules]
    assert mods == graph_of(model, "bf16").groups


def test_plan_round_trips_through_json(tmp_path):
    plan = planner.plan("small-gpt", cluster="2x4xA100-40GB", train=planner.TrainConfig(global_batch=64))
    path = tmp_path / "plan.json"
    plan.save(path)
    again = Plan.load(path)
    assert again.to_dict() == plan.to_dict()
    assert again.to_json() == path.read_text()


def test_predicted_breakdown_adds_up_to_the_step_time():
    plan = planner.plan("megatron-39b", cluster="64x8xA100-80GB", train=planner.TrainConfig(global_batch=1536))
    pred = plan.predicted
    assert sum(pred["breakdown"].values()) == pytest.approx(pred["step_time_s"], rel=1e-9)
    assert pred["tokens_per_s"] == pytest.approx(1536 * 2048 / pred["step_time_s"])


def test_a_model_that_cannot_fit_says_what_it_needs():
    with pytest.raises(InfeasibleError) as e:
        planner.plan("gpt3-175b", cluster="2xA100-80GB", train=planner.TrainConfig(global_batch=8))
    msg = str(e.value)
    assert "no plan fits" in msg and "GiB per device" in msg and "model states" in msg


def test_models_without_one_repeated_run_use_the_general_program():
    """A CNN (stages of different blocks) is planned block by block, contiguously, every block placed once."""
    plan = planner.plan("resnet:depth=50", cluster="2x8xA100-80GB", train=planner.TrainConfig(global_batch=256))
    assert plan.solver["formulation"] == "blocks"
    order = [m for st in plan.stages for m in st.modules]
    assert order == [b.fqn for b in plan.blocks] and len(set(order)) == len(order)


def test_general_program_splits_unlike_blocks_into_a_pipeline(two_tower):
    from partita.costmodel.capture import capture
    from partita.planner.search import SearchSpace, search
    graph = capture(resolve_model(two_tower), dtype="bf16")
    result = search(graph, parse_cluster("2xA100-80GB"), planner.TrainConfig(global_batch=8),
                    space=SearchSpace(pp=(2,)))
    c = result.best
    assert c.formulation == "blocks" and c.pp == 2
    assert c.solution.stage_time.min() > 0  # both stages hold work


def test_an_encoder_decoder_pipeline_is_refused_with_the_runtimes_reason():
    """The runtime does not pipeline seq2seq models (planner.plan.executable): a fixed pp=2 is one line."""
    with pytest.raises(PartitaError, match="pp=2 cannot run: .* sequence-to-sequence"):
        planner.plan("hf:t5:num_layers=4,num_decoder_layers=4,d_model=256,d_ff=1024", cluster="2xA100-80GB",
                     train=planner.TrainConfig(global_batch=8), pp=2)


def test_heterogeneous_resource_list_balances_stages_by_device_speed_and_memory(tmp_path):
    spec = {"schema": "partita.cluster/1", "inter_group_bw": 12.5e9, "groups": [
        {"name": "fast", "nodes": 2, "devices_per_node": 8, "device": "A100-80GB"},
        {"name": "slow", "nodes": 2, "devices_per_node": 8, "device": "V100-32GB"}]}
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(spec))
    plan = planner.plan("megatron-3.6b", cluster=str(path), train=planner.TrainConfig(global_batch=256))
    groups = plan.cluster["stage_groups"]
    assert plan.mesh.pp >= 2 and set(groups) == {"fast", "slow"}
    layers = {g: 0 for g in groups}
    for b in plan.blocks:
        if b.fqn.startswith("blocks."):
            layers[groups[b.stage % plan.mesh.pp]] += 1
    assert layers["fast"] > layers["slow"]  # an A100 does ~2.5x a V100's bf16 work
    for row, cap in zip(plan.predicted["memory_per_stage"], plan.predicted["memory_capacity_per_stage"]):
        assert row["total"] <= cap
    assert 0 < plan.predicted["mfu"] < 1


def test_a_model_with_nothing_to_split_gets_no_tensor_parallel_ranks():
    import torch
    import torch.nn as nn
    plan = planner.plan(nn.Sequential(nn.Linear(64, 64)), (torch.randn(4, 64),), cluster="8xA100-80GB",
                        train=planner.TrainConfig(global_batch=64))
    assert plan.mesh.tp == 1 and not plan.placements


def test_interleaved_plans_count_the_activations_the_schedule_keeps_in_flight(graph_of):
    """Rank s of an interleaved 1F1B warms up 2 (p - s - 1) + (v - 1) p chunks: it holds that + 1 chunks,
    each 1/v of its activations (rank 0: p (1 + (p - 1) / (p v)), Korthikanti et al.)."""
    from partita.planner.enumerate.candidates import _Bases, build_candidate, split_model
    graph = graph_of("megatron-39b", "bf16")
    bases = _Bases(graph, parse_cluster("8x8xA100-80GB"), *split_model(graph))
    p, v, m = 4, 2, 16
    c = build_candidate(bases, planner.TrainConfig(global_batch=256), SearchSpace(), p, 16, 1, 0, 1,
                        "Interleaved1F1B", v)
    assert c.num_microbatches == m  # 256 samples over dp=16, one per micro-batch
    expected = [(2 * (p - s - 1) + (v - 1) * p + 1) / v for s in range(p)]
    assert list(c.problem.in_flight) == pytest.approx(expected)
    assert c.problem.in_flight[0] == pytest.approx(p * (1 + (p - 1) / (p * v)))

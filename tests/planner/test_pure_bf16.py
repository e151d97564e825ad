"""Pure bf16 (TrainConfig.master_weights "none"): bf16 parameters, gradients and Adam moments, no fp32 master
copy -- priced (costmodel.price.memory), carried in the plan's train section, fixed by `--master-weights none`
and shown by `partita explain`. The run itself: tests/runtime/test_pure_bf16_runs.py."""
import json

import pytest

from partita.cli import main
from partita.costmodel.errors import PartitaError
from partita.costmodel.price.memory import state_bytes
from partita.planner.api import plan_search
from partita.planner.enumerate.options import zero_state_bytes
from partita.planner.enumerate.space import TrainConfig
from partita.planner.plan import Plan, PlanError

LLAMA3_8B = 8_030_261_248


def test_state_bytes_per_parameter():
    mixed, pure = state_bytes("bf16"), state_bytes("bf16", master_weights="none")
    assert (mixed.param, mixed.grad, mixed.optimizer, mixed.total) == (2, 2, 12, 16)  # ZeRO's 2 + 2 + K, K = 12
    assert (pure.param, pure.grad, pure.optimizer, pure.total) == (2, 2, 4, 8)     # 2 + 2 + (2 + 2)
    assert (pure.step_traffic, pure.grad_comm, pure.shard_copy) == (14, 2, 2)        # 7 x 2 bytes; bf16 reduce
    assert state_bytes("bf16", "sgd", master_weights="none").total == 4
    # each term shards as before: ZeRO-1 (2 + 2) + 4 / d, ZeRO-3 8 / d
    assert zero_state_bytes(1000, pure, 1, 4) == 4 * 1000 + 4 * 1000 / 4
    assert zero_state_bytes(1000, pure, 3, 4) == 8 * 1000 / 4


def test_llama3_8b_holds_8_bytes_less_per_parameter_and_steps_and_reduces_half_the_bytes():
    plans = {}
    for mw in ("fp32", "none"):
        _, plans[mw] = plan_search("llama3-8b", cluster="8xH200-141GB", train=TrainConfig(
            global_batch=8, seq_len=2048, dtype="bf16", master_weights=mw), dp=4, pp=2, tp=1, zero=0,
            recompute="full", offload=False, micro_batch=1)
    states = {mw: sum(m["model_states"] for m in p.predicted["memory_per_stage"]) for mw, p in plans.items()}
    assert plans["none"].model["parameters"] == LLAMA3_8B
    assert states["fp32"] == 16 * LLAMA3_8B and states["none"] == 8 * LLAMA3_8B
    assert states["fp32"] - states["none"] == 8 * LLAMA3_8B == 64_242_089_984  # ZeRO-0: every stage's own
    mixed, pure = (plans[mw].predicted["breakdown"] for mw in ("fp32", "none"))
    assert pure["optimizer_s"] == pytest.approx(mixed["optimizer_s"] * 14 / 28)  # Adam step traffic 14 vs 28 B
    assert pure["dp_comm_s"] < 0.51 * mixed["dp_comm_s"]  # bf16 gradients on the wire, not fp32


def test_train_config_refuses_what_it_cannot_mean():
    with pytest.raises(PartitaError, match="needs dtype bf16, got fp32"):
        TrainConfig(global_batch=8, dtype="fp32", master_weights="none")
    with pytest.raises(PartitaError, match="accepted: fp32, none"):
        TrainConfig(global_batch=8, master_weights="bf16")


def test_plan_round_trip_and_old_plans(tmp_path):
    _, plan = plan_search("tiny-gpt", cluster="2xcpu", train=TrainConfig(global_batch=4, master_weights="none"),
                          dp=2, pp=1, zero=0)
    assert plan.train["dtype"] == "bf16" and plan.train["master_weights"] == "none"  # bf16 on CPUs too
    assert plan.predicted["memory_per_stage"][0]["model_states"] == 134_912 * 8
    plan.save(tmp_path / "p.json")
    again = Plan.load(tmp_path / "p.json")
    assert again.train == plan.train and again.to_dict() == plan.to_dict()
    assert "pure bf16 (no fp32 master weights)" in again.explain()
    d = plan.to_dict()
    old = {**d, "train": {k: v for k, v in d["train"].items() if k != "master_weights"}}
    assert "master_weights" not in Plan.from_dict(old).train  # written before the field: fp32 master, unchanged
    for bad, why in (({"master_weights": "bf16"}, "must be one of fp32, none"),
                     ({"master_weights": "none", "dtype": "fp32"}, "needs train.dtype bf16")):
        with pytest.raises(PlanError, match=why):
            Plan.from_dict({**d, "train": {**d["train"], **bad}})


def test_the_cli_flag_and_explain(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["plan", "--model", "tiny-gpt", "--cluster", "2xcpu", "--global-batch", "4", "--dp", "2",
                 "--master-weights", "none", "--out", str(out), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["train"]["master_weights"] == "none" and d["train"]["dtype"] == "bf16"
    assert main(["explain", str(out)]) == 0
    assert "pure bf16 (no fp32 master weights)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    assert "--master-weights {fp32,none}" in capsys.readouterr().out

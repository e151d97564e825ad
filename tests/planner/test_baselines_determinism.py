"""The plan against the hand-configured baselines, and determinism of the plan artifact."""
import subprocess
import sys

import pytest

import partita.planner as planner
from partita.planner.estimate.baselines import baseline_spaces

GAP = 5e-3  # the solver's relative optimality gap (planner.solve.milp.StageProblem.mip_rel_gap)


@pytest.mark.parametrize("model,cluster,batch", [
    ("gpt3-175b", "128x8xA100-80GB", 1536),
    ("megatron-7.5b", "16x8xA100-80GB", 512),
    ("llama3-8b", "8x8xH100-80GB", 256),
])
def test_plan_is_never_predicted_slower_than_a_baseline_that_fits(model, cluster, batch):
    plan = planner.plan(model, cluster=cluster, train=planner.TrainConfig(global_batch=batch), baselines=True)
    names = [b["name"] for b in plan.baselines]
    assert len(names) == 4 and names[0] == "DDP" and names[1].startswith("FSDP")
    fitting = [b for b in plan.baselines if b["fits"]]
    assert fitting, "at least one baseline fits these published-scale cases"
    for b in fitting:
        assert plan.predicted["step_time_s"] <= b["predicted"]["step_time_s"] * (1 + GAP), b["name"]
        assert b["predicted"]["peak_memory_bytes"] <= plan.predicted["memory_capacity_bytes"]


def test_megatron_baseline_uses_a_whole_node_of_tensor_parallelism_and_full_recompute():
    from partita.costmodel.hardware import parse_cluster
    spaces = {s.name: s for s in baseline_spaces(parse_cluster("4x8xA100-80GB"))}
    meg = spaces["Megatron TP8 x PP"]
    assert meg.tp == (8,) and meg.recompute == ("full",) and meg.zero == (0,) and meg.min_pp
    plan = planner.plan("megatron-39b", cluster="64x8xA100-80GB", train=planner.TrainConfig(global_batch=1536),
                        baselines=True)
    b = next(b for b in plan.baselines if b["name"].startswith("Megatron"))
    assert b["fits"] and b["mesh"]["tp"] == 8 and b["mesh"]["zero_stage"] == 0


def _plan_in_subprocess(seed: str) -> str:
    code = ("import planner; p = planner.plan('megatron-3.6b', cluster='8x8xA100-80GB', "
            "train=planner.TrainConfig(global_batch=512)); print(p.canonical_json(), end='')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
                            "PARTITA_CACHE_DIR": "off"})  # each process captures (under its own hash seed)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_same_inputs_give_byte_identical_plans():
    a, b = _plan_in_subprocess("1"), _plan_in_subprocess("12345")
    assert a == b and '"schema": "partita.plan/1"' in a

"""The benchmarks stay runnable: each module imports, and the cheap ones run a tiny configuration.

Not the benchmarks themselves (`python -m benchmarks.run_all`); results go to a temporary directory.
"""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODULES = ["common", "table1", "planner_speed", "solver", "fidelity", "runtime_overhead", "published", "examples",
           "run_all", "report", "handwritten.loop", "gpu", "gpu_plans", "rec", "resilience", "recovery",
           "snapshots"]


@pytest.fixture
def results(tmp_path, monkeypatch):
    import benchmarks.common as common
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    return tmp_path


@pytest.mark.parametrize("name", MODULES)
def test_imports(name):
    mod = importlib.import_module(f"benchmarks.{name}")
    assert mod.__doc__


def test_solver_exactness_and_plot(results):
    from benchmarks import solver
    exact = solver.exactness(instances=5, seed=1)
    assert exact["passed"] and exact["max_rel_gap"] <= 1e-6
    payload = solver.run(instances=3, large=[], cbc=False)
    solver._plot({**payload, "solve_times": [{"name": "x", "seconds": [0.01, 0.02, 0.5]}]})
    assert (results / "solver.png").exists()


def test_planner_speed_one_small_model(results):
    from benchmarks import planner_speed
    row = planner_speed.measure("tiny-gpt", "8xA100-80GB", 8)
    assert row["candidates"] >= row["candidates_solved"] >= 1 and row["process_wall_s"] > row["search_s"] > 0
    assert row["warm_capture_s"] < row["capture_s"] and row["warm_process_wall_s"] > row["warm_search_s"] > 0
    head = planner_speed.headline("tiny", "tiny-gpt", "8xA100-80GB", 8, None, 60.0, repeats=1)
    assert head["passed"] and head["solver"]["candidates"] >= 1
    planner_speed._plot({"by_model": [row], "by_cluster": {"tiny-gpt": [row]}, "headlines": [head]})
    assert (results / "planner_speed.png").exists()


def test_fidelity_plans_and_statistics():
    from benchmarks import fidelity
    from partita.costmodel.hardware import parse_cluster
    from partita.costmodel.hardware.resources import cluster_to_dict
    assert fidelity.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert fidelity.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert fidelity.spearman([1, 2, 2, 3], [1, 2, 2, 3]) == pytest.approx(1.0)
    resources = cluster_to_dict(parse_cluster("4xcpu"))
    cases = [(1, 1, 1), (2, 1, 2), (1, 2, 2), (1, 1, 2, "bf16"), (1, 1, 2, "bf16", 3)]
    plans = fidelity.make_plans(resources, "tiny-gpt", plans=cases, global_batch=4)
    assert [(p.mesh.tp, p.mesh.pp, p.mesh.world_size) for *_, p in plans] == [c[:3] for c in cases]
    assert all(p.predicted["step_time_s"] > 0 and p.predicted["peak_memory_bytes"] > 0 for *_, p in plans)
    assert [c.precision for c, _ in plans] == ["fp32"] * 3 + ["bf16 autocast", "bf16 FSDP2"]
    assert [p.train["dtype"] for _, p in plans] == ["fp32"] * 3 + ["bf16"] * 2 and plans[-1][1].zero_stage == 3


@pytest.mark.parametrize("kind", ["ddp", "fsdp", "tp"])
def test_runtime_overhead_plans_validate(kind):
    from benchmarks import runtime_overhead
    plan = runtime_overhead.make_plan("tiny-gpt", kind, 2, 4)
    assert plan["mesh"]["dp" if kind != "tp" else "tp"] == 2
    assert plan["zero_stage"] == (3 if kind == "fsdp" else 0)
    json.dumps(plan)

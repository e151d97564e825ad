"""The scripts in examples/ run as a user would run them (a subprocess from the repository root) and
print what they promise. Small models and clusters keep each to a few seconds."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from partita.planner.plan import Plan

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def run(cmd: list[str], timeout: float = 300, **env) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


def test_plan_gpt_prints_the_report_and_saves_a_valid_plan(tmp_path):
    out = tmp_path / "plan.json"
    proc = run([sys.executable, str(EXAMPLES / "plan_gpt.py"), "--model", "gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1000",
                "--cluster", "2x4xA100-80GB", "--global-batch", "64", "--seq", "128", "--out", str(out)])
    assert "partita plan" in proc.stdout and "predicted" in proc.stdout
    assert f"saved {out}" in proc.stdout and "TFLOP/s per device" in proc.stdout
    plan = Plan.load(out)
    assert plan.mesh.world_size == 8 and plan.train["global_batch"] == 64 and plan.train["seq_len"] == 128


def test_plan_hf_model_plans_a_transformers_llama(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "plan.json"
    proc = run([sys.executable, str(EXAMPLES / "plan_hf_model.py"), "--out", str(out)])
    assert "partita plan" in proc.stdout and "hf:llama" in proc.stdout
    plan = Plan.load(out)
    assert plan.model["name"].startswith("hf:llama") and plan.mesh.world_size == 8
    assert sum(b.fqn.startswith("model.layers.") for b in plan.blocks) == 4  # the 4 decoder layers, by module path


def test_custom_module_planned_by_import_path_from_the_cli():
    """As its docstring says: the console script, from the repository root, no PYTHONPATH (issue 30 item 14)."""
    partita = Path(sys.executable).with_name("partita")
    cmd = [str(partita)] if partita.exists() else [sys.executable, "-m", "partita.cli"]
    assert "PYTHONPATH" not in (EXAMPLES / "custom_module.py").read_text()
    proc = run(cmd + ["plan", "--model", "examples.custom_module:build", "--cluster", "8xA100-80GB",
                      "--global-batch", "256", "--json"], PYTHONPATH="")
    plan = json.loads(proc.stdout)
    assert plan["schema"] == "partita.plan/1" and plan["model"]["name"] == "examples.custom_module:build"
    assert plan["mesh"]["pp"] * plan["mesh"]["dp"] * plan["mesh"]["tp"] == 8
    fqns = [b["fqn"] for b in plan["blocks"]]
    assert [f"blocks.{i}" for i in range(12)] == [f for f in fqns if f.startswith("blocks.")]


def test_custom_module_from_the_python_api():
    proc = run([sys.executable, str(EXAMPLES / "custom_module.py")])
    assert "TokenMLP" in proc.stdout and "predicted" in proc.stdout


@pytest.mark.slow
def test_run_tiny_sh_plans_trains_and_verifies():
    if not (ROOT / ".venv" / "bin" / "partita").exists():
        pytest.skip("examples/run_tiny.sh uses .venv/bin/partita (scripts/setup.sh)")
    proc = run(["bash", str(EXAMPLES / "run_tiny.sh"), "2"], timeout=600)
    assert "plan written to" in proc.stdout
    assert "verify: max |loss - reference|" in proc.stdout and ": OK" in proc.stdout

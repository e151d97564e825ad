"""Plan files that are not plans: every command that reads one (explain, compare, run, export) refuses them in
one line before anything runs, and every check of a plan happens before `partita run` launches a process.

All checks of the file itself are in planner.plan's loader (Plan.load / Plan.from_dict); the checks against the
model are runtime.launcher.checks.preflight, which `partita run` runs in its pre-flight (`runtime.train --check`)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from partita import cli
from partita.planner.plan import MAX_DEPTH, Plan, PlanError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from test_plans_match_single_process import make_plan  # noqa: E402


def commands(path: Path) -> list[list[str]]:
    p = str(path)
    return [["explain", p], ["compare", p, p], ["run", p, "--model", "tiny-gpt", "--steps", "1"],
            ["export", p, "--to", "megatron"]]


def one_line_error(argv, capsys) -> str:
    assert cli.main(argv) == 2, argv
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("partita: error: "), captured.err
    assert "Traceback" not in captured.err + captured.out
    return lines[0]


@pytest.fixture
def no_launch(monkeypatch):
    """`partita run` must refuse the plan before it starts any process."""
    def launched(*a, **k):
        raise AssertionError(f"started a process: {a[0] if a else k}")
    monkeypatch.setattr(subprocess, "run", launched)
    monkeypatch.setattr(subprocess, "call", launched)
    monkeypatch.setattr(subprocess, "Popen", launched)


def test_a_binary_plan_file_is_one_line_for_every_command(tmp_path, capsys, no_launch):
    bad = tmp_path / "r.json"
    bad.write_bytes(bytes(range(256)) * 4)  # random-looking bytes, not UTF-8
    for argv in commands(bad):
        line = one_line_error(argv, capsys)
        assert "is not a text file" in line and "not UTF-8" in line, line


def test_deeply_nested_json_is_one_line(tmp_path, capsys, no_launch):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)  # beyond Python's recursion limit
    for argv in commands(deep):
        assert "nests JSON deeper than Python can read" in one_line_error(argv, capsys)
    plan = make_plan()
    nested: object = 1
    for _ in range(MAX_DEPTH + 5):  # readable JSON, but deeper than any plan
        nested = {"x": nested}
    plan["model"]["config"] = nested
    (tmp_path / "nested.json").write_text(json.dumps(plan))
    assert f"a plan nests at most {MAX_DEPTH}" in one_line_error(["explain", str(tmp_path / "nested.json")], capsys)


@pytest.mark.parametrize("edit, message", [
    (lambda p: p["train"].update(seq_len=1e30), "train.seq_len must be a whole number from 1 to 2,147,483,647, got 1e+30"),
    (lambda p: p["train"].update(seq_len=2**40), "train.seq_len must be a whole number from 1 to"),
    (lambda p: p["mesh"].update(dp=10**30), "mesh.dp must be a whole number from 1 to 2,147,483,647, got 1000000000"),
    (lambda p: p["schedule"].update(micro_batch_size=2.0), "schedule.micro_batch_size must be a whole number"),
    (lambda p: p["train"].update(dtype=["fp32"]), "train.dtype must be a name"),
    (lambda p: p["stages"][1]["modules"].append("blocks.0"), "stages[1] lists module 'blocks.0' already on stages[0]"),
    (lambda p: p["stages"][0]["modules"].append("blocks.0"), "stages[0] lists module 'blocks.0' a second time"),
    (lambda p: p["stages"][1]["modules"].append("blocks.0.attn"), "which stages[0] already holds as part of 'blocks.0'"),
    (lambda p: p["stages"][1]["modules"].remove("blocks.1"), "blocks[1] names module 'blocks.1', which no stage lists"),
])
def test_plan_values_the_loader_refuses(tmp_path, capsys, no_launch, edit, message):
    plan = make_plan(pp=2, micro=2)
    edit(plan)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(plan))
    with pytest.raises(PlanError, match=None) as e:
        Plan.load(path)
    assert message in str(e.value), str(e.value)
    for argv in commands(path):
        assert message in one_line_error(argv, capsys)


def test_nan_literal_is_refused(tmp_path):
    path = tmp_path / "nan.json"
    path.write_text(json.dumps(make_plan()).replace('"step_time_s": 0.01', '"step_time_s": NaN'))
    with pytest.raises(PlanError, match="NaN is not a number a plan may hold"):
        Plan.load(path)


def test_a_stage_list_that_omits_a_layer_is_refused_before_launch(tmp_path, monkeypatch, capsys):
    """A pp=2 plan whose stage lists and blocks both leave out blocks.1 is a well-formed file; against the model
    it would leave blocks.1 untrained. `partita run`'s pre-flight (in its launcher process, before torchrun's
    agent) refuses it in one line, and torchrun is never started."""
    plan = make_plan(pp=2, micro=2)
    plan["stages"][1]["modules"].remove("blocks.1")
    plan["blocks"] = [b for b in plan["blocks"] if b["fqn"] != "blocks.1"]
    path = tmp_path / "omit.json"
    path.write_text(json.dumps(plan))
    Plan.load(path)  # the file alone is well formed
    from partita.runtime import api, train
    monkeypatch.setattr(api, "agent_main", lambda *a, **k: pytest.fail("torchrun was started"))
    monkeypatch.setattr(cli, "run_forwarding_signals", lambda cmd, env: train.main(cmd[3:]))  # in this process
    line = one_line_error(["run", str(path), "--model", "tiny-gpt", "--steps", "1"], capsys)
    assert "no stage lists module 'blocks.1' of --model tiny-gpt" in line, line

"""A plan file never chooses code (issue 29, item 3): `partita.run(plan, model_fn)` takes the model from its
caller and checks the plan's fingerprint against it; a plan whose model name is an import path is never
imported, and the CLI reports a name that differs from --model as a checked line."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

import partita
from partita.costmodel import PartitaError, resolve_model
from partita.planner.plan import Plan, PlanError
from partita.runtime.launcher.checks import preflight

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from test_plans_match_single_process import _env, make_plan  # noqa: E402

GPT = resolve_model("tiny-gpt")


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A module `planted` in the working directory (first on sys.path, as `python -m` puts it) whose import and
    whose factory each leave a marker file: the plan names it as its model."""
    (tmp_path / "planted.py").write_text(
        "from pathlib import Path\n"
        "Path(__file__).with_name('imported').touch()\n"
        "def factory():\n"
        "    Path(__file__).with_name('called').touch()\n"
        "    raise SystemExit('planted code ran')\n")
    monkeypatch.chdir(tmp_path)
    plan = make_plan()
    plan["model"]["name"] = "planted:factory"
    yield plan
    sys.modules.pop("planted", None)
    assert not (tmp_path / "imported").exists() and not (tmp_path / "called").exists(), "the plan's module ran"


def test_run_never_imports_the_module_a_plan_names(planted):
    with pytest.raises(PartitaError, match="never makes partita import code"):
        partita.run(planted, GPT.build, steps=1, print_report=False)
    result = partita.run(planted, GPT.build, steps=1, print_report=False, example_inputs=GPT.example_inputs,
                         loss_fn=GPT.loss_fn, vocab=GPT.vocab)  # the caller's model, checked by fingerprint
    assert len(result.losses) == 1


def test_the_fingerprint_decides_not_the_name(planted):
    """The caller's module is checked against the plan's fingerprint: another model is refused in one line."""
    other = resolve_model("gpt:layers=3,hidden=64,heads=4,vocab=256,seq=32")
    with pytest.raises(PlanError, match="fingerprint .* but --model .* has fingerprint"):
        partita.run(planted, other.build, steps=1, print_report=False, example_inputs=other.example_inputs,
                    loss_fn=other.loss_fn, vocab=other.vocab)


def test_a_name_that_differs_from_model_is_a_checked_line():
    plan = make_plan()
    plan["model"]["name"] = "../../etc/passwd; rm -rf ~"
    notes = preflight(Plan.from_dict(plan), GPT, 1)
    assert notes == ["note: plan was made for model '../../etc/passwd; rm -rf ~'; --model tiny-gpt has the same "
                     f"parameters (fingerprint {plan['model']['fingerprint']}), so it runs"]
    del plan["model"]["fingerprint"]
    assert preflight(Plan.from_dict(plan), GPT, 1) == [
        "note: plan was made for model '../../etc/passwd; rm -rf ~', not --model tiny-gpt, and records no "
        "fingerprint to check that they are the same model"]
    plan["model"]["name"] = "tiny\x1b[2J"  # a terminal escape never reaches a note: the file is refused first
    with pytest.raises(PlanError, match="control character"):
        Plan.from_dict(plan)


def test_the_cli_pre_flight_prints_the_mismatch(tmp_path):
    plan = make_plan()
    plan["model"]["name"] = "../../etc/passwd"
    (tmp_path / "p.json").write_text(json.dumps(plan))
    proc = subprocess.run([sys.executable, "-m", "partita.runtime.train", str(tmp_path / "p.json"), "--model",
                           "tiny-gpt", "--check"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "note: plan was made for model '../../etc/passwd'; --model tiny-gpt has the same parameters" in proc.stdout

"""Checkpoints (DCP), resume and faults in one process: a one-rank gloo group (runtime.run without torchrun).

The multi-rank cases -- another plan and world size, a rank killed under torchrun --max-restarts, a crash
mid-save -- are in tests/e2e/test_checkpoint_restart.py.
"""
import hashlib
import json
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

import partita.runtime as runtime
from partita.costmodel import PartitaError, resolve_model
from partita.planner.plan import Plan
from partita.runtime import checkpoint as ckpt
from partita.runtime.failure.faults import Faults, parse
from partita.runtime.loop.session import NonFiniteLoss, RunOptions, prepare

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from test_plans_match_single_process import _env, make_plan  # noqa: E402

GPT = resolve_model("tiny-gpt")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """tiny-gpt trained 4 steps on one rank (2 microbatches), checkpoints after steps 2 and 4."""
    root = tmp_path_factory.mktemp("ckpt")
    plan = make_plan("tiny-gpt", micro=2)
    result = runtime.run(plan, "tiny-gpt", steps=4, checkpoint_dir=root, checkpoint_every=2, verify=True,
                         print_report=False)
    assert not dist.is_initialized()  # run() made its own group and destroyed it
    return root, plan, result


def copy(saved, tmp_path) -> Path:
    shutil.copytree(saved[0], tmp_path / "c")
    return tmp_path / "c"


def resume_error(root: Path, plan: dict, model="tiny-gpt", steps=6, **kw) -> str:
    with pytest.raises(PartitaError) as e:
        prepare(Plan.from_dict(plan), resolve_model(model), RunOptions(steps=steps, checkpoint_dir=str(root),
                                                                      resume=True, **kw), 1)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_checkpoints_are_committed_step_directories(saved):
    root, _, result = saved
    assert [p.name for p in ckpt.steps(root)] == ["step-00000002", "step-00000004"]
    assert (root / "partita-run.json").is_file() and not ckpt.incomplete(root)
    assert result.checkpoints == [str(root / "step-00000002"), str(root / "step-00000004")]
    assert ckpt.latest(root) == root / "step-00000004"
    c = ckpt.open_checkpoint(root / "step-00000004")
    assert c.step == 4 and c.manifest["model"]["fingerprint"] == make_plan()["model"]["fingerprint"]
    assert set(c.manifest["files"]) == {".metadata", "__0_0.distcp"}
    keys = ckpt.read_metadata(c.path).state_dict_metadata
    assert "model.blocks.0.attn.q.weight" in keys and "optim.blocks.0.attn.q.weight.exp_avg_sq" in keys
    assert "optim.head.weight.step" in keys


def test_resume_continues_the_uninterrupted_trajectory(saved, tmp_path):
    """Resume from step 2 under another plan (4 microbatches) and compare with the reference from step 0."""
    root = copy(saved, tmp_path)
    shutil.rmtree(root / "step-00000004")
    first = saved[2]
    result = runtime.run(make_plan("tiny-gpt", micro=4, mb=1), "tiny-gpt", steps=4, checkpoint_dir=root, resume=True,
                         verify=True, print_report=False)
    assert result.first_step == 2 and result.resumed_from == str(root / "step-00000002")
    assert len(result.losses) == 2 and result.verified and result.max_abs_diff <= 1e-5
    assert max(abs(a - b) for a, b in zip(result.losses, first.losses[2:])) <= 1e-5
    assert abs(result.param_checksum - first.param_checksum) <= 1e-6 * abs(first.param_checksum)
    print(f"resumed: max_abs_diff={result.max_abs_diff:.2e}, param diff {result.param_max_abs_diff:.2e}")


def test_nan_loss_stops_before_the_update_and_keeps_the_last_checkpoint(saved, tmp_path, monkeypatch):
    root = copy(saved, tmp_path)
    monkeypatch.setenv("PARTITA_FAULT", "nan,step=6")
    with pytest.raises(NonFiniteLoss, match="loss is nan at step 6.*the newest checkpoint, .*step-00000005, holds the "
                                            "weights step 6 started from; the one before it is .*step-00000004"):
        runtime.run(make_plan(micro=2), "tiny-gpt", steps=8, checkpoint_dir=root, checkpoint_every=1, resume=True,
                    print_report=False)
    assert not dist.is_initialized()
    assert [p.name for p in ckpt.steps(root)] == ["step-00000002", "step-00000004", "step-00000005"]


def test_an_incomplete_save_is_ignored(saved, tmp_path):
    root = copy(saved, tmp_path)
    shutil.copytree(root / "step-00000004", ckpt.tmp_dir(root, 6))  # a crashed save of step 6: not renamed
    assert ckpt.latest(root) == root / "step-00000004"
    assert ckpt.incomplete(root) == [root / ".step-00000006.tmp"]


def rewrite_manifest(d: Path, manifest: dict) -> None:
    """Edit a checkpoint's manifest and the digest beside it alike (an edit that knows of both), so that the
    checks after the manifest's own are what a test reaches."""
    (d / "partita.json").write_text(json.dumps(manifest))
    ckpt.sidecar(d).write_text(ckpt.manifest_digest((d / "partita.json").read_bytes()))


def damage(d: Path, action: str, name: str) -> None:
    """Break checkpoint directory `d` as a failing disk, a crash or a hostile edit would."""
    if action == "rm":
        (d / name).unlink()
    elif action == "truncate":
        with open(d / name, "r+b") as f:
            f.truncate(100)
    elif action == "garbage":
        size = (d / name).stat().st_size  # same size: only the content is wrong
        (d / name).write_bytes(b"\x80\x04garbage" + b"\x00" * (size - 9))
        if name == "partita.json":
            (d / name).write_text("{not json")
    elif action == "evil":
        payload = pickle.dumps(__import__("os").system)  # a pickle that would import a callable
        (d / name).write_bytes(payload)
        manifest = json.loads((d / "partita.json").read_text())
        manifest["files"][".metadata"] = {"bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
        rewrite_manifest(d, manifest)


DAMAGE = [
    ("rm __0_0.distcp", "is missing file __0_0.distcp"),
    ("truncate __0_0.distcp", "file __0_0.distcp has 100 bytes, the checkpoint recorded"),
    ("garbage .metadata", r"DCP \.metadata is unreadable"),
    ("evil .metadata", r"DCP \.metadata is unreadable \(UnpicklingError: posix.system is not part of DCP metadata\)"),
    ("garbage partita.json", "partita.json is not valid JSON"),
    ("rm partita.json", "has no partita.json"),
]


@pytest.mark.parametrize("what,msg", DAMAGE)
def test_a_damaged_checkpoint_is_passed_over_for_the_one_before(saved, tmp_path, what, msg):
    """The newest checkpoint damaged: the pre-flight names it and resumes from the one before; both damaged: one
    line before any step."""
    root = copy(saved, tmp_path)
    action, name = what.split(" ")
    damage(root / "step-00000004", action, name)
    prep = prepare(Plan.from_dict(make_plan(micro=2)), GPT, RunOptions(steps=6, checkpoint_dir=str(root),
                                                                      resume=True), 1)
    assert prep.resume.path == root / "step-00000002"
    assert re.search(msg, prep.candidates.skipped[0]) and str(root / "step-00000004") in prep.candidates.skipped[0]
    damage(root / "step-00000002", action, name)
    error = resume_error(root, make_plan(micro=2))
    assert re.search(msg, error) and error.endswith(f"no older intact checkpoint is in {root} to resume from"), error


@pytest.mark.parametrize("what,msg", [
    ("fingerprint", r"was written for model 'tiny-gpt' \(fingerprint sha256:0\)"),
    ("optimizer", "holds adam optimizer state; the plan trains with sgd"),
    ("steps", "is at step 4; --steps 4 leaves nothing to train"),
])
def test_an_incompatible_checkpoint_fails_before_training(saved, tmp_path, what, msg):
    """A checkpoint that is intact but does not fit this run is not passed over: one line, before any step."""
    root = copy(saved, tmp_path)
    d = root / "step-00000004"
    plan, steps = make_plan(micro=2), 6
    if what == "fingerprint":
        manifest = json.loads((d / "partita.json").read_text())
        manifest["model"]["fingerprint"] = "sha256:0"
        rewrite_manifest(d, manifest)
    elif what == "optimizer":
        plan["train"]["optimizer"] = "sgd"
    elif what == "steps":
        steps = 4
    error = resume_error(root, plan, steps=steps)
    assert re.search(msg, error), error


def test_resume_without_a_checkpoint_starts_at_step_0(tmp_path):
    prep = prepare(Plan.from_dict(make_plan()), GPT, RunOptions(steps=2, checkpoint_dir=str(tmp_path), resume=True), 1)
    assert prep.resume is None and any("no checkpoint" in n for n in prep.notes)


def test_corrupt_checkpoint_exits_2_with_one_line(saved, tmp_path):
    """The entry point (one rank, no torchrun): one line on stderr, exit code 2, no step."""
    root = copy(saved, tmp_path)
    for step in ("step-00000002", "step-00000004"):
        (root / step / "__0_0.distcp").unlink()
    (tmp_path / "plan.json").write_text(json.dumps(make_plan(micro=2)))
    proc = subprocess.run([sys.executable, "-m", "partita.runtime.train", str(tmp_path / "plan.json"), "--model", "tiny-gpt",
                           "--steps", "6", "--checkpoint-dir", str(root), "--resume"],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == (f"partita: error: checkpoint {root / 'step-00000004'} is missing file "
                                   f"__0_0.distcp; no older intact checkpoint is in {root} to resume from")


def test_fault_switch_parses_and_fires_once(tmp_path, monkeypatch):
    assert parse("rank=1,step=3; save,step=4 ;nan,step=2") == [
        parse("rank=1,step=3")[0], parse("save,rank=0,step=4")[0], parse("nan,step=2")[0]]
    for bad in ("step=3", "rank=1", "kill,step=2", "rank=x,step=1"):
        with pytest.raises(PartitaError, match="PARTITA_FAULT"):
            parse(bad)
    f = Faults(rank=0, marker_dir=tmp_path, text="save,step=4;nan,step=2")
    assert f.nan_at(2) and not f.nan_at(3)
    assert f._first_time(f.faults[0]) and not f._first_time(f.faults[0])  # the marker file remembers
    assert (tmp_path / ".fault-save-rank0-step4").exists()
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert not Faults(rank=0, marker_dir=None, text="save,step=4")._first_time(f.faults[0])


DROPOUT = "gpt:layers=2,hidden=64,heads=4,vocab=128,seq=32,dropout=0.1"


def test_a_dropout_model_resumes_bit_exactly(tmp_path, monkeypatch):
    """4 steps straight vs 2 steps, checkpoint, resume for 2 more: the losses of steps 3-4 are bit-identical
    (the generator states travel with the checkpoint; the batches follow the step). Without the restored
    generators the resumed run draws other dropout masks, so the comparison can fail."""
    plan = make_plan(DROPOUT, micro=2)
    straight = runtime.run(plan, DROPOUT, steps=4, print_report=False)
    runtime.run(plan, DROPOUT, steps=2, checkpoint_dir=tmp_path, checkpoint_every=2, print_report=False)
    md = ckpt.read_metadata(tmp_path / "step-00000002")
    assert "rng.rank0.cpu" in md.state_dict_metadata
    resumed = runtime.run(plan, DROPOUT, steps=4, checkpoint_dir=tmp_path, resume=True, print_report=False)
    assert resumed.first_step == 2 and resumed.resumed_from == str(tmp_path / "step-00000002")
    assert resumed.losses == straight.losses[2:], (resumed.losses, straight.losses)
    assert not any("generator" in n for n in resumed.notes)

    monkeypatch.setattr(ckpt.saving, "_set_rng_state", lambda state: None)  # the generators left as seeded
    unrestored = runtime.run(plan, DROPOUT, steps=4, checkpoint_dir=tmp_path, resume=True, print_report=False)
    assert unrestored.losses != straight.losses[2:]
    print(f"straight {straight.losses[2:]}, resumed {resumed.losses}, without the generators {unrestored.losses}")

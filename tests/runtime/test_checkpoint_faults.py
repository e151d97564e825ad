"""Fault injection on one rank (a one-process gloo group, runtime.run or the entry point without torchrun): what a
careful operator did to `partita run` and its checkpoints (issue 29), each against what must hold.

- content hashes: a same-size edit of tensor bytes is caught and the run resumes from the newest intact one;
- DCP's CheckpointException (a BaseException) on load and on save becomes one line naming the intact checkpoint;
- the checkpoint directory must be writable before the first step;
- ownership: a fresh run refuses another run's directory, two runs cannot share one, a restart resumes only its
  own run's steps; --keep N prunes;
- a NaN or a non-finite update keeps the loss history (--losses-out) and never calls a checkpoint good whose
  weights gave the NaN;
- SIGTERM stops at a step boundary with a checkpoint, one line, exit code 143, and the resume continues the
  uninterrupted trajectory exactly.

The multi-rank and launcher cases are in tests/e2e/test_signals_and_ownership.py.
"""
import json
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

import partita.runtime as runtime
from partita.costmodel import resolve_model
from partita.planner.plan import Plan
from partita.runtime import checkpoint as ckpt
from partita.runtime.checkpoint import ownership
from partita.runtime.checkpoint import CheckpointError
from partita.runtime.loop.session import NonFiniteLoss, NonFiniteParameters, RunOptions, Stopped, prepare

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from test_plans_match_single_process import _env, make_plan  # noqa: E402

PLAN = make_plan("tiny-gpt", micro=2)


def run(steps, root, **kw):
    return runtime.run(PLAN, "tiny-gpt", steps=steps, checkpoint_dir=root, print_report=False, **kw)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """6 uninterrupted steps (the reference trajectory) and a directory checkpointed after steps 2 and 4."""
    straight = run(6, None)
    root = tmp_path_factory.mktemp("ck")
    run(4, root, checkpoint_every=2)
    return straight, root


def fresh(trained, tmp_path) -> Path:
    shutil.copytree(trained[1], tmp_path / "ck")
    return tmp_path / "ck"


def flip_a_byte(path: Path) -> None:
    """A same-size edit of tensor bytes (the file keeps its size; a size check cannot see it)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))


def entry_point(tmp_path, *args, env=None, preexec_fn=None) -> subprocess.CompletedProcess:
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    return subprocess.run([sys.executable, "-m", "partita.runtime.train", str(tmp_path / "plan.json"), "--model",
                           "tiny-gpt", *args], cwd=ROOT, env=_env(**(env or {})), capture_output=True, text=True,
                          timeout=180, preexec_fn=preexec_fn)


def test_every_file_has_a_content_hash(trained):
    manifest = ckpt.open_checkpoint(trained[1] / "step-00000004").manifest
    assert set(manifest["files"]) == {".metadata", "__0_0.distcp"}
    for name, entry in manifest["files"].items():
        assert len(entry["sha256"]) == 64 and entry["bytes"] == (trained[1] / "step-00000004" / name).stat().st_size
    assert manifest["run_id"] == ownership.owner_run_id(trained[1])


def test_a_same_size_edit_is_caught_and_the_run_resumes_from_the_newest_intact(trained, tmp_path):
    root = fresh(trained, tmp_path)
    flip_a_byte(root / "step-00000004" / "__0_0.distcp")
    result = run(6, root, resume=True)
    assert result.resumed_from == str(root / "step-00000002") and result.first_step == 2
    assert result.losses == trained[0].losses[2:]  # the uninterrupted trajectory, bit for bit
    assert (f"checkpoint {root / 'step-00000004'}: file __0_0.distcp does not match its content hash (changed since "
            f"it was saved): resuming from {root / 'step-00000002'}, the newest intact checkpoint") in result.notes


def test_no_intact_checkpoint_left_is_one_line(trained, tmp_path):
    root = fresh(trained, tmp_path)
    for step in ("step-00000002", "step-00000004"):
        flip_a_byte(root / step / "__0_0.distcp")
    with pytest.raises(CheckpointError, match=r"step-00000004: file __0_0.distcp does not match its content hash "
                                              r".*; no older intact checkpoint is in .* to resume from"):
        run(6, root, resume=True)
    assert not dist.is_initialized()


def test_dcp_failing_to_load_is_one_line(trained, tmp_path):
    """A checkpoint written before content hashes (sizes only, no manifest digest) with a garbage shard of the right size: DCP's
    CheckpointException -- a BaseException, which `except Exception` missed -- becomes one line, exit code 2."""
    root = fresh(trained, tmp_path)
    shutil.rmtree(root / "step-00000004")
    d = root / "step-00000002"
    manifest = json.loads((d / "partita.json").read_text())
    manifest["files"] = {name: entry["bytes"] for name, entry in manifest["files"].items()}
    manifest.pop("manifest_sidecar")  # nor the manifest's digest beside the directory (issue 47 item 6)
    ckpt.sidecar(d).unlink()
    (d / "partita.json").write_text(json.dumps(manifest))
    (d / "__0_0.distcp").write_bytes(b"\x00" * (d / "__0_0.distcp").stat().st_size)
    proc = entry_point(tmp_path, "--steps", "4", "--checkpoint-dir", str(root), "--resume")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"partita: error: loading checkpoint {d} failed (rank 0: "), lines
    assert "Traceback" not in proc.stderr


def test_a_save_that_fails_is_one_line_naming_the_intact_checkpoint(trained, tmp_path):
    """Writing a checkpoint fails part way (the file size limit stands in for a full disk: the kernel refuses the
    write, DCP raises its CheckpointException): one line, exit code 2, the previous checkpoint intact."""
    root = fresh(trained, tmp_path)
    shutil.rmtree(root / "step-00000004")
    limit = (root / "step-00000002" / "__0_0.distcp").stat().st_size // 2

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG instead of killing us
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = entry_point(tmp_path, "--steps", "4", "--checkpoint-dir", str(root), "--checkpoint-every", "2",
                       "--resume", preexec_fn=small_files)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("partita: error: saving the checkpoint of step 4 to ") and "File too large" in lines[0]
    assert lines[0].endswith(f"the newest checkpoint, {root / 'step-00000002'}, is intact")
    assert [p.name for p in ckpt.steps(root)] == ["step-00000002"] and not ckpt.incomplete(root)


def test_an_unwritable_checkpoint_dir_fails_before_the_first_step(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(CheckpointError, match="cannot write checkpoints to .*file/ck: .*choose a writable"):
        prepare(Plan.from_dict(PLAN), resolve_model("tiny-gpt"),
                RunOptions(steps=2, checkpoint_dir=str(tmp_path / "file" / "ck"), checkpoint_every=1), 1)


def test_a_fresh_run_refuses_another_runs_directory(trained, tmp_path):
    root = fresh(trained, tmp_path)
    owner = ownership.owner_run_id(root)
    with pytest.raises(CheckpointError, match=f"already holds run {owner}'s checkpoints \\(newest step-00000004\\); "
                                              "a new run does not overwrite them: continue that run with --resume"):
        run(2, root, checkpoint_every=1)
    assert [p.name for p in ckpt.steps(root)] == ["step-00000002", "step-00000004"]
    resumed = run(6, root, checkpoint_every=2, resume=True)  # told to continue: it takes the run over
    assert resumed.run_id == owner and ckpt.open_checkpoint(root / "step-00000006").manifest["run_id"] == owner


def test_two_runs_cannot_share_a_directory(trained, tmp_path):
    """Another run holds the directory's lock (taken here as a live run takes it): a run into it stops before
    its first step, and so does the one-process pre-flight `partita run` does before launching."""
    root = fresh(trained, tmp_path)
    run_id, fd = ownership.claim(root, continuing=True)
    try:
        with pytest.raises(CheckpointError, match=f"is in use by another run \\(run {run_id}, pid \\d+ on "):
            run(6, root, checkpoint_every=1, resume=True)
        proc = entry_point(tmp_path, "--steps", "6", "--checkpoint-dir", str(root), "--checkpoint-every", "1",
                           "--resume", "--check")
        assert proc.returncode == 2 and "is in use by another run" in proc.stderr, proc.stderr
    finally:
        ownership.release(fd)
    assert [p.name for p in ckpt.steps(root)] == ["step-00000002", "step-00000004"]


def test_a_restart_resumes_only_its_own_runs_steps(trained, tmp_path, monkeypatch):
    """A newer step written by another run (its manifest's run id) is passed over by a torchrun restart
    (TORCHELASTIC_RESTART_COUNT 1), which resumes from its own run's newest step."""
    root = fresh(trained, tmp_path)
    shutil.copytree(root / "step-00000004", root / "step-00000005")
    manifest = json.loads((root / "step-00000005" / "partita.json").read_text())
    manifest.update(step=5, run_id="0therrun0000", manifest_sidecar=".partita-digests/step-00000005.sha256")
    (root / "step-00000005" / "partita.json").write_text(json.dumps(manifest))
    ckpt.sidecar(root / "step-00000005").write_text(  # as the other run saved it, its manifest's digest beside it
        ckpt.manifest_digest((root / "step-00000005" / "partita.json").read_bytes()))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    result = run(6, root, checkpoint_every=2)
    assert result.resumed_from == str(root / "step-00000004") and result.losses == trained[0].losses[4:]
    assert any(f"{root / 'step-00000005'} was written by run 0therrun0000, not by run" in n for n in result.notes)


def test_keep_prunes_the_runs_older_checkpoints(tmp_path):
    result = run(5, tmp_path / "ck", checkpoint_every=1, keep=2)
    assert [p.name for p in ckpt.steps(tmp_path / "ck")] == ["step-00000004", "step-00000005"]
    assert len(result.checkpoints) == 5


def test_a_nan_keeps_the_loss_history_and_names_the_weights_that_gave_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PARTITA_FAULT", "nan,step=4")
    out = tmp_path / "losses.json"
    with pytest.raises(NonFiniteLoss, match="the newest checkpoint, .*step-00000003, holds the weights step 4 started "
                                            "from; the one before it is .*step-00000002"):
        runtime.run(PLAN, "tiny-gpt", steps=6, checkpoint_dir=tmp_path / "ck", checkpoint_every=1, losses_out=out)
    saved = json.loads(out.read_text())
    assert len(saved["losses"]) == 3 and saved["exit_code"] == 3 and saved["failure"].startswith("loss is nan at step 4")
    table = capsys.readouterr().out
    assert "step  loss" in table and f"   3  {saved['losses'][2]:.8f}" in table


def test_an_update_to_infinite_weights_is_never_saved(tmp_path, monkeypatch):
    """Step 3's update leaves an infinite weight (PARTITA_FAULT inf: as an update past float32's range does)
    although its loss was finite: the run stops before saving it and names step 2's checkpoint as good."""
    monkeypatch.setenv("PARTITA_FAULT", "inf,step=3")
    with pytest.raises(NonFiniteParameters, match="parameters are not finite after the optimizer update of step 3 "
                                                  ".*training stopped without saving them; the last good checkpoint "
                                                  "is .*step-00000002"):
        run(4, tmp_path / "ck", checkpoint_every=1)
    assert [p.name for p in ckpt.steps(tmp_path / "ck")] == ["step-00000001", "step-00000002"]
    monkeypatch.setenv("PARTITA_FAULT", "inf,step=2")  # no checkpoint at all: the end of training checks too
    with pytest.raises(NonFiniteParameters, match="update of step 2 .*; no checkpoint was saved"):
        run(2, None)


def test_sigterm_stops_at_a_step_boundary_and_the_resume_is_exact(trained, tmp_path, monkeypatch):
    """SIGTERM during step 3 (PARTITA_FAULT sends it): the step finishes, a checkpoint is saved although the
    run checkpoints only every 10 steps, and --resume continues with the losses of the uninterrupted run, bit
    for bit."""
    root = tmp_path / "ck"
    monkeypatch.setenv("PARTITA_FAULT", "sigterm,rank=0,step=3")
    with pytest.raises(Stopped, match=f"stopped by SIGTERM after step 3 of 6; resume from {root / 'step-00000003'}"):
        run(6, root, checkpoint_every=10)
    monkeypatch.delenv("PARTITA_FAULT")
    assert [p.name for p in ckpt.steps(root)] == ["step-00000003"]
    resumed = run(6, root, resume=True)
    assert resumed.first_step == 3 and resumed.losses == trained[0].losses[3:]


def test_sigterm_to_the_entry_point_is_one_line_and_exit_code_143(tmp_path):
    root, out = tmp_path / "ck", tmp_path / "out.json"
    proc = entry_point(tmp_path, "--steps", "6", "--checkpoint-dir", str(root), "--checkpoint-every", "10",
                       "--losses-out", str(out), env={"PARTITA_FAULT": "sigterm,rank=0,step=3"})
    assert proc.returncode == 143, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (f"partita: stopped by SIGTERM after step 3 of 6; resume from "
                                                    f"{root / 'step-00000003'} with --resume")
    assert "Traceback" not in proc.stderr
    saved = json.loads(out.read_text())
    assert len(saved["losses"]) == 3 and saved["exit_code"] == 143


def test_the_python_api_raises_stopped_and_puts_the_callers_handlers_back(tmp_path, monkeypatch):
    def mine(signum, frame):
        raise AssertionError("the caller's handler ran")
    previous = signal.signal(signal.SIGINT, mine)
    try:
        monkeypatch.setenv("PARTITA_FAULT", "sigint,rank=0,step=2")
        with pytest.raises(Stopped, match="stopped by SIGINT after step 2 of 4; no checkpoint was saved") as e:
            run(4, None)
        assert e.value.exit_code == 130 and signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_collective_lost_under_dcp_is_a_restartable_failure_and_dcps_own_failure_is_one_line():
    """A rank lost mid-save fails DCP's collectives with gloo's RuntimeError: raised as it is (torchrun restarts
    the workers, an elastic job re-plans) rather than a CheckpointError that ends the job; DCP's own
    CheckpointException (a write that failed on some rank) stays one CheckpointError line."""
    from torch.distributed.checkpoint.api import CheckpointException

    from partita.runtime.checkpoint.saving import _dcp

    def lost():
        raise RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:24490")

    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        _dcp(lost, "saving the checkpoint of step 4")

    def full():
        raise CheckpointException("write", {1: (OSError(27, "File too large"), None)})

    with pytest.raises(CheckpointError, match=r"^saving the checkpoint of step 4 failed \(rank 1: OSError: .*File too large"):
        _dcp(full, "saving the checkpoint of step 4")

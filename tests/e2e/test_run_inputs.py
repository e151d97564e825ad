"""What a run is given is checked before it trains (issue 47 items 8, 10 and 12): one line, exit code 2, nothing
launched, nothing lost.

- Item 8: output paths. `--losses-out` into a missing directory trained the whole run and then lost its history
  in a traceback; `--losses-out plan.json` overwrote the plan; a bad `--tensorboard` path was a 35-line
  traceback. Now each is refused before the pre-flight starts (runtime.launcher.inputs), and the runtime's own
  entry points (runtime.train, the API's prepare) refuse the same.
- Item 10: `RANK=3 WORLD_SIZE=8 partita run ...` exited 2 with no output: its pre-flight took the variables for
  its own place in a job, refused the plan as rank 3, and only rank 0 reports. A launcher started with a
  worker's variables now says so.
- Item 12: sizes each in range but absurd -- a global batch of 2e8, seq_len 2^31-1, 2^20 micro-batches -- are
  refused by the pre-flight with the field and the bound (runtime.launcher.sizes) instead of an allocator traceback or
  a step that never ends; `--lr nan`, `--lr -1` and `--seed 2^64` are refused before launch instead of
  failing in every worker, and every seed torch.manual_seed takes now trains.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from partita.costmodel import PartitaError, resolve_model
from partita import cli
from partita.planner.plan import Plan, PlanError
from partita.runtime import train
from partita.runtime.data import SyntheticTokens, derived_seed
from partita.runtime.loop.session import RunOptions, at_seq_len, prepare
from partita.runtime.launcher.sizes import MAX_MICROBATCHES
from partita.runtime.failure.stop import StopSignal
from test_plans_match_single_process import ROOT, _env, make_plan

LLAMA = "llama:layers=2,hidden=64,heads=4,kv_heads=4,ffn=128,vocab=256,seq=32"
"""A model without learned positions: its fingerprint does not depend on the sequence length, so a plan's
seq_len alone can be absurd."""


@pytest.fixture
def plan_file(tmp_path) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(make_plan(dp=2)))
    return path


@pytest.fixture
def no_launch(monkeypatch):
    """`partita run` must refuse before it starts its pre-flight (a process) or the launcher."""
    def launched(*a, **k):
        raise AssertionError(f"started a process: {a[0] if a else k}")
    monkeypatch.setattr(subprocess, "run", launched)
    monkeypatch.setattr(cli, "run_forwarding_signals", launched)


def one_line(argv, capsys) -> str:
    assert cli.main(argv) == 2, argv
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("partita: error: "), captured.err
    return lines[0]


def run_args(plan: Path, *more: str) -> list[str]:
    return ["run", str(plan), "--model", "tiny-gpt", "--steps", "1", *more]


# ---- item 8: outputs -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags, needle", [
    (lambda d: ["--losses-out", str(d / "missing" / "losses.json")], "its directory '{d}/missing' does not exist"),
    (lambda d: ["--losses-out", str(d / "plan.json")], "is the plan this run reads"),
    (lambda d: ["--losses-out", str(d)], "is a directory; give a file path"),
    (lambda d: ["--losses-out", str(d / "tokens.npy"), "--data", str(d / "tokens.npy")], "is the --data file this run"),
    (lambda d: ["--tensorboard", str(d / "plan.json" / "tb")], "cannot be created: '{d}/plan.json' is a file"),
    (lambda d: ["--tensorboard", str(d / "notes.txt")], "is a file, not a directory"),
    (lambda d: ["--losses-out", str(d / "x"), "--tensorboard", str(d / "x")], "name the same path"),
    (lambda d: ["--profile-out", str(d / "plan.json")], "--profile-out '{d}/plan.json' is the plan this run reads"),
    (lambda d: ["--losses-out", str(d / "x"), "--profile-out", str(d / "x")], "--profile-out name the same file"),
])
def test_outputs_are_checked_before_anything_runs(plan_file, no_launch, capsys, flags, needle):
    d = plan_file.parent
    (d / "notes.txt").write_text("mine\n")
    import numpy as np
    np.save(d / "tokens.npy", np.arange(1000, dtype=np.int64) % 256)
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
    line = one_line(run_args(plan_file, *flags(d)), capsys)
    assert needle.format(d=d) in line, line
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()} == before  # nothing overwritten or left
    assert not (d / "x").exists()


def test_the_runtime_entry_points_check_outputs_too(plan_file, tmp_path):
    """runtime.train (what `partita export --to slurm` scripts start) and the Python API refuse the same paths."""
    args = train.build_parser().parse_args([str(plan_file), "--model", "tiny-gpt", "--losses-out", str(plan_file)])
    assert train.argument_errors(args)[0].startswith(f"--losses-out {str(plan_file)!r} is the plan this run reads")
    plan = Plan.from_dict(make_plan())
    spec = at_seq_len(resolve_model("tiny-gpt"), plan.train["seq_len"])
    with pytest.raises(PartitaError, match="does not exist; create it first"):
        prepare(plan, spec, RunOptions(steps=1, losses_out=str(tmp_path / "no" / "l.json")), 1)


# ---- item 10: a worker's environment -----------------------------------------------------------------------

def test_a_job_environment_is_one_line_not_a_silent_exit(plan_file):
    """Through the real CLI and its real pre-flight process: before, rc 2 and nothing on stderr."""
    env = {**_env(), "RANK": "3", "WORLD_SIZE": "8"}
    r = subprocess.run([sys.executable, "-m", "partita.cli", *run_args(plan_file)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("partita: error: RANK=3, WORLD_SIZE=8 are set"), r.stderr
    assert "unset RANK and WORLD_SIZE" in lines[0]


def test_the_launcher_and_its_preflight_say_it_too(plan_file, monkeypatch, capsys):
    """runtime.train with launcher flags (what partita run and SLURM scripts start): its --check ran as rank 3 of
    8 and said nothing."""
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    try:
        code = train.main([str(plan_file), "--model", "tiny-gpt", "--steps", "1", "--nproc-per-node", "2", "--check"])
    finally:
        if StopSignal.current is not None:
            StopSignal.current.restore()
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("partita: error: RANK=3, WORLD_SIZE=8 are set"), err


def test_a_worker_without_launcher_flags_still_reads_its_environment(plan_file, monkeypatch, capsys):
    """runtime.train as an env:// worker (no launcher flags) is what RANK and WORLD_SIZE are for: not refused."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    try:
        code = train.main([str(plan_file), "--model", "tiny-gpt", "--steps", "1", "--check"])
    finally:
        if StopSignal.current is not None:
            StopSignal.current.restore()
    assert code == 0, capsys.readouterr().err
    assert "fits --model tiny-gpt on 2 rank(s)" in capsys.readouterr().out


# ---- item 12: sizes, learning rate, seed -------------------------------------------------------------------

def _absurd(edit, model: str = "tiny-gpt") -> tuple[Plan, object]:
    d = make_plan(model)
    edit(d)
    plan = Plan.from_dict(d)  # in range: the loader lets it through
    return plan, at_seq_len(resolve_model(model), plan.train.get("seq_len"))


def _batch(d: dict, micro: int, size: int) -> None:
    d["schedule"].update(num_microbatches=micro, micro_batch_size=size)
    d["train"]["global_batch"] = micro * size


@pytest.mark.parametrize("edit, model, fields", [
    (lambda d: _batch(d, 1, 200_000_000), "tiny-gpt", ("train.global_batch", "schedule.micro_batch_size")),
    (lambda d: _batch(d, 100_000_000, 2), "tiny-gpt", ("train.global_batch", "schedule.num_microbatches")),
    (lambda d: _batch(d, 2**20, 2), "tiny-gpt", ("schedule.num_microbatches", "train.global_batch")),
    (lambda d: d["train"].update(seq_len=2**31 - 1), LLAMA, ("train.seq_len",)),
])
def test_absurd_sizes_are_one_line_from_the_preflight(edit, model, fields):
    """session.prepare is what `partita run`'s pre-flight (runtime.train --check) and every worker run first.
    Which bound a size meets first depends on this host's memory; each names its field."""
    plan, spec = _absurd(edit, model)
    with pytest.raises(PlanError) as e:
        prepare(plan, spec, RunOptions(steps=1), 1)
    assert any(f in str(e.value) for f in fields), str(e.value)
    assert "\n" not in str(e.value)


def test_a_plan_offloading_more_than_this_host_holds_is_one_line(monkeypatch):
    """A plan made for a preset's host memory (256 GB per H200) on a machine with less: refused before launch,
    where the H200 run paged for minutes. The bound is the ranks of this host times the largest stage's bytes."""
    from partita.runtime.launcher import sizes
    def plan_on(ranks: int) -> Plan:
        d = make_plan(dp=ranks)
        d["predicted"].update(host_memory_per_stage=[100 * 2**30])
        return Plan.from_dict(d)
    spec = at_seq_len(resolve_model("tiny-gpt"), plan_on(1).train.get("seq_len"))
    monkeypatch.setattr(sizes, "host_memory", lambda: 128 * 2**30)
    prepare(plan_on(1), spec, RunOptions(steps=1), 1)  # 100 GiB on a 128 GiB host runs
    plan = plan_on(2)
    with pytest.raises(PlanError, match=r"^predicted.host_memory_per_stage: a rank keeps up to 100.0 GiB in host "
                                        r"memory .* and 2 rank\(s\) share this host's 128.0 GiB: re-plan"):
        prepare(plan, spec, RunOptions(steps=1), 2)


def test_the_microbatch_bound_is_the_one_said(tmp_path, monkeypatch):
    plan, spec = _absurd(lambda d: _batch(d, MAX_MICROBATCHES + 1, 1))
    with pytest.raises(PlanError, match=rf"^schedule.num_microbatches is {MAX_MICROBATCHES + 1:,}, more than the "
                                        rf"{MAX_MICROBATCHES:,} micro-batches partita runs in a step"):
        prepare(plan, spec, RunOptions(steps=1), 1)
    plan, spec = _absurd(lambda d: _batch(d, MAX_MICROBATCHES, 1))
    prepare(plan, spec, RunOptions(steps=1), 1)  # the bound itself runs


def test_2_to_the_20_microbatches_through_partita_run(tmp_path):
    """The whole path, with its real pre-flight process: one line and exit 2 where the run used to sit in its first
    step for more than an hour."""
    d = make_plan()
    _batch(d, 2**20, 2)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    r = subprocess.run([sys.executable, "-m", "partita.cli", *run_args(path)], cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stderr.strip().startswith("partita: error: schedule.num_microbatches is 1,048,576"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""


@pytest.mark.parametrize("flags, needle", [
    (["--lr", "nan"], "--lr must be a finite number above 0, got nan"),
    (["--lr", "-1"], "--lr must be a finite number above 0, got -1.0"),
    (["--lr", "inf"], "--lr must be a finite number above 0, got inf"),
    (["--seed", str(2**64)], "--seed must be a whole number from -2^63 to 2^64-1 (what torch.manual_seed takes)"),
    (["--seed", str(-2**63 - 1)], "--seed must be a whole number from -2^63 to 2^64-1"),
])
def test_lr_and_seed_are_checked_before_launch(plan_file, no_launch, capsys, flags, needle):
    assert needle in one_line(run_args(plan_file, *flags), capsys)
    args = train.build_parser().parse_args([str(plan_file), "--model", "tiny-gpt", *flags])
    assert needle in train.argument_errors(args)[0]  # runtime.train and runtime.api.launch


def test_the_api_refuses_a_nan_learning_rate():
    plan = Plan.from_dict(make_plan())
    spec = at_seq_len(resolve_model("tiny-gpt"), plan.train["seq_len"])
    with pytest.raises(PartitaError, match="--lr must be a finite number above 0, got nan"):
        prepare(plan, spec, RunOptions(steps=1, lr=math.nan), 1)


@pytest.mark.parametrize("seed", [2**64 - 1, 2**63, -2**63, 10**13 * 2])
def test_every_seed_torch_takes_draws_batches(seed):
    """Synthetic batches seed their generator with seed x 1,000,003 + step: from 2^64 / 1,000,003 on that
    overflowed torch.manual_seed in every worker. Taken modulo 2^64 (what torch does with a negative seed), every
    seed trains, and the seeds that worked draw what they drew."""
    data = SyntheticTokens(resolve_model("tiny-gpt"), 4, seed)
    assert data.rows(5, 0, 4)[0].shape == (4, 32)
    assert derived_seed(7, 3) == 7 * 1_000_003 + 3
    assert torch.Generator().manual_seed(-1 * 1_000_003 + 3).initial_seed() == derived_seed(-1, 3)


def test_the_gpu_bound_sets_the_allocator_before_cuda_starts(monkeypatch):
    """On a GPU the micro-batch bound asks CUDA for the device's memory, which initialises CUDA in the pre-flight
    and in each worker before runtime.launcher.mesh.select_device would; the allocator reads its configuration then
    (runtime.loop.allocator), so it is set first. (This machine has no GPU: torch.cuda's answers are stood in.)"""
    from types import SimpleNamespace

    from partita.runtime.loop import allocator

    from partita.runtime.launcher import sizes
    seen = {}
    for name in allocator.NAMES:  # set, then removed: monkeypatch then also removes what the test's run sets
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)

    def properties(index):
        seen.update(index=index, conf=os.environ.get(allocator.ENV))
        return SimpleNamespace(total_memory=141 * 2**30, name="H200")
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    assert sizes.device_memory(8) == (141 * 2**30, "a H200's 141.0 GiB")
    assert seen == {"index": 3, "conf": allocator.SETTING}

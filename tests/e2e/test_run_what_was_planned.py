"""`partita plan` then `partita run` with the same MODEL string, as a new user does (issue 12):

- the run builds the model at the plan's sequence length (`plan --seq 32` for a model whose default is 64),
  for gpt:/llama: strings, presets and hf: models;
- a `package.module:factory` token model (tests/partita_factories.py) plans and trains with no glue, and one
  that states its vocabulary nowhere is one line;
- a plan priced for GPUs says so in one line before it trains on CPU processes.

`partita plan` in the test's process, and the plan's 2 gloo ranks as `partita run` runs them (tests/rank_pool.py).
"""
from __future__ import annotations

from pathlib import Path

import pytest
from rank_pool import cli, run_plan

from partita.planner.plan import Plan
from partita.runtime.loop.session import device_note

ROOT = Path(__file__).resolve().parents[2]
NOTE = "note: this plan was made for"


def plan_and_run(tmp_path: Path, model: str, plan_flags=(), run_flags=("--steps", "1")):
    """(plan's end, run's end, plan file): `partita plan` in this process, then the plan's ranks as `partita run`
    runs them (tests/rank_pool.py)."""
    out = tmp_path / "plan.json"
    planned = cli("plan", "--model", model, "--cluster", "2xcpu", "--global-batch", "4", *plan_flags,
                  "--out", str(out), cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr[-2000:]
    return planned, run_plan(out, model, *run_flags, cwd=tmp_path), out


@pytest.mark.parametrize("model", [
    "gpt:layers=2,hidden=64,heads=4,vocab=128,seq=64",  # learned positions: 64 rows by the string, 32 planned
    "tiny-llama",                                        # a preset (default seq 32), planned at 16
    pytest.param("hf:gpt2:n_layer=2,n_embd=64,n_head=4", marks=pytest.mark.skipif(
        __import__("importlib").util.find_spec("transformers") is None, reason="transformers not installed")),
])
def test_a_plan_at_a_shorter_seq_runs_with_the_same_model_string(tmp_path, model):
    seq = 16 if model == "tiny-llama" else 32
    _, run, out = plan_and_run(tmp_path, model, ("--seq", str(seq)))
    assert Plan.load(out).train["seq_len"] == seq
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert f"global batch 4 x {seq} tokens" in run.stdout, run.stdout
    assert NOTE not in run.stdout  # a cpu plan on cpu processes


@pytest.mark.parametrize("factory, layout", [("token_lm", ()), ("token_lm", ("--pp", "2")), ("token_lm", ("--tp", "2")),
                                             ("tied_lm", ())], ids=["searched", "pp2", "tp2", "tied-config-vocab"])
def test_a_factory_token_model_plans_and_runs_under_verify(tmp_path, factory, layout):
    model = f"partita_factories:{factory}"
    _, run, out = plan_and_run(tmp_path, model, layout, ("--steps", "2", "--verify"))
    plan = Plan.load(out)
    assert plan.train["seq_len"] == 16  # the factory's example input: one [batch, 16] integer tensor
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "global batch 4 x 16 tokens (synthetic data)" in run.stdout and "verify: OK" in run.stdout, run.stdout
    if layout:
        assert getattr(plan.mesh, layout[0][2:]) == 2


def test_a_factory_without_a_vocabulary_is_one_line(tmp_path):
    model = "partita_factories:tied_lm_without_vocab"
    planned, run, _ = plan_and_run(tmp_path, model)
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("partita: error: "), run.stderr
    assert "model.config.vocab_size" in lines[0] and "vocab_size attribute" in lines[0], lines
    assert "no loss_fn" in lines[0]


def test_a_gpu_plan_says_so_before_it_trains_on_cpu_processes(tmp_path):
    out = tmp_path / "a100.json"
    planned = cli("plan", "--model", "tiny-gpt", "--cluster", "2xA100-80GB", "--global-batch", "4",
                  "--dtype", "fp32", "--out", str(out), cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr[-2000:]
    run = run_plan(out, "tiny-gpt", "--steps", "1", cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    lines = run.stdout.splitlines()
    note = ("note: this plan was made for 2 x A100-80GB; running it on 2 CPU process(es) (gloo): its predicted "
            "step time does not apply here")
    assert note in lines, run.stdout
    header = next(i for i, line in enumerate(lines) if line.startswith("partita run: "))
    assert lines.index(note) < header  # said before training, not only in the report after it


def test_the_device_note_compares_device_kinds(tmp_path):
    import torch
    gpu = {"spec": "8xA100-80GB", "num_devices": 8, "devices_per_node": 8, "device": "A100-80GB"}
    cpu = {"spec": "8xcpu", "num_devices": 8, "devices_per_node": 8, "device": "cpu"}

    class _Plan:  # only what device_note reads
        def __init__(self, cluster):
            self.cluster, self.mesh = cluster, type("M", (), {"world_size": 8})()
    here = torch.device("cpu")
    assert device_note(_Plan(gpu), 8, here) == ("note: this plan was made for 8 x A100-80GB; running it on 8 CPU "
                                               "process(es) (gloo): its predicted step time does not apply here")
    assert device_note(_Plan(cpu), 8, here) is None
    assert device_note(_Plan({}), 8, here) is None  # a hand-written plan without a device says nothing


def test_the_python_api_builds_a_model_string_at_the_plans_seq():
    """partita.runtime.run's model resolution (runtime.api.model_spec with the plan's seq_len): the MODEL string's own
    length gives way to the plan's, and a user's model_fn keeps its module with the plan's batches."""
    from partita.runtime.api import model_spec
    string = "gpt:layers=2,hidden=64,heads=4,vocab=128,seq=64"
    spec = model_spec(string, seq_len=32)
    assert spec.seq_len == 32 and spec.tokens(2).shape == (2, 33)
    assert model_spec(string).seq_len == 64

    def model_fn():
        raise AssertionError("not built here")
    own = model_spec(model_fn, string, seq_len=32)
    assert own.seq_len == 32 and own.build is model_fn


def test_a_batchnorm_over_the_batch_alone_plans_with_two_samples_per_micro_batch_and_verifies(tmp_path):
    """BatchNorm1d after a Linear (#46 item 2) used to be a 60-line capture traceback. It plans: the capture
    computes it with running statistics for its one sample, and the plan keeps at least 2 samples per
    micro-batch (here 4 samples over 2 ranks: 2 each, never 2 x 1), which trains like one process."""
    planned, run, out = plan_and_run(tmp_path, "partita_factories:batchnorm_mlp",
                                     run_flags=("--steps", "3", "--verify", "--sync-batchnorm"))
    plan = Plan.load(out)
    assert plan.schedule.micro_batch_size >= 2 and plan.mesh.dp * plan.schedule.micro_batch_size \
        * plan.schedule.num_microbatches == 4
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "verify: OK" in run.stdout
    fixed = cli("plan", "--model", "partita_factories:batchnorm_mlp", "--cluster", "2xcpu", "--global-batch", "4",
                "--micro-batch", "1", cwd=tmp_path)
    assert fixed.returncode == 2 and fixed.stderr.strip().endswith(
        "a micro-batch needs at least 2 samples; micro-batch 1 is fixed: fix 2 or more"), fixed.stderr

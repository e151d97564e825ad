"""The training recipe and the weights out (issue 46), on real 2-rank gloo runs (tests/rank_pool.py).

- dp=2 with weight decay, warm-up, cosine decay and clipping passes --verify: the reference in one process trains
  with the same recipe; the learning rates recorded per step are the schedule's, and the global gradient norms
  equal the reference's (clipping is active: the norms are above the threshold).
- A pp=2 plan with clipping passes --verify: the norms recorded (the stages' squared norms summed over the pp
  group) equal one process's within 1e-4 relative; a stage's own norm alone is 41% off (measured).
- A run resumed mid-schedule from a DCP checkpoint equals the uninterrupted run bit for bit: losses, learning
  rates, grad norms and the parameter checksum.
- --save-final on dp=2 and on pp=2 writes one plain state dict that the model built by the same MODEL string
  loads strictly in one process, with the run's parameters (its checksum equals the run's).
- Bad recipe values are one line, exit 2, before launch.
"""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from rank_pool import run_plan
from test_plans_match_single_process import make_plan

from partita.costmodel.models import resolve_model
from partita.runtime.loop.recipe import Recipe
from partita.runtime.loop.session import at_seq_len

ROOT = Path(__file__).resolve().parents[2]
STEPS, CLIP, LR = 6, 0.5, 3e-3
RECIPE = ["--lr", str(LR), "--weight-decay", "0.1", "--warmup-steps", "2", "--lr-decay", "cosine",
          "--min-lr-ratio", "0.1", "--clip-grad-norm", str(CLIP), "--log-every", "0"]


def _plan(tmp_path: Path, name: str, **mesh) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(make_plan(**mesh)))
    return path


def _run(tmp_path: Path, plan: Path, name: str, *flags: str) -> dict:
    out = tmp_path / f"{name}.losses.json"
    done = run_plan(plan, "tiny-gpt", "--steps", str(STEPS), *RECIPE, "--losses-out", str(out), *flags, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {**json.loads(out.read_text()), "stdout": done.stdout}


def _schedule() -> list[float]:
    recipe = Recipe(lr=LR, steps=STEPS, warmup_steps=2, lr_decay="cosine", min_lr_ratio=0.1)
    return [LR * recipe.lr_factor(i) for i in range(STEPS)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("recipe")
    dp, pp = _plan(tmp, "dp2", dp=2), _plan(tmp, "pp2", pp=2, micro=2)
    ck = tmp / "ck"
    out = {"dp": _run(tmp, dp, "dp", "--verify", "--save-final", str(tmp / "dp.pt"), "--checkpoint-dir", str(ck),
                      "--checkpoint-every", "3"),
           "pp": _run(tmp, pp, "pp", "--verify", "--save-final", str(tmp / "pp.pt"))}
    # resume mid-schedule: drop the step-6 checkpoint, continue the same 6-step run from step 3
    shutil.rmtree(ck / "step-00000006")
    (ck / ".partita-digests" / "step-00000006.sha256").unlink(missing_ok=True)
    out["resumed"] = _run(tmp, dp, "resumed", "--checkpoint-dir", str(ck), "--resume")
    out["manifest"] = json.loads((ck / "step-00000003" / "partita.json").read_text())
    # and once more from step 3 with another peak lr: said before training, then followed
    out["relr"] = _run(tmp, dp, "relr", "--checkpoint-dir", str(ck), "--resume", "--lr", str(LR / 3))
    out["tmp"] = tmp
    return out


@pytest.mark.parametrize("layout", ["dp", "pp"])
def test_the_recipe_passes_verify_with_the_schedules_lrs_and_the_reference_norms(runs, layout):
    r = runs[layout]
    assert r["verified"] is True and all(c["passed"] for c in r["checks"]), r["checks"]
    assert "recipe: AdamW lr 0.003, weight decay 0.1 (matrices only), warm-up 2 steps, cosine decay to 0.1 x lr " \
           "at step 6, grad norm clipped at 0.5" in r["stdout"]
    assert r["learning_rates"] == pytest.approx(_schedule(), rel=1e-12)
    assert r["learning_rates"][0] == pytest.approx(LR / 3) and r["learning_rates"][-1] == pytest.approx(LR / 10)
    norms, ref = r["grad_norms"], r["reference_grad_norms"]
    assert len(norms) == STEPS and all(n > CLIP for n in norms), norms  # clipping acts at every step
    worst = max(abs(a - b) / b for a, b in zip(norms, ref))
    print(f"{layout}: grad norms {norms}, largest relative difference from the reference {worst:.1e}")
    assert worst < 1e-4, (norms, ref)
    assert any(c["what"] == "grad norms before clipping" and c["passed"] for c in r["checks"])


def test_the_pipelines_norms_are_the_whole_models(runs):
    """The pp run's norms are the whole model's, as the dp run's reference computes them. Measured with the pp
    all-reduce left out (each rank clipping by its own stage's norm): 41% off at step 6, and --verify failed on
    the grad norms, the losses (6.4e-4) and the parameters (3.5e-2)."""
    norms, ref = runs["pp"]["grad_norms"], runs["dp"]["reference_grad_norms"]
    assert norms == pytest.approx(ref, rel=1e-4)  # same model, batches and recipe: the same reference


def test_the_checkpoint_keeps_the_recipe_and_a_resume_under_another_says_so(runs):
    assert runs["manifest"]["recipe"] == Recipe(lr=LR, steps=STEPS, weight_decay=0.1, warmup_steps=2, lr_decay="cosine",
                                                 min_lr_ratio=0.1, clip_grad_norm=CLIP).record()
    assert "training recipe differs" not in runs["resumed"]["stdout"]
    note = next(line for line in runs["relr"]["stdout"].splitlines() if "training recipe differs" in line)
    assert f"lr {LR} -> {LR / 3}" in note and "step-00000003" in note
    assert runs["relr"]["learning_rates"] == pytest.approx([x / 3 for x in _schedule()[3:]])


def test_recipe_changes_name_the_fields_and_steps_only_where_a_decay_ends_there():
    was = Recipe(lr=1e-3, steps=10).record()
    assert Recipe(lr=1e-3, steps=20).changes_since(was) == []  # a constant lr does not depend on the last step
    assert Recipe(lr=1e-3, steps=20, lr_decay="cosine").changes_since(was) == ["steps 10 -> 20", "lr-decay none -> cosine"]
    assert Recipe(lr=1e-3, steps=10, clip_grad_norm=1.0).changes_since(was) == ["clip-grad-norm None -> 1.0"]
    assert Recipe().changes_since(None) == []  # a checkpoint written before recipes were recorded


def test_a_resume_mid_schedule_is_bit_exact(runs):
    straight, resumed = runs["dp"], runs["resumed"]
    assert resumed["first_step"] == 3
    assert resumed["losses"] == straight["losses"][3:]
    assert resumed["learning_rates"] == straight["learning_rates"][3:]
    assert resumed["grad_norms"] == straight["grad_norms"][3:]
    assert resumed["param_checksum"] == straight["param_checksum"]


@pytest.mark.parametrize("layout", ["dp", "pp"])
def test_the_final_weights_load_into_one_process(runs, layout):
    r = runs[layout]
    spec = at_seq_len(resolve_model("tiny-gpt"), make_plan()["train"]["seq_len"])
    model = spec.build().float()
    state = torch.load(runs["tmp"] / f"{layout}.pt", weights_only=True)
    assert all(type(v) is torch.Tensor for v in state.values())  # no DTensor, no wrapper
    assert not any("_orig_mod" in k or "module." in k[:7] for k in state)
    model.load_state_dict(state)  # strict: every name present, none extra
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    assert math.isclose(checksum, r["param_checksum"], rel_tol=1e-9), (checksum, r["param_checksum"])
    assert r["saved_final"] and "final weights:" in r["stdout"]


@pytest.mark.parametrize("flags, needle", [
    (["--weight-decay", "-0.1"], "--weight-decay must be a finite number >= 0, got -0.1"),
    (["--clip-grad-norm", "0"], "--clip-grad-norm must be a finite number above 0, got 0.0"),
    (["--clip-grad-norm", "nan"], "--clip-grad-norm must be a finite number above 0, got nan"),
    (["--min-lr-ratio", "1.5"], "--min-lr-ratio must be a number from 0 to 1, got 1.5"),
    (["--warmup-steps", "-1"], "--warmup-steps must be a whole number >= 0, got -1"),
])
def test_bad_recipe_values_are_one_line_before_launch(tmp_path, monkeypatch, capsys, flags, needle):
    from partita import cli
    from partita.runtime import train

    def launched(*a, **k):
        raise AssertionError("started a process")
    monkeypatch.setattr(cli, "run_forwarding_signals", launched)
    plan = _plan(tmp_path, "p", dp=2)
    assert cli.main(["run", str(plan), "--model", "tiny-gpt", "--steps", "1", *flags]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], lines
    args = train.build_parser().parse_args([str(plan), "--model", "tiny-gpt", *flags])
    assert needle in train.argument_errors(args)[0]  # runtime.train and runtime.api.launch say the same


def test_save_final_is_checked_before_launch(tmp_path, monkeypatch, capsys):
    from partita import cli
    monkeypatch.setattr(cli, "run_forwarding_signals", lambda *a, **k: pytest.fail("started a process"))
    plan = _plan(tmp_path, "p", dp=2)
    assert cli.main(["run", str(plan), "--model", "tiny-gpt", "--save-final", str(tmp_path / "no" / "w.pt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--save-final" in err and "does not exist" in err, err


def test_a_warmup_longer_than_the_run_is_allowed_with_a_note():
    from partita.runtime.loop.session import RunOptions, recipe_of
    assert recipe_of(RunOptions(steps=3, warmup_steps=5, lr_decay="cosine")).notes() == [
        "note: --warmup-steps 5 >= --steps 3: the learning rate rises over the whole run; --lr-decay cosine never "
        "starts"]
    assert Recipe(lr=1.0, steps=3, warmup_steps=5, lr_decay="cosine").lr_factor(2) == pytest.approx(0.5)


@pytest.mark.parametrize("layout, edit", [
    ("fsdp", {"zero_stage": 3}),     # DTensor gradients sharded over dp: their norm is reduced over the mesh
    ("zero1", {"zero_stage": 1}),    # the decayed and undecayed groups inside ZeroRedundancyOptimizer
    ("tp", None),                    # tensor-parallel DTensor gradients beside replicated plain ones
    ("bf16", {"train": {"dtype": "bf16"}}),  # the fp32 verification pass trains with the recipe too
])
def test_other_layouts_clip_and_decay_as_one_process(tmp_path, layout, edit):
    plan = make_plan(tp=2) if layout == "tp" else make_plan(dp=2)
    for key, value in (edit or {}).items():
        plan[key] = {**plan[key], **value} if isinstance(value, dict) else value
    path = tmp_path / f"{layout}.json"
    path.write_text(json.dumps(plan))
    r = _run(tmp_path, path, layout, "--verify")
    assert r["verified"] is True, r["checks"]
    norms = [c for c in r["checks"] if "grad norms before clipping" in c["what"] and c["tolerance"] is not None]
    assert len(norms) == 1 and norms[0]["diff"] < 1e-4, norms  # a bf16 run's own: reported; its fp32 pass's: judged
    assert r["learning_rates"] == pytest.approx(_schedule(), rel=1e-12)


def test_expert_parallel_clips_by_all_experts_and_saves_them_all(tmp_path):
    """ep=2: each rank holds half the experts, whose squared norms add up over the ep group; --save-final gathers
    them, so one process loads every expert."""
    from test_ep_runs import ep_plan
    path = tmp_path / "ep.json"
    path.write_text(json.dumps(ep_plan()))
    out = tmp_path / "ep.losses.json"
    done = run_plan(path, "tiny-moe", "--steps", "3", "--lr", str(LR), "--clip-grad-norm", "0.1", "--verify",
                    "--log-every", "0", "--losses-out", str(out), "--save-final", str(tmp_path / "ep.pt"), cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["verified"] is True and min(r["grad_norms"]) > 0.1, r["checks"]
    worst = max(abs(a - b) / b for a, b in zip(r["grad_norms"], r["reference_grad_norms"]))
    print(f"ep: largest relative difference of the grad norms from the reference {worst:.1e}")
    assert worst < 1e-4  # measured with the ep all-reduce left out: 2.2e-3 (the experts' share of the norm is small)
    model = resolve_model("tiny-moe").build().float()
    model.load_state_dict(torch.load(tmp_path / "ep.pt", weights_only=True))
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    assert math.isclose(checksum, r["param_checksum"], rel_tol=1e-9), (checksum, r["param_checksum"])


def test_a_tied_head_on_another_stage_counts_once_and_saves_under_both_names(tmp_path):
    """GPT-2's wte is tied to lm_head, and pp=2 puts them on different stages, each with a copy whose gradient
    is the tied sum (runtime.parallel.pp.TiedSync): the norm counts that gradient once, as one process does,
    and the saved dict has both names, as the model's own state_dict does."""
    from partita.planner.api import plan
    from partita.planner.enumerate.space import TrainConfig
    gpt2 = "hf:gpt2:n_layer=2,n_embd=64,n_head=4,vocab_size=128"
    plan(gpt2, cluster="2xcpu", train=TrainConfig(global_batch=4, dtype="fp32"), pp=2).save(tmp_path / "gpt2.json")
    out = tmp_path / "gpt2.losses.json"
    done = run_plan(tmp_path / "gpt2.json", gpt2, "--steps", "3", "--clip-grad-norm", "0.1", "--verify",
                    "--log-every", "0", "--losses-out", str(out), "--save-final", str(tmp_path / "gpt2.pt"), cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    r = json.loads(out.read_text())
    worst = max(abs(a - b) / b for a, b in zip(r["grad_norms"], r["reference_grad_norms"]))
    print(f"tied gpt2 pp=2: largest relative difference of the grad norms from the reference {worst:.1e}")
    assert r["verified"] is True and worst < 1e-4, r["checks"]
    state = torch.load(tmp_path / "gpt2.pt", weights_only=True)
    assert torch.equal(state["transformer.wte.weight"], state["lm_head.weight"])  # the stages' copies agree
    model = resolve_model(gpt2).build().float()
    model.load_state_dict(state)
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))  # the tied one once
    # the run's own checksum counts each stage's copy (runtime.verify.checks), one process's counts it once
    print(f"loaded {checksum!r}, reference {r['reference_param_checksum']!r}, run {r['param_checksum']!r}")
    assert math.isclose(checksum, r["reference_param_checksum"], rel_tol=1e-6)

"""--verify against deliberately wrong runtimes (tests/runtime/injected_bugs.py), in fp32 and bf16, on real
gloo process groups (2 ranks, tiny-gpt, 3 steps): each bug must fail verification and name what diverged,
and the correct runtime must pass. One torchrun launch per bug runs the fp32 and the bf16 plan (~10-20 s).

What the bf16 case shows: the bf16 run's own loss check (1e-2 against the fp32 reference) does not see
either bug -- the losses move by 3.5e-3 (dp sync skipped) and 6e-4 (tp input gradient not reduced) --
and the fp32 verification pass of the same layout does (runtime.verify.checks's docstring).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from partita.runtime.verify.checks import PARAM_TOLERANCE, TOLERANCE

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("injected_bugs.py")
STEPS = 3
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from test_plans_match_single_process import _env, make_plan  # noqa: E402

FP32_LOSS_TOL, BF16_LOSS_TOL = TOLERANCE[torch.float32], TOLERANCE[torch.bfloat16]
LAYOUTS = {"skip-dp-grad-sync": dict(dp=2), "drop-tp-input-grad-reduce": dict(tp=2)}
"""The plan each bug is visible in: DDP over dp=2; Megatron tensor parallelism over tp=2."""


def plan(dtype: str, **mesh) -> dict:
    p = make_plan("tiny-gpt", **mesh)
    p["train"]["dtype"] = dtype
    return p


def torchrun(tmp_path: Path, bug: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(WORKER),
           bug, *args]
    return subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)


def run_plans(tmp_path: Path, bug: str, plans: dict[str, dict]) -> dict:
    """One launch running each plan with --verify under `bug`; {case: summary with the checks}."""
    files = []
    for case, p in plans.items():
        files.append(tmp_path / f"{case}.json")
        files[-1].write_text(json.dumps(p))
    out = tmp_path / "out.json"
    proc = torchrun(tmp_path, bug, "plans", str(out), str(STEPS), *map(str, files))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    results = json.loads(out.read_text())
    for case, r in results.items():
        for c in r["checks"]:
            print(f"{bug} {case}: {c['what']}: {c['diff']:.2e} at {c['worst']} ({'ok' if c['passed'] else 'FAILED'})")
    return results


def checks(r: dict) -> dict[str, dict]:
    return {c["what"]: c for c in r["checks"]}


@pytest.mark.parametrize("bug", list(LAYOUTS))
def test_an_injected_bug_fails_verify_in_fp32_and_bf16(tmp_path, bug):
    mesh = LAYOUTS[bug]
    r = run_plans(tmp_path, bug, {"fp32": plan("fp32", **mesh), "bf16": plan("bf16", **mesh)})
    fp32, bf16 = checks(r["fp32"]), checks(r["bf16"])
    assert r["fp32"]["verified"] is False and r["bf16"]["verified"] is False
    # fp32: the run itself is judged, losses and parameters
    params = fp32[f"parameters after step {STEPS}"]
    assert not params["passed"] and params["diff"] > 10 * PARAM_TOLERANCE and params["worst"].startswith("'")
    assert not fp32["losses"]["passed"] and fp32["losses"]["diff"] > 10 * FP32_LOSS_TOL
    # bf16: the run's own loss bound cannot see the bug; the fp32 pass of the same layout does
    assert bf16["bf16 run, losses"]["passed"] and bf16["bf16 run, losses"]["diff"] < BF16_LOSS_TOL
    assert bf16[f"bf16 run, parameters after step {STEPS}"]["tolerance"] is None  # reported, not judged
    pass_params = bf16[f"fp32 pass of the same layout, parameters after step {STEPS}"]
    assert not pass_params["passed"] and pass_params["diff"] > 10 * PARAM_TOLERANCE
    assert not bf16["fp32 pass of the same layout, losses"]["passed"]


@pytest.mark.slow  # correct plans also pass the judged checks in test_plans_match_single_process (fp32) and
# test_plan_elements (bf16, FSDP2 and autocast tp); this launch adds the margins beside the bugs' values
def test_correct_plans_pass_verify_in_fp32_and_bf16(tmp_path):
    plans = {f"{name}-{dtype}": plan(dtype, **mesh) for name, mesh in (("dp2", dict(dp=2)), ("tp2", dict(tp=2)))
             for dtype in ("fp32", "bf16")}
    results = run_plans(tmp_path, "none", plans)
    for case, r in results.items():
        assert r["verified"] is True, (case, r["checks"])
        assert len(r["losses"]) == STEPS
        judged = [c for c in r["checks"] if c["tolerance"] is not None]
        noise = [c for c in judged if "rounding-level gradients" in c["what"]]
        assert len(judged) - len(noise) == (3 if case.endswith("bf16") else 2)  # bf16: its losses, and the fp32 pass
        # the attention key biases: softmax ignores them, so their true gradient is zero (runtime.verify.checks)
        assert noise and all(c["worst"].endswith("k.bias'") for c in noise), (case, noise)
        for c in judged:  # margins: well inside, not at the edge
            assert c["diff"] <= c["tolerance"] / 5, (case, c)


def test_steps_1_checks_the_update_and_the_cli_exits_non_zero(tmp_path):
    """A tp input gradient left unreduced leaves the loss of step 1 exact; with --steps 1 only the
    judged parameters after that step see it. runtime.train exits 1 (torchrun non-zero) and the report
    names the parameter, in bf16 (through the fp32 pass)."""
    plan_file = tmp_path / "tp2-bf16.json"
    plan_file.write_text(json.dumps(plan("bf16", tp=2)))
    out = tmp_path / "out.json"
    proc = torchrun(tmp_path, "drop-tp-input-grad-reduce", "train", str(plan_file), "--model", "tiny-gpt",
                    "--steps", "1", "--verify", "--losses-out", str(out))
    assert proc.returncode != 0, proc.stdout + proc.stderr
    r = json.loads(out.read_text())
    assert r["verified"] is False
    c = checks(r)
    assert c["fp32 pass of the same layout, losses"]["passed"]  # step 1's loss: right
    assert c["fp32 pass of the same layout, losses"]["diff"] <= FP32_LOSS_TOL
    bad = c["fp32 pass of the same layout, parameters after step 1"]
    assert not bad["passed"], bad
    line = [x for x in proc.stdout.splitlines() if x.startswith("verify FAILED")]  # the report's last line
    assert line == [f"verify FAILED: fp32 pass of the same layout, parameters after step 1, {bad['worst']} "
                    f"({bad['diff']:.2e} > {bad['tolerance']:.0e})"], proc.stdout[-3000:]
    print(line[0])

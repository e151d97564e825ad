"""The plan elements beyond mesh/stages/placements -- ZeRO 2/3 (FSDP2), recompute, activation and state
offload, bf16 -- run under torchrun on gloo and train like one process (fp32: 1e-5 over 3 steps).

Each launch combines several elements to keep launches few (~8 s for 2 ranks, ~15 s for 4); the run's
`applied` record (rank 0) shows each element was applied, not skipped. The one-process tests in
tests/runtime show that recompute and offload do what they say.
"""
from __future__ import annotations

import pytest
import torch

from partita.costmodel import resolve_model
from partita.planner.plan import Plan
from partita.runtime.launcher.checks import build_meta
from partita.runtime.verify.checks import TOLERANCE
from test_plans_match_single_process import _direct, _one_line, launch, make_plan  # sibling test module

BF16_TOL = TOLERANCE[torch.bfloat16]
"""1e-2, runtime.verify.checks's bound on a bf16 run's losses against the fp32 single-process reference. bf16
keeps 8 significant bits (unit roundoff 2^-8 ~ 4e-3 per rounding, compounded through forward and
backward), so a bf16 run cannot promise much more. Measured after 3 steps: 2.5e-4 (FSDP2 mixed precision)
and 1.5e-4 (autocast), against < 1e-6 for fp32. This bound checks that bf16 is applied and trains sanely,
not the parallel code paths: a run that skips the dp gradient sync drifts only 3.5e-3 in 3 steps, inside
it. So --verify on a bf16 plan also trains the same layout in fp32 and judges that pass at the fp32
tolerances (losses 1e-5, parameters runtime.verify.checks.PARAM_TOLERANCE); the injected-bug tests in
tests/runtime/test_verify_injected_bugs.py show that pass failing where the bf16 bound does not."""


def element_plan(model="tiny-gpt", *, zero=0, dtype="fp32", optimizer="adam", choices=None, **mesh) -> dict:
    """make_plan plus ZeRO stage, dtype, optimizer and per-block choices {fqn: {field: value}}; validated again."""
    plan = make_plan(model, **mesh)
    plan["zero_stage"], plan["train"]["dtype"], plan["train"]["optimizer"] = zero, dtype, optimizer
    for block in plan["blocks"]:
        block.update((choices or {}).get(block["fqn"], {}))
    Plan.from_dict(plan)
    return plan


def n_params(model: str) -> int:
    return sum(p.numel() for p in build_meta(resolve_model(model)).parameters())


def check(proc, out, *, tol=1e-5, **applied):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(out["losses"]) == len(out["reference_losses"]) == 3
    assert out["max_abs_diff"] <= tol, out
    for key, want in applied.items():
        assert out["applied"][key] == want, (key, out["applied"])
    print(f"max_abs_diff={out['max_abs_diff']:.2e}  applied: {out['applied']['summary']}")


FULL_SEL = {"blocks.0": {"recompute": "full"}, "blocks.1": {"recompute": "selective"}}
OFFLOAD = {"blocks.0": {"offload_activations": True},
           "blocks.1": {"recompute": "selective", "offload_activations": True}}

CASES = [  # ranks, model, plan kwargs, what rank 0 must report as applied
    pytest.param(2, "tiny-gpt", dict(zero=3, dp=2, choices={"blocks.1": {"offload_states": True},
                                                             "blocks.0": {"zero_stage": 2}}),
                 dict(fsdp_units=3, reshard_after_forward=True, offload_states=["blocks.1"],
                      local_params=n_params("tiny-gpt") // 2), id="zero3-dp2-offload-states-block0-zero2"),
    pytest.param(2, "tiny-gpt", dict(zero=2, dp=2, micro=2, choices=FULL_SEL),
                 dict(fsdp_units=3, reshard_after_forward=False, recompute={"blocks.0": "full", "blocks.1": "selective"}),
                 id="zero2-dp2-accum2-recompute-full-selective"),
    pytest.param(2, "tiny-gpt", dict(dp=2, optimizer="sgd", choices=OFFLOAD),
                 dict(fsdp_units=0, offload_activations=["blocks.0", "blocks.1"], recompute={"blocks.1": "selective"}),
                 id="ddp2-offload-activations-sgd"),
    pytest.param(4, "tiny-llama", dict(zero=3, dp=2, tp=2, choices=FULL_SEL),
                 dict(fsdp_units=3, tp_layers=14, recompute={"blocks.0": "full", "blocks.1": "selective"}),
                 id="llama-zero3-dp2xtp2-recompute", marks=pytest.mark.slow),
    pytest.param(4, "tiny-gpt", dict(zero=3, pp=2, dp=2, micro=2, choices=OFFLOAD),
                 dict(fsdp_units=2, offload_activations=["blocks.0"]),  # rank 0 runs stage 0: blocks.0 + root
                 id="zero3-pp2xdp2-offload-activations", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("ranks,model,kw,applied", CASES)
def test_plan_elements_match_single_process(tmp_path, ranks, model, kw, applied):
    proc, out = launch(tmp_path, element_plan(model, **kw), ranks, model)
    check(proc, out, **applied)
    assert f"zero_stage {kw.get('zero', 0)}, fp32, {kw.get('optimizer', 'adam')})" in proc.stdout


@pytest.mark.parametrize("ranks,model,kw", [
    pytest.param(2, "tiny-gpt", dict(zero=3, dp=2), id="bf16-fsdp-zero3-dp2"),
    pytest.param(2, "tiny-llama", dict(tp=2), id="bf16-autocast-llama-tp2"),
])
def test_bf16_trains_in_bf16_within_tolerance_of_fp32(tmp_path, ranks, model, kw):
    proc, out = launch(tmp_path, element_plan(model, dtype="bf16", **kw), ranks, model)
    check(proc, out, tol=BF16_TOL)
    assert out["max_abs_diff"] > 1e-6, "losses equal fp32's: bf16 was not applied"
    assert "precision: bf16" in proc.stdout and "tolerance 1e-02" in proc.stdout
    judged = {c["what"]: c for c in out["checks"] if c["tolerance"] is not None}
    noise = {w for w in judged if "with rounding-level gradients" in w}  # Adam's noise, judged apart (runtime.verify.checks)
    assert set(judged) - noise == {"bf16 run, losses", "fp32 pass of the same layout, losses",
                                   "fp32 pass of the same layout, parameters after step 3"}, out["checks"]
    assert all(judged[w]["worst"].endswith("k.bias'") for w in noise)
    assert all(c["passed"] for c in judged.values()) and "verify: OK" in proc.stdout


def test_zero_stage_1_with_tensor_parallelism_exits_2_before_training(tmp_path):
    """ZeRO-1 runs beside data and pipeline parallelism (runtime.parallel.zero1); with tp it is refused up front."""
    proc = _direct(tmp_path, element_plan(zero=1, dp=1, tp=2), "tiny-gpt", "--check")  # pre-flight only
    assert proc.returncode == 2
    line = _one_line(proc)
    assert "ZeRO-1 with tp=2 is not run" in line and "use ZeRO 0, 2 or 3" in line
    assert "step" not in proc.stdout


def test_check_validates_the_plan_elements(tmp_path):
    bad = element_plan(choices={"blocks.0": {"recompute": "full", "offload_activations": True}})
    proc = _direct(tmp_path, bad, "tiny-gpt", "--check")
    assert proc.returncode == 2 and "nothing to offload" in _one_line(proc)


def compiled_plan(model: str, **kw) -> dict:
    """element_plan priced with compiled kernels (as `partita plan --kernels compiled` records it)."""
    plan = element_plan(model, **kw)
    plan["solver"] = {"fixed": {"kernels": "compiled"}}
    return plan


@pytest.mark.slow
@pytest.mark.parametrize("ranks,model,kw,applied", [
    pytest.param(2, "tiny-llama", dict(zero=3, dp=2, choices={"blocks.0": {"recompute": "full"},
                                                               "blocks.1": {"recompute": "selective"}}),
                 dict(fsdp_units=3, recompute={"blocks.0": "full", "blocks.1": "selective"}),
                 id="compiled-llama-zero3-dp2-recompute"),
    pytest.param(2, "tiny-gpt", dict(dp=2, choices={"blocks.0": {"offload_activations": True}}),
                 dict(offload_activations=["blocks.0"]), id="compiled-gpt-ddp2-offload-activations"),
    pytest.param(2, "tiny-llama", dict(tp=2), dict(tp_layers=14), id="compiled-llama-tp2"),
    pytest.param(2, "tiny-gpt", dict(pp=2, micro=2), dict(), id="compiled-gpt-pp2"),
])
def test_a_compiled_plan_compiles_its_layers_and_trains_like_one_process(tmp_path, ranks, model, kw, applied):
    """A plan priced with --kernels compiled runs each layer torch.compile'd (Inductor on CPU: ~10-20 s of
    compiling per launch), composed with FSDP2, checkpointing, activation offload hooks (a graph break
    at the hooks; the compiled code's saved tensors go to host), DTensor tensor parallelism or a pipeline
    stage, and still trains like the eager single-process reference (fp32, 1e-5). The embedding and head
    stay eager."""
    proc, out = launch(tmp_path, compiled_plan(model, **kw), ranks, model)
    layers = ["blocks.0"] if kw.get("pp") else ["blocks.0", "blocks.1"]  # rank 0 runs stage 0 of a pipeline
    check(proc, out, compiled=layers, **applied)
    assert "compiled: " + ", ".join(layers) in proc.stdout
    # said before the first step, which is the one that compiles (issue 46: "print nothing for a minute")
    said = proc.stdout.index("compiling the plan's layers with torch.compile: the first step includes it")
    assert proc.stdout.startswith("partita run: ") and said < proc.stdout.index("step  loss")

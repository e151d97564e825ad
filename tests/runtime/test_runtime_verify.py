"""The loss comparison behind --verify must fail whenever the curves differ beyond tolerance."""
import math

import torch

from partita.costmodel import resolve_model
from partita.runtime.data import SyntheticTokens
from partita.runtime.verify.checks import TOLERANCE, compare, reference_losses

TOL = TOLERANCE[torch.float32]


def test_equal_curves_pass():
    assert compare([5.5, 5.4, 5.3], [5.5, 5.4, 5.3], TOL) == (0.0, True)


def test_difference_at_tolerance_passes_and_beyond_fails():
    diff, ok = compare([1.0, 2.0], [1.0, 2.0 + 0.5e-5], TOL)
    assert ok and math.isclose(diff, 0.5e-5, rel_tol=1e-6)
    diff, ok = compare([1.0, 2.0, 3.0], [1.0, 2.0, 3.0 + 2e-5], TOL)
    assert not ok and math.isclose(diff, 2e-5, rel_tol=1e-6)


def test_nan_inf_and_length_mismatch_fail():
    assert compare([1.0, math.nan], [1.0, 1.0], TOL)[1] is False
    assert compare([1.0, 1.0], [1.0, math.nan], TOL)[1] is False
    assert compare([math.inf], [math.inf], TOL)[1] is False
    assert compare([1.0], [1.0, 1.0], TOL)[1] is False
    assert compare([], [], TOL)[1] is False


def test_reference_is_deterministic():
    spec = resolve_model("tiny-gpt")
    data = SyntheticTokens(spec, global_batch=4, seed=0)
    a = reference_losses(spec, data, 3, seed=0, lr=1e-2, device=torch.device("cpu"))
    b = reference_losses(spec, data, 3, seed=0, lr=1e-2, device=torch.device("cpu"))
    assert a == b and len(a) == 3 and all(math.isfinite(x) for x in a)


def test_a_failed_check_names_the_step_or_the_parameter():
    from partita.runtime.verify.checks import failures, loss_check, param_check

    ok = loss_check("losses", [5.5, 5.4], [5.5, 5.4 + 5e-6], TOL)
    bad = loss_check("losses", [5.5, 5.4, 5.3], [5.5, 5.4 + 3e-5, 5.3], TOL)
    assert ok.passed and not bad.passed and bad.worst == "step 2"
    assert loss_check("losses", [5.4, 5.3], [5.4, 5.3 + 3e-5], TOL, first_step=2).worst == "step 4"
    assert not loss_check("losses", [math.nan], [1.0], TOL).passed
    p = param_check("parameters after step 3", {"a.weight": 1e-4, "b.bias": 0.5, "c": math.nan}, 2e-2)
    assert not p.passed and p.worst == "'c'" and p.diff == math.inf  # a NaN is the worst, never skipped
    p = param_check("parameters after step 3", {"a.weight": 1e-4, "b.bias": 0.5}, 2e-2)
    assert p.worst == "'b.bias'" and "FAILED" in p.line()
    assert failures([ok, p]) == "verify FAILED: parameters after step 3, 'b.bias' (5.00e-01 > 2e-02)"
    assert failures([ok]) == ""
    reported = param_check("bf16 run, parameters", {"a": 9.0}, None)
    assert reported.passed and "reported, not judged" in reported.line()


def test_parameter_differences_are_scaled_by_the_whole_models_update():
    from partita.runtime.verify.checks import ParamStats

    # tensor "noise" was not updated by the reference (a zero gradient): its own update would divide
    # noise by noise; the whole model's update RMS (here 1e-3 per element) is the scale
    s = ParamStats(0.0, gap={"w": 2e-3 * 10, "noise": 1e-6}, update={"w": 1e-3 * 10, "noise": 0.0},
                   numel={"w": 100, "noise": 4})
    rel = s.relative
    assert math.isclose(rel["w"], 2.0 / math.sqrt(100 / 104)) and rel["noise"] < 1e-3


def test_a_model_with_dropout_is_said_before_verify_compares_it():
    """With dropout a parallel layout draws masks in another order than the one-process reference, so a
    correct plan can fail --verify (OPT's default 0.1 did at pp=2): the run says so before training."""
    from partita.costmodel.models import resolve_model
    from partita.runtime.loop.session import dropout_probability
    assert dropout_probability(resolve_model("gpt:layers=2,hidden=64,heads=4,vocab=128,seq=32,dropout=0.1")) == 0.1
    assert dropout_probability(resolve_model("hf:opt:num_hidden_layers=2,hidden_size=64,num_attention_heads=4,"
                                             "ffn_dim=128,word_embed_proj_dim=64")) == 0.1
    assert dropout_probability(resolve_model("tiny-gpt")) == 0.0


def test_a_rounding_level_gradient_is_judged_by_adams_step_bound_and_a_real_one_is_not():
    """Issue 30 item 5. Under Adam a tensor whose reference gradient is rounding noise leaves the model-scaled
    measure and is judged against 2 x Adam's largest step x steps; every other tensor keeps the measure, and
    under SGD nothing is set apart."""
    from partita.costmodel.models import resolve_model as resolve
    from partita.runtime.loop.recipe import build_model, loss_for
    from partita.runtime.verify.checks import ADAM_STEP_BOUND, GradientRMS, ParamStats, param_checks

    spec = resolve("tiny-gpt")
    model = build_model(spec, 0)
    batch = SyntheticTokens(spec, global_batch=4, seed=0).batch(0)
    loss_for(spec)(model, batch).backward()
    grads = GradientRMS()
    grads.record(model)
    assert sorted(grads.at_rounding_level()) == ["blocks.0.attn.k.bias", "blocks.1.attn.k.bias"]  # softmax ignores them
    stats = ParamStats(0.0, gap={"w": 1e-9, "k.bias": 1.0}, update={"w": 1.0, "k.bias": 1e-9},
                       numel={"w": 1, "k.bias": 1}, peak={"w": 1e-9, "k.bias": 1e-3})
    lr, steps = 1e-3, 3
    main, noise = param_checks("parameters", stats, 2e-2, "adam", ["k.bias"], lr, steps)
    assert main.passed and main.worst == "'w'"
    assert noise.passed and math.isclose(noise.diff, 1e-3 / (2 * ADAM_STEP_BOUND * lr * steps))
    wild = ParamStats(0.0, gap=stats.gap, update=stats.update, numel=stats.numel, peak={"w": 1e-9, "k.bias": 1.0})
    assert not param_checks("parameters", wild, 2e-2, "adam", ["k.bias"], lr, steps)[1].passed  # beyond any Adam drift
    (sgd,) = param_checks("parameters", stats, 2e-2, "sgd", ["k.bias"], lr, steps)
    assert not sgd.passed and sgd.worst == "'k.bias'"

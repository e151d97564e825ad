"""The loss comparison behind --verify must fail whenever the curves differ beyond tolerance."""
import math

import torch

from costmodel import resolve_model
from runtime.data import SyntheticTokens
from runtime.verify import TOLERANCE, compare, reference_losses

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

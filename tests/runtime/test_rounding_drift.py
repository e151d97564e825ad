"""--verify's loss check against the reference's own rounding drift (runtime.verify.checks.rounding_drift,
loss_check's `drift`): a loss may differ from the reference by max(1e-5, 10 x how far the reference itself moves
when its initial weights move by one rounding), per step; beyond that it fails and names the step."""
import pytest

from partita.runtime.verify.checks import ROUNDING_MARGIN, loss_check, rounding_drift


def test_the_drift_is_the_running_largest_difference():
    assert rounding_drift([1.0, 2.0, 3.0, 4.0], [1.0, 2.0 + 3e-6, 3.0 + 1e-6, 4.0 - 5e-6]) == pytest.approx(
        [0.0, 3e-6, 3e-6, 5e-6])
    assert rounding_drift([1.0], [float("nan")]) == [float("inf")]


def test_a_difference_within_ten_times_the_drift_passes_and_names_the_allowance():
    ref, drift = [1.0, 1.0, 1.0], [0.0, 2e-6, 5e-6]
    run = [1.0, 1.0 + 1.5e-5, 1.0 + 4e-5]  # 1.5e-5 > 1e-5, but under 10 x 2e-6 = 2e-5
    fixed = loss_check("losses", run, ref, 1e-5)
    assert not fixed.passed and fixed.worst == "step 3"
    c = loss_check("losses", run, ref, 1e-5, 0, drift)
    assert c.passed and c.tolerance == pytest.approx(ROUNDING_MARGIN * 5e-6) and c.worst.startswith("step 3; ")
    assert "nudged by fp32's unit roundoff, drifts 5.0e-06 by then" in c.worst


def test_a_wrong_update_fails_however_the_reference_drifts():
    ref, drift = [2.0, 1.5, 1.2], [0.0, 1e-6, 1e-6]
    c = loss_check("losses", [2.0, 1.5 + 1e-3, 1.2], ref, 1e-5, 4, drift)  # a wrong step: 1e-3 off
    assert not c.passed and c.worst.startswith("step 6") and c.diff == pytest.approx(1e-3)
    # a stable reference keeps the fixed tolerance, and the step is said plainly
    c = loss_check("losses", [2.0, 1.5 + 2e-5, 1.2], ref, 1e-5, 0, [0.0, 0.0, 0.0])
    assert not c.passed and c.tolerance == 1e-5 and c.worst == "step 2"

"""What a run checks of its own inputs before anything launches: numbers torch can take (--lr, --seed).

`partita run` (planner.cli) checks them before it starts its pre-flight; runtime.train (its launcher and its
pre-flight `--check`) and the Python API (runtime.session.prepare) check the same, so every way of starting a
run refuses the same input with the same line -- before the first step, not in every worker.
"""
from __future__ import annotations

import math

from partita.planner.plan import one_line

SEED_RANGE = (-2**63, 2**64 - 1)
"""What torch.manual_seed accepts (a negative seed counts modulo 2^64); the data sources derive the seeds of
their generators from it modulo 2^64 too (runtime.data), so every seed in this range trains."""


def _show(value) -> str:
    try:
        text = one_line(repr(value), 200)
    except ValueError:  # an int of more digits than Python converts (sys.get_int_max_str_digits)
        return "a number of thousands of digits"
    return text if len(text) <= 40 else text[:37] + "..."


def option_errors(*, lr, seed) -> list[str]:
    """--lr and --seed values that would only fail in the workers (a NaN learning rate, a seed torch refuses)."""
    errors = []
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        errors.append(f"--lr must be a finite number above 0, got {_show(lr)}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        errors.append(f"--seed must be a whole number from -2^63 to 2^64-1 (what torch.manual_seed takes), got "
                      f"{_show(seed)}")
    return errors

"""The caching allocator's cache, measured against the transients the planner prices it from.

    python -m benchmarks.allocator_cache          # reads results/gpu.json, writes results/allocator_cache.json

On a GPU, PyTorch's caching allocator reserves more than a step ever allocates at once: the blocks it has
cached but not handed out. benchmarks.gpu measured both peaks (torch.cuda.max_memory_reserved and
max_memory_allocated) for every plan it ran. The planner predicts that cache per stage as
ALLOCATOR_CACHE_FACTOR x the stage's largest transient (costmodel.hardware; planner.estimate.phases:
the logits on the last stage, a layer's widest projection elsewhere, plus one re-run layer on a stage that
recomputes) and leaves it free. This program is the fit of that factor:

1. each measured case is planned again as it was planned when it ran (under the headroom its row records,
   or the flat 5% the first shipped plans were made under), so that the plan is the one measured -- a case
   whose plan now differs is reported and left out;
2. the ratio of the measured cache (peak reserved - peak allocated) to the predicted transient is computed
   per case;
3. the factor is their upper envelope, rounded up to 0.01: a headroom must cover the cache, so the largest
   ratio binds, not the mean.

The JSON holds each case's transient, measured cache, ratio, the cache the shipped factor predicts and the
predicted reserved peak (predicted allocated + predicted cache) beside the measured one;
tests/planner/test_allocator_cache.py checks the shipped factor against it.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from contextlib import contextmanager
from pathlib import Path

from benchmarks import common

GiB = 2**30
GPU_JSON = Path(__file__).resolve().parent / "results" / "gpu.json"
SHIPPED_HEADROOM = 0.05
"""The flat allocator headroom of the measured plans whose rows do not say what they were planned under
(benchmarks/gpu_plans at commit f36054f, before rows recorded `predicted.memory_headroom`): planning again
under it gives the plan that ran."""


def planned_headroom(row: dict) -> float | None:
    """The headroom `row`'s plan was made under: its recorded flat fraction, None for the allocator's
    predicted cache, SHIPPED_HEADROOM where the row predates the record."""
    predicted = row.get("predicted") or {}
    return predicted["memory_headroom"] if "memory_headroom" in predicted else SHIPPED_HEADROOM


FACTORS_AT = {"886bca9": (1.06, 0.47)}
"""(ALLOCATOR_CACHE_FACTOR, RECOMPUTE_CACHE_FACTOR) shipped at the commits whose plans gpu.json's rows ran, for rows
made before plans recorded theirs (`predicted.memory_allocator_cache_factors`)."""


def planned_factors(row: dict, plans_commit: str | None) -> tuple[float, float] | None:
    """The allocator-cache factors `row`'s plan was made under: its record, else those shipped at the commit its
    plans were made at (FACTORS_AT); None for a plan made under a flat headroom."""
    predicted = row.get("predicted") or {}
    if planned_headroom(row) is not None:
        return None
    if predicted.get("allocator_cache_factors"):
        return tuple(predicted["allocator_cache_factors"])
    return FACTORS_AT[(row.get("earlier_run") or {}).get("plans_commit") or plans_commit]


@contextmanager
def shipped_factors(factors: tuple[float, float] | None):
    """Plan under `factors` (costmodel.hardware.device's two constants) while inside; None: as they are."""
    from partita.costmodel.hardware import device
    saved = device.ALLOCATOR_CACHE_FACTOR, device.RECOMPUTE_CACHE_FACTOR
    if factors is not None:
        device.ALLOCATOR_CACHE_FACTOR, device.RECOMPUTE_CACHE_FACTOR = factors
    try:
        yield
    finally:
        device.ALLOCATOR_CACHE_FACTOR, device.RECOMPUTE_CACHE_FACTOR = saved


def measured_rows(gpu: dict) -> list[dict]:
    """The rows of a gpu.json that ran and measured both peaks."""
    return [r for r in gpu["rows"] if (r.get("measured") or {}).get("peak_reserved_bytes") and not r.get("oom")]


def case_cache(row: dict, preset: str, factors: tuple[float, float] | None = None) -> dict:
    """The row's case planned again under the headroom it ran with (a flat one, or the allocator's cache under
    the `factors` of its time: `planned_factors`): whether the plan is the one that ran, its predicted allocated
    peak and its stage's predicted transient (the cache over the factor)."""
    from benchmarks.gpu import _plan_summary
    from benchmarks.gpu_plans import Case, for_lent_torch
    from partita.planner.api import plan_search
    from partita.planner.estimate.build import cache_terms
    from partita.planner.search import TrainConfig
    case = Case(row["name"], row["what"], row["model"], row["global_batch"], row.get("seq"), row["plan"]["fixed"])
    with for_lent_torch(), shipped_factors(factors):
        result, plan = plan_search(case.model, cluster=f"1x{preset}", memory_headroom=planned_headroom(row),
                                   train=TrainConfig(global_batch=case.global_batch, seq_len=case.seq), **case.fixed)
    summary = _plan_summary(json.loads(plan.to_json()))
    same = all(summary[k] == row["plan"][k] for k in ("mesh", "micro_batch", "recompute", "kernels"))
    transient, rebuilt = cache_terms(result.best)
    s = int(plan.predicted["memory_per_stage"].index(max(plan.predicted["memory_per_stage"], key=lambda r: r["total"])))
    return {"same_plan": same, "predicted_allocated_bytes": plan.predicted["peak_memory_bytes"],
            "transient_bytes": float(transient[s]), "rebuilt_bytes": float(rebuilt[s])}


def up(x: float) -> float:
    """`x` rounded up to 0.01."""
    return math.ceil(100 * x - 1e-9) / 100


def fit(rows: list[dict]) -> tuple[float, float]:
    """(ALLOCATOR_CACHE_FACTOR, RECOMPUTE_CACHE_FACTOR) from `rows`: the upper envelope of cache / transient
    over the plans that recompute nothing, then of what the others cache beyond that, per byte of their
    largest re-run layer; each rounded up to 0.01 (0 for the second where no plan recomputes)."""
    plain = [r for r in rows if not r["rebuilt_bytes"]]
    rebuilt = [r for r in rows if r["rebuilt_bytes"]]
    a = up(max(r["measured_cache_bytes"] / r["transient_bytes"] for r in plain))
    b = up(max([(r["measured_cache_bytes"] - a * r["transient_bytes"]) / r["rebuilt_bytes"] for r in rebuilt] + [0.0]))
    return a, b


def main(argv=None) -> int:
    from partita.costmodel.hardware import ALLOCATOR_CACHE_FACTOR, RECOMPUTE_CACHE_FACTOR, DEVICES
    ap = argparse.ArgumentParser(prog="python -m benchmarks.allocator_cache", description=__doc__.split("\n")[0])
    ap.add_argument("--gpu-json", type=Path, default=GPU_JSON, help="a benchmarks.gpu result (default: the committed one)")
    gpu = json.loads(ap.parse_args(argv).gpu_json.read_text())
    preset = gpu["gpu"]["preset"]
    rows, left_out = [], []
    for r in measured_rows(gpu):
        m = r["measured"]
        got = case_cache(r, preset, planned_factors(r, gpu["plans"].get("commit")))
        if not got["same_plan"]:
            left_out.append(r["name"])
            continue
        rows.append({"case": r["name"], **got, "measured_cache_bytes": m["peak_reserved_bytes"] - m["peak_allocated_bytes"],
                     "measured_allocated_bytes": m["peak_allocated_bytes"], "measured_reserved_bytes": m["peak_reserved_bytes"]})
    if not any(not r["rebuilt_bytes"] for r in rows):
        print("benchmarks.allocator_cache: no measured plan without recompute plans as it ran; nothing to fit",
              file=sys.stderr)
        return 1
    a, b = fit(rows)
    device = DEVICES[preset]
    for r in rows:
        r["predicted_cache_bytes"] = device.allocator_cache_bytes(r["transient_bytes"], r["rebuilt_bytes"])
        r["predicted_reserved_bytes"] = r["predicted_allocated_bytes"] + r["predicted_cache_bytes"]
    out = common.write("allocator_cache", {
        "measured_on": gpu["gpu"], "source": {"file": "benchmarks/results/gpu.json", "commit": gpu.get("commit")},
        "rows": rows, "left_out": left_out,
        "fitted": {"allocator_cache_factor": a, "recompute_cache_factor": b},
        "shipped": {"allocator_cache_factor": ALLOCATOR_CACHE_FACTOR, "recompute_cache_factor": RECOMPUTE_CACHE_FACTOR},
        "notes": "cache = peak reserved - peak allocated of the plan that ran; predicted = allocator_cache_factor x "
                 "the stage's largest transient + recompute_cache_factor x its largest re-run layer "
                 "(costmodel.hardware); each factor the upper envelope of its rows, rounded up to 0.01"})
    for r in rows:
        print(f"{r['case']:<18} transient {r['transient_bytes'] / GiB:5.2f} GiB, re-run layer {r['rebuilt_bytes'] / GiB:5.2f}; "
              f"cache {r['measured_cache_bytes'] / GiB:5.2f} GiB measured, {r['predicted_cache_bytes'] / GiB:5.2f} predicted; "
              f"reserved {r['measured_reserved_bytes'] / GiB:6.2f} GiB measured, {r['predicted_reserved_bytes'] / GiB:6.2f} predicted")
    for name in left_out:
        print(f"{name:<18} the planner now plans it differently: left out")
    print(f"fitted: allocator cache {a:g} x the transient + {b:g} x the re-run layer (shipped {ALLOCATOR_CACHE_FACTOR:g}, "
          f"{RECOMPUTE_CACHE_FACTOR:g}); wrote {out}")
    return 0 if (a, b) == (ALLOCATOR_CACHE_FACTOR, RECOMPUTE_CACHE_FACTOR) else 1


if __name__ == "__main__":
    sys.exit(main())

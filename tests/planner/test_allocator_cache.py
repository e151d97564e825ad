"""The headroom a GPU plan leaves is the caching allocator's predicted cache (costmodel.hardware
ALLOCATOR_CACHE_FACTOR, RECOMPUTE_CACHE_FACTOR), fitted by benchmarks.allocator_cache to the H200's measured
peaks: it covers every measured cache, and the planner takes it off each stage's capacity."""
import json

import numpy as np
import pytest

from benchmarks import allocator_cache
from partita.cli import main
from partita.costmodel.hardware import ALLOCATOR_CACHE_FACTOR, DEVICES, RECOMPUTE_CACHE_FACTOR, GiB
from partita.planner.api import plan_search
from partita.planner.search import TrainConfig

M1 = "llama:layers=16,hidden=2048,heads=32,kv_heads=8,ffn=8192,vocab=128256,seq=4096"


@pytest.fixture(scope="module")
def fitted():
    """benchmarks.allocator_cache's rows, computed again from the committed gpu.json at this commit."""
    gpu = json.loads(allocator_cache.GPU_JSON.read_text())
    rows = []
    for r in allocator_cache.measured_rows(gpu):
        got = allocator_cache.case_cache(r, gpu["gpu"]["preset"],
                                         allocator_cache.planned_factors(r, gpu["plans"].get("commit")))
        assert got["same_plan"], f"{r['name']}: the plan that ran is no longer what its case plans"
        m = r["measured"]
        rows.append({"case": r["name"], **got, "measured_cache_bytes": m["peak_reserved_bytes"] - m["peak_allocated_bytes"]})
    return rows


def test_the_shipped_factors_are_the_fit_of_the_measured_caches(fitted):
    assert len(fitted) >= 6 and any(r["rebuilt_bytes"] for r in fitted)
    assert allocator_cache.fit(fitted) == (ALLOCATOR_CACHE_FACTOR, RECOMPUTE_CACHE_FACTOR)


def test_the_predicted_cache_covers_every_measured_one_and_stays_close(fitted):
    """Covered everywhere; close (within 20%) where the plan recomputes nothing and the cache is one term. Beside
    recompute the one term per re-run layer cannot describe the four measured plans (0.0-0.99 x of it): the
    envelope covers them and over-predicts two by 31% and 45% (RECOMPUTE_CACHE_FACTOR's docstring), checked
    here so that it grows no further unnoticed."""
    h200 = DEVICES["H200-141GB"]
    for r in fitted:
        predicted = h200.allocator_cache_bytes(r["transient_bytes"], r["rebuilt_bytes"])
        assert predicted >= r["measured_cache_bytes"], r["case"]
        # the flat 5% it replaces was below it; the prediction is no blanket margin either
        assert predicted <= (1.2 if not r["rebuilt_bytes"] else 1.5) * r["measured_cache_bytes"], r["case"]
    assert any(0.05 * (h200.memory_bytes - h200.reserved_bytes) < r["measured_cache_bytes"] for r in fitted)


def test_a_gpu_plan_leaves_each_stage_its_cache_and_fits_what_the_device_holds():
    result, plan = plan_search(M1, cluster="1xH200-141GB", train=TrainConfig(global_batch=8))
    pred = plan.predicted
    dev = DEVICES["H200-141GB"]
    assert dev.allocator_headroom is None and "memory_headroom" not in pred
    cache = pred["memory_allocator_cache_per_stage"]
    logits = 8 * 4096 * 128256 * 2  # the bf16 logits of the micro-batch of 8 the plan runs
    assert plan.schedule.micro_batch_size == 8
    assert cache[0] >= int(ALLOCATOR_CACHE_FACTOR * logits)
    assert pred["memory_capacity_per_stage"][0] == pytest.approx(dev.memory_bytes - dev.reserved_bytes - cache[0], abs=2)
    for row, c in zip(pred["memory_per_stage"], cache):
        assert row["total"] + c <= dev.memory_bytes - dev.reserved_bytes
    assert pred["memory_headroom_bytes"] == max(cache)


def test_a_pipeline_keeps_the_logits_cache_on_its_last_stage_only():
    _, plan = plan_search(M1, cluster="4xH100-80GB", train=TrainConfig(global_batch=8), pp=(2,), tp=(1,))
    cache = plan.predicted["memory_allocator_cache_per_stage"]
    caps = plan.predicted["memory_capacity_per_stage"]
    assert len(cache) == 2 and cache[1] > 10 * cache[0] > 0
    assert caps[0] - caps[1] == pytest.approx(cache[1] - cache[0], abs=2)


def test_a_flat_headroom_replaces_the_cache_and_the_report_says_which(capsys, tmp_path):
    _, flat = plan_search(M1, cluster="1xH200-141GB", train=TrainConfig(global_batch=8), memory_headroom=0.05)
    dev = DEVICES["H200-141GB"]
    assert flat.predicted["memory_headroom"] == 0.05 and "memory_allocator_cache_per_stage" not in flat.predicted
    assert flat.predicted["memory_capacity_bytes"] == int(0.95 * (dev.memory_bytes - dev.reserved_bytes))
    out = tmp_path / "p.json"
    assert main(["plan", "--model", M1, "--cluster", "1xH200-141GB", "--global-batch", "8", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["explain", str(out)]) == 0
    report = " ".join(capsys.readouterr().out.split())
    assert "the caching allocator's predicted cache" in report and "allocator headroom" not in report
    cache = json.loads(out.read_text())["predicted"]["memory_allocator_cache_per_stage"][0]
    assert f"{cache / GiB:.3g}" in report or f"{cache / GiB:.2f}" in report


def test_resource_lists_take_null_for_the_predicted_cache():
    from partita.costmodel.hardware import parse_cluster
    from partita.costmodel.hardware.resources import cluster_from_dict, cluster_to_dict
    d = cluster_to_dict(parse_cluster("2xcpu"))
    d["groups"][0]["device"] = {"name": "gpu", "base": "H100-80GB", "allocator_headroom": None}
    assert cluster_from_dict(d).device.allocator_headroom is None
    d["groups"][0]["device"]["allocator_headroom"] = 0.1
    c = cluster_from_dict(d)
    assert c.device.allocator_headroom == 0.1 and not c.device.charges_allocator_cache
    assert np.isclose(c.device.headroom_bytes(), 0.1 * (c.device.memory_bytes - c.device.reserved_bytes))

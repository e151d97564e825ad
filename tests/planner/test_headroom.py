"""The planner keeps the device's reserve (CUDA context, NCCL) and a flat allocator headroom free where one is
set (costmodel.hardware.Device.allocator_headroom: the cpu preset, `--memory-headroom`, `memory_headroom=`, a
resource list): no plan the search returns peaks above usable memory, which the headroom lowers, and the plan
says what it kept. The GPU presets' default, the allocator's predicted cache, is tests/planner/test_allocator_cache.py."""
import dataclasses
import json

import pytest

from partita.costmodel.errors import InfeasibleError, PartitaError
from partita.costmodel.hardware import DEFAULT_ALLOCATOR_HEADROOM, DEVICES, GiB, Cluster, parse_cluster
from partita.costmodel.hardware.resources import cluster_from_dict, cluster_to_dict, with_allocator_headroom
from partita.planner.estimate.build import predicted
from partita.cli import main
from partita.planner.search import SearchSpace, TrainConfig, search

TRAIN = TrainConfig(global_batch=16)
SPACE = SearchSpace(pp=(1,), offload=False)


def cluster(memory_bytes: float, headroom: float) -> Cluster:
    dev = dataclasses.replace(DEVICES["A100-80GB"], memory_bytes=memory_bytes, allocator_headroom=headroom,
                              reserved_bytes=0.25 * GiB)
    return Cluster(nodes=1, devices_per_node=2, device=dev, spec="tight")


def peak(result) -> float:
    return predicted(result, result.best)["peak_memory_bytes"]


def test_usable_memory_is_memory_less_reserve_less_headroom():
    dev = DEVICES["cpu"]  # (no caching allocator to predict: a flat headroom)
    assert dev.allocator_headroom == DEFAULT_ALLOCATOR_HEADROOM > 0 and not dev.charges_allocator_cache
    after_reserve = dev.memory_bytes - dev.reserved_bytes
    assert dev.headroom_bytes() == pytest.approx(after_reserve * DEFAULT_ALLOCATOR_HEADROOM)
    assert dev.usable_memory() == pytest.approx(after_reserve - dev.headroom_bytes())
    # a GPU preset leaves the allocator's predicted cache per stage instead (tests/planner/test_allocator_cache.py);
    # the paths that price no transients keep the flat default
    gpu = DEVICES["H200-141GB"]
    assert gpu.allocator_headroom is None and gpu.charges_allocator_cache
    assert gpu.usable_memory() == gpu.memory_bytes - gpu.reserved_bytes
    assert gpu.usable_memory(flat=True) == pytest.approx((gpu.memory_bytes - gpu.reserved_bytes) * (1 - DEFAULT_ALLOCATOR_HEADROOM))


def test_the_search_never_returns_a_plan_above_usable_memory_minus_headroom(graph_of):
    g = graph_of("small-gpt", "bf16")
    free = search(g, cluster(80 * GiB, 0.0), TRAIN, space=SPACE)
    fastest = peak(free)
    # a device that holds the fastest plan with no headroom, and not with one
    memory = 0.25 * GiB + 1.02 * fastest
    tight = search(g, cluster(memory, 0.0), TRAIN, space=SPACE)
    assert peak(tight) == pytest.approx(fastest)
    seen = set()
    for headroom in (0.05, 0.1, 0.2, 0.3, 0.5):
        c = cluster(memory, headroom)
        try:
            result = search(g, c, TRAIN, space=SPACE)
        except InfeasibleError:
            continue
        pred = predicted(result, result.best)
        assert pred["peak_memory_bytes"] <= c.device.usable_memory() < fastest
        assert pred["memory_capacity_bytes"] == int(c.device.usable_memory())
        assert pred["memory_headroom"] == headroom and pred["memory_headroom_bytes"] == int(c.device.headroom_bytes())
        # every candidate the search solved and kept as feasible is within the same capacity
        for cand in result.candidates:
            if cand.solution is not None and cand.solution.feasible:
                assert cand.solution.stage_mem.max() <= c.device.usable_memory() * (1 + 1e-9)
        seen.add(headroom)
    assert 0.05 in seen  # the headroom moved the search off its fastest plan, to one that fits


def test_memory_headroom_from_the_api_cli_and_resource_lists(capsys, tmp_path):
    c = with_allocator_headroom(parse_cluster("2x8xA100-80GB"), 0.25)
    assert c.device.allocator_headroom == 0.25 and c.device.usable_memory() < DEVICES["A100-80GB"].usable_memory()
    assert with_allocator_headroom(c, None) is c
    for bad in (1.0, -0.1, "5%", True):
        with pytest.raises(PartitaError, match="fraction of device memory in"):
            with_allocator_headroom(c, bad)
    # a resource list keeps it per group, and the conservative device takes the largest
    d = cluster_to_dict(parse_cluster("2xcpu"))
    d["groups"].append({**d["groups"][0], "name": "b", "device": {"name": "cpu", "base": "cpu",
                                                                  "allocator_headroom": 0.3}})
    assert cluster_from_dict(d).device.allocator_headroom == 0.3
    d["groups"][1]["device"]["allocator_headroom"] = 1.5
    with pytest.raises(PartitaError, match="allocator_headroom: must be a fraction"):
        cluster_from_dict(d)
    args = ["plan", "--model", "tiny-gpt", "--cluster", "2xcpu", "--global-batch", "4", "--json"]
    assert main([*args, "--memory-headroom", "0.25"]) == 0
    pred = json.loads(capsys.readouterr().out)["predicted"]
    assert pred["memory_headroom"] == 0.25
    dev = DEVICES["cpu"]
    assert pred["memory_capacity_bytes"] == int((dev.memory_bytes - dev.reserved_bytes) * 0.75)
    assert pred["memory_reserved_bytes"] == dev.reserved_bytes
    out = tmp_path / "p.json"
    assert main(args[:-1] + ["--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["explain", str(out)]) == 0
    report = " ".join(capsys.readouterr().out.split())  # (the report wraps its lines)
    assert f"a {100 * DEFAULT_ALLOCATOR_HEADROOM:g}% allocator headroom" in report

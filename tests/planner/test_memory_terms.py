"""planner.estimate.terms: a stage's peak split into parameters, gradients, optimizer state, activations and
transients adds up to the predicted peak, and the model-state terms are ZeRO's formulas -- a Megatron-style
distributed optimizer (ZeRO-1 on a stack partita does not run, sharded evenly) holds 12 / d bytes of optimizer
state per parameter beside 2-byte parameters (Rajbhandari et al. SC'20; REFERENCE.md)."""
from __future__ import annotations

import pytest

from partita.costmodel.capture import capture
from partita.costmodel.hardware import parse_cluster
from partita.costmodel.models import resolve_model
from partita.planner.enumerate.space import SearchSpace, TrainConfig
from partita.planner.estimate.terms import stage_terms
from partita.planner.search import search

LLAMA = "llama:layers=2,hidden=256,heads=8,kv_heads=4,seq=256,vocab=512,ffn=512"
DP = 4


@pytest.fixture(scope="module")
def graph():
    return capture(resolve_model(LLAMA), dtype="bf16")


def _numel(graph) -> int:
    return sum(sum(d["params"].values()) for _, d in graph.g.nodes(data=True))


def _terms(graph, zero: int, stack: str) -> dict:
    space = SearchSpace(tp=(1,), pp=(1,), dp=(DP,), zero=(zero,), micro_batch=(1,), recompute=("none",),
                        offload=False, stack=stack, keep_gathered=False)
    result = search(graph, parse_cluster(f"{DP}xH100-80GB"), TrainConfig(global_batch=2 * DP, seq_len=256, dtype="bf16",
                                                                         autocast=False), space=space)
    return stage_terms(result)


def test_a_distributed_optimizer_holds_12_over_d_bytes_per_parameter(graph):
    t, n = _terms(graph, 1, "te-2024"), _numel(graph)
    assert t["parameters"] == pytest.approx(2 * n)
    assert t["optimizer_state"] == pytest.approx(12 * n / DP)
    assert t["gradients"] in (0.0, pytest.approx(2 * n))  # none before the stage's first backward


@pytest.mark.parametrize("zero", [0, 2, 3])
def test_zero_stages_shard_what_rajbhandari_shards(graph, zero):
    t, n = _terms(graph, zero, "te-2024"), _numel(graph)
    assert t["parameters"] == pytest.approx(2 * n / (DP if zero == 3 else 1))
    assert t["optimizer_state"] == pytest.approx(12 * n / (DP if zero else 1))


def test_the_terms_add_up_to_the_peak_and_the_cache_to_the_reserved(graph):
    t = _terms(graph, 1, "pytorch")
    parts = ("parameters", "gradients", "optimizer_state", "activations", "transients")
    assert sum(t[k] for k in parts) == pytest.approx(t["allocated"])
    assert t["reserved"] == pytest.approx(t["allocated"] + t["allocator_cache"]) and t["allocator_cache"] > 0
    # torch's ZeroRedundancyOptimizer hands out whole tensors: the busiest rank steps more than n / d
    assert t["optimizer_state"] >= 12 * _numel(graph) / DP

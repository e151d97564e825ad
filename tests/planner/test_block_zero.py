"""A ZeRO-3 plan may keep some blocks' parameters gathered from forward to backward (their own ZeRO-2):
one all-gather fewer per micro-batch for p n (1 - 1/d) more bytes, decided layer by layer by the program."""
import dataclasses
import math

import pytest

from partita.costmodel.hardware import DEVICES, Cluster, GiB
from partita.planner.estimate.build import predicted
from partita.planner.search import SearchSpace, TrainConfig, search

SPACE = SearchSpace(pp=(1,), tp=(1,), zero=(3,), recompute=("none",), offload=False)


def slow_network(memory_bytes: float) -> Cluster:
    """8 single-A100 nodes on a slow network: ZeRO-3's all-gathers are exposed at micro-batch 1."""
    dev = dataclasses.replace(DEVICES["A100-80GB"], inter_node_bw=0.3e9, memory_bytes=memory_bytes,
                              host_memory_bytes=0, reserved_bytes=0, allocator_headroom=0.0)
    return Cluster(nodes=8, devices_per_node=1, device=dev, spec="slow-network")


def layer_zero(c) -> dict:
    out: dict = {}
    for o, n in zip(c.options, c.solution.counts.sum(0)):
        if n:
            out[o.zero] = out.get(o.zero, 0) + int(n)
    return out


def test_memory_decides_how_many_layers_stay_gathered(graph_of):
    g = graph_of("small-gpt", "bf16")
    roomy = search(g, slow_network(8 * GiB), TrainConfig(global_batch=8), space=SPACE)
    layers = len(roomy.layers)
    assert layer_zero(roomy.best) == {2: layers}  # communication-bound, memory to spare: all gathered
    kept = next(o for o in roomy.best.options if o.zero == 2)
    resharded = next(o for o in roomy.best.options if o.zero is None and o.base is kept.base)
    assert kept.zero_comm < resharded.zero_comm and kept.state > resharded.state
    delta = kept.state - resharded.state
    peak = predicted(roomy, roomy.best)["peak_memory_bytes"]
    # each resharded layer frees delta, and once one reshards, two layers' bf16 parameters are gathered at a
    # time (planner.estimate.phases): freeing half a layer's worth takes the fewest k with k delta >= delta / 2 + that
    gathered = 2 * kept.base.param_numel * 2
    want = math.ceil((0.5 * delta + gathered) / delta)
    tight = search(g, slow_network(peak - 0.5 * delta), TrainConfig(global_batch=8), space=SPACE)
    mix = layer_zero(tight.best)
    assert 0 < want < layers and mix == {2: layers - want, None: want}, mix
    assert tight.best.step_time > roomy.best.step_time


def test_full_shard_as_run_keeps_no_layer_gathered(graph_of):
    """SearchSpace(keep_gathered=False) prices FSDP FULL_SHARD as it runs: every layer reshards after its
    forward and gathers again for its backward, even where keeping it gathered would be faster."""
    g = graph_of("small-gpt", "bf16")
    cluster, train = slow_network(8 * GiB), TrainConfig(global_batch=8)
    hybrid = search(g, cluster, train, space=SPACE)
    as_run = search(g, cluster, train, space=dataclasses.replace(SPACE, keep_gathered=False))
    assert layer_zero(hybrid.best).get(2) and set(layer_zero(as_run.best)) == {None}
    assert as_run.best.step_time > hybrid.best.step_time
    assert predicted(as_run, as_run.best)["peak_memory_bytes"] < predicted(hybrid, hybrid.best)["peak_memory_bytes"]
    with pytest.raises(Exception, match="keep_gathered must be True"):
        SearchSpace(keep_gathered="no")

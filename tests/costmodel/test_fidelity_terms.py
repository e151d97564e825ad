"""The measured runtime costs the planner charges beyond FLOPs and bytes (benchmarks/fidelity.py):
each test fails if its term is dropped, by checking that a prediction grows by exactly the term times
its count.

- Device.sync_latency: every message step of a collective in a step (costmodel.price.comm, alpha + sync);
- Device.sharded_op_latency: every launch of a node run on DTensors (planner.enumerate.strategies);
- Device.redistribute_latency: every tensor-parallel collective, a DTensor redistribution;
- Device.sharded_param_latency: every parameter held as a DTensor, per optimizer step (planner.enumerate.options);
- the loss all-reduce every step issues (planner.search.step_sync);
- one backward all-reduce per column-parallel layer, as DTensor's ColwiseParallel issues them.
"""
import dataclasses
import json

import pytest

from partita.costmodel.calibrate import fit as calibrate_fit, local as calibrate_local

from partita.costmodel.price import comm
from partita.costmodel.hardware import DEVICES, Cluster, conservative_device
from partita.costmodel.price.memory import state_bytes
from partita.costmodel.hardware.resources import SCHEMA, cluster_from_dict, cluster_to_dict
from partita.planner.enumerate.options import Variant, cost_variant
from partita.planner.enumerate.strategies import BACKWARD_LAUNCHES, launches, replicate_option, sequence_option, tensor_option

MODEL = "gpt:layers=2,hidden=64,heads=4,seq=16,vocab=128"
CPU = DEVICES["cpu"]


def _cluster(n: int = 4, **fields) -> Cluster:
    return Cluster(nodes=1, devices_per_node=n, device=dataclasses.replace(CPU, **fields))


# ------------------------------------------------------------------------------- Device / resources

def test_gpu_presets_carry_no_cpu_overheads():
    for name in ("A100-80GB", "H100-80GB", "V100-32GB"):
        d = DEVICES[name]
        assert (d.sync_latency, d.sharded_op_latency, d.sharded_param_latency, d.redistribute_latency) == (0, 0, 0, 0)


def test_resource_lists_without_the_new_fields_still_load_and_with_them_round_trip():
    old = {"name": "box", "peak_flops": {"bf16": 4.0e10, "fp32": 8.0e10}, "memory_bytes": 8.0e9,
           "mem_bandwidth": 1.2e10, "intra_node_bw": 2.0e9, "inter_node_bw": 1.0e8, "op_latency": 1e-5}
    doc = {"schema": SCHEMA, "groups": [{"name": "box", "nodes": 1, "devices_per_node": 2, "device": old}]}
    c = cluster_from_dict(json.loads(json.dumps(doc)))
    assert (c.device.sync_latency, c.device.sharded_op_latency, c.device.sharded_param_latency,
            c.device.redistribute_latency) == (0, 0, 0, 0)
    new = {**old, "sync_latency": 8e-4, "sharded_op_latency": 1e-4, "sharded_param_latency": 6e-5,
           "redistribute_latency": 1.5e-4}
    doc["groups"][0]["device"] = new
    c = cluster_from_dict(doc)
    assert c.device.sync_latency == 8e-4 and c.device.redistribute_latency == 1.5e-4
    assert cluster_from_dict(cluster_to_dict(c)).device == c.device


def test_the_conservative_device_takes_the_largest_overheads():
    a = dataclasses.replace(CPU, sync_latency=1e-3, sharded_op_latency=1e-5, op_latency=1e-5)
    b = dataclasses.replace(CPU, sync_latency=2e-4, sharded_op_latency=3e-4, op_latency=4e-5)
    d = conservative_device([a, b])
    assert (d.sync_latency, d.sharded_op_latency, d.op_latency) == (1e-3, 3e-4, 4e-5)


# ---------------------------------------------------------------------------------- sync_latency

@pytest.mark.parametrize("n", [2, 4])
def test_sync_latency_is_paid_per_message_step(n):
    s = 7e-4
    base, slow = _cluster(n), _cluster(n, sync_latency=s)
    g = comm.group_for(base, n, 1)
    B = 1e6
    assert comm.all_reduce(slow, g, B) - comm.all_reduce(base, g, B) == pytest.approx(2 * (n - 1) * s)
    assert comm.all_gather(slow, g, B) - comm.all_gather(base, g, B) == pytest.approx((n - 1) * s)
    assert comm.reduce_scatter(slow, g, B) - comm.reduce_scatter(base, g, B) == pytest.approx((n - 1) * s)
    assert comm.p2p(slow, B, False) - comm.p2p(base, B, False) == pytest.approx(s)
    # the linear form the programs use carries it in its latency
    lat0, pb0 = comm.affine(comm.all_reduce, base, g)
    lat1, pb1 = comm.affine(comm.all_reduce, slow, g)
    assert lat1 - lat0 == pytest.approx(2 * (n - 1) * s) and pb1 == pytest.approx(pb0)
    # nothing to send, nothing to pay
    assert comm.all_reduce(slow, comm.group_for(slow, 1, 1), B) == 0 and comm.p2p(slow, 0, False) == 0


def test_sync_latency_fit_recovers_the_per_step_latency():
    alpha, beta, s = 1e-4, 2e9, 9e-4
    fits = {kind: {"alpha_s": alpha, "beta_bytes_per_s": beta} for kind in ("all_reduce", "all_gather",
                                                                             "reduce_scatter", "p2p")}
    def in_step(kind, k):
        fa, fb = calibrate_fit.FORMS[kind](k)
        return fa * (alpha + s) + fb * 1024 / beta
    rows = {kind: [{"ranks": k, "bytes": 1024, "in_step_s": in_step(kind, k)}
                   for k in ((2,) if kind == "p2p" else (2, 4))] for kind in fits}
    assert calibrate_fit.sync_latency(rows, fits) == pytest.approx(s)
    # one disturbed timing (a row 10x slower, another near back to back) does not move it
    rows["p2p"][0]["in_step_s"] *= 10
    rows["all_gather"][0]["in_step_s"] = 1e-4
    assert calibrate_fit.sync_latency(rows, fits) == pytest.approx(s)
    # in-step times no slower than back to back: nothing to add
    fast = {kind: [{**r, "in_step_s": r["in_step_s"] / 100} for r in v] for kind, v in rows.items()}
    assert calibrate_fit.sync_latency(fast, fits) == 0.0
    assert calibrate_fit.sync_latency({}, fits) == 0.0


def test_calibration_divides_by_the_launches_the_planner_counts():
    assert calibrate_local.LAUNCHES_PER_NODE == 1 + BACKWARD_LAUNCHES


# ------------------------------------------------------------------------- tensor-parallel blocks

def _layer(graph_of):
    g = graph_of(MODEL)
    return g, "blocks.0"


def test_sharded_op_latency_is_paid_per_launch_of_the_nodes_run_on_dtensors(graph_of):
    g, layer = _layer(graph_of)
    x = 1e-4
    base, slow = _cluster(2), _cluster(2, sharded_op_latency=x)
    t0, t1 = tensor_option(g, layer, base, 2), tensor_option(g, layer, slow, 2)
    # tensor parallelism runs the six placed Linears (q, k, v, proj, fc1, fc2) on DTensors
    linears = [n for n in g.nodes_of(layer) if g.g.nodes[n]["kind"] == "linear"]
    assert len(linears) == 6 and set(t0.placements) >= {g.g.nodes[n]["module"] for n in linears}
    units = sum(launches(g.g.nodes[n]) for n in linears) * (1 + BACKWARD_LAUNCHES)
    assert t1.launch_s - t0.launch_s == pytest.approx(units * x)
    assert t1.relaunch_by_policy["full"] - t0.relaunch_by_policy["full"] == pytest.approx(units / 3 * x)
    # the replicated block runs on plain tensors: not charged
    assert replicate_option(g, layer, slow, 2).launch_s == pytest.approx(replicate_option(g, layer, base, 2).launch_s)
    # sequence parallelism runs the norms and residual adds on DTensors as well: more launches charged
    s0, s1 = sequence_option(g, layer, base, 2), sequence_option(g, layer, slow, 2)
    assert s1.launch_s - s0.launch_s > t1.launch_s - t0.launch_s


def test_redistribute_latency_is_paid_per_tensor_parallel_collective(graph_of):
    g, layer = _layer(graph_of)
    r = 2e-4
    base, slow = _cluster(2), _cluster(2, redistribute_latency=r)
    for make in (tensor_option, sequence_option):
        o0, o1 = make(g, layer, base, 2), make(g, layer, slow, 2)
        bwd = o0.tp_comm_bytes_bwd if o0.tp_reduce_each_bwd is None else o0.tp_reduce_each_bwd
        calls = sum(map(len, (o0.tp_comm_bytes_fwd, o0.tp_gather_fwd, o0.tp_scatter_fwd, bwd, o0.tp_gather_bwd,
                              o0.tp_scatter_bwd)))
        assert calls > 0
        assert o1.tp_comm_s(slow, 3) - o0.tp_comm_s(base, 3) == pytest.approx(calls * r)
    assert replicate_option(g, layer, slow, 1).tp_comm_s(slow, 3) == 0


def test_each_column_parallel_layer_all_reduces_its_own_input_gradient(graph_of):
    g, layer = _layer(graph_of)
    c = _cluster(2)
    t = tensor_option(g, layer, c, 2)
    cols = [n for n in g.nodes_of(layer) if t.placements.get(g.g.nodes[n]["module"]) == "colwise"]
    assert len(cols) == 4                                   # q, k, v, fc1
    assert len(t.tp_comm_bytes_bwd) == 2                    # two distinct inputs (Megatron's f)
    assert len(t.tp_reduce_each_bwd) == 4                   # but DTensor reduces per layer
    one = comm.all_reduce(c, comm.group_for(c, 2, 1), t.tp_comm_bytes_bwd[0] * 3)
    megatron = dataclasses.replace(t, tp_reduce_each_bwd=None)
    assert t.tp_comm_s(c, 3) - megatron.tp_comm_s(c, 3) == pytest.approx(2 * one)  # k and v: two more


# ------------------------------------------------------------------------------------- optimizer

def test_sharded_param_latency_is_paid_per_dtensor_parameter_per_step(graph_of):
    g, layer = _layer(graph_of)
    p = 5e-5
    base, slow = _cluster(4), _cluster(4, sharded_param_latency=p)
    sb = state_bytes("fp32", "adam")
    t0, t1 = tensor_option(g, layer, base, 2), tensor_option(g, layer, slow, 2)
    assert t0.dtensor_params == 12 and t0.param_tensors == 16   # 6 Linears' weights and biases; 2 norms plain
    v0 = cost_variant(Variant(t0), base, sb, zero=0, dp=2, tp=2, b=1)
    v1 = cost_variant(Variant(t1), slow, sb, zero=0, dp=2, tp=2, b=1)
    assert v1.flush - v0.flush == pytest.approx(12 * p)
    assert v1.time == pytest.approx(v0.time)                      # once per step, not per micro-batch
    # a replicated block's parameters are plain tensors, unless FSDP shards them (all DTensors then)
    r0, r1 = replicate_option(g, layer, base, 1), replicate_option(g, layer, slow, 1)
    assert r1.param_tensors == 16
    ddp = [cost_variant(Variant(o), c, sb, zero=0, dp=4, tp=1, b=1) for o, c in ((r0, base), (r1, slow))]
    fsdp = [cost_variant(Variant(o), c, sb, zero=3, dp=4, tp=1, b=1) for o, c in ((r0, base), (r1, slow))]
    assert ddp[1].flush == pytest.approx(ddp[0].flush)
    assert fsdp[1].flush - fsdp[0].flush == pytest.approx(16 * p)


# ---------------------------------------------------------------------------------------- a step

def test_every_step_pays_one_loss_all_reduce_over_all_ranks(graph_of):
    from partita.planner.search import SearchSpace, TrainConfig
    from partita.planner.enumerate.candidates import _Bases, build_candidate, split_model, step_sync
    g = graph_of(MODEL)
    s = 6e-4
    base, slow = _cluster(4), _cluster(4, sync_latency=s)
    assert step_sync(base) == pytest.approx(comm.all_reduce(base, comm.group_for(base, 4, 1), 4))
    assert step_sync(slow) - step_sync(base) == pytest.approx(2 * 3 * s)
    assert step_sync(_cluster(1)) == 0
    train = TrainConfig(global_batch=8, dtype="fp32", schedule="1F1B")
    space = SearchSpace(tp=(1,), pp=(1,), zero=(0,), recompute=("none",), offload=False)
    pre, layers, suf = split_model(g)
    c = build_candidate(_Bases(g, base, pre, layers, suf), train, space, pp=1, dp=4, tp=1, zero=0, b=2)
    dp_latency = comm.affine(comm.all_reduce, base, comm.group_for(base, 4, 1))[0]
    # one stage, no TP: the runtime's DDP, whose buckets overlap the backward but the last (25 MiB)
    extra = sum(cost_variant(Variant(o), base, state_bytes("fp32", "adam"), 0, 4, 1, 2, ddp_overlap=True).flush
                for o in c.parts["extra_options"].values())
    from partita.planner.enumerate.candidates import DDP_BUCKET_BYTES
    grads = 4 * sum(sum(d["params"].values()) for _, d in g.g.nodes(data=True))
    last = comm.all_reduce(base, comm.group_for(base, 4, 1), min(DDP_BUCKET_BYTES, grads)) \
        * (1 - base.device.overlap_slowdown)
    assert c.problem.extra_flush[0] == pytest.approx(extra + dp_latency + step_sync(base) + last)


# ------------------------------------------------------------------------------------ offload

def test_offloaded_activations_add_their_copies_out_and_back_to_the_step(graph_of):
    """runtime.parallel.offload copies a block's saved activations on the compute stream (costmodel.price.streams): the variant
    that offloads costs its twin's time plus the bytes out and back at the host link, however fast the
    link, and the host lane (the states' copies) carries none of them."""
    g, layer = _layer(graph_of)
    for host_bw in (1e9, 1e12):
        c = dataclasses.replace(_cluster(2), device=dataclasses.replace(_cluster(2).device, host_bw=host_bw,
                                                                        overlap_slowdown=0.0))
        sb = state_bytes("fp32", "adam")
        o = replicate_option(g, layer, c, 1)
        kept = cost_variant(Variant(o), c, sb, zero=0, dp=2, tp=1, b=2)
        moved = cost_variant(Variant(o, offload_activations=True), c, sb, zero=0, dp=2, tp=1, b=2)
        assert moved.host_act == kept.act > 0 and moved.act == 0
        assert moved.time - kept.time == pytest.approx(2 * kept.act / host_bw, rel=1e-9)
        assert moved.timing.lanes.offload_out == moved.timing.lanes.offload_in == 0

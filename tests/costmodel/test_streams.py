"""How overlap is priced (costmodel.price.streams): windows of compute beside communication lanes."""
import pytest

from partita.costmodel.price.streams import LayerStreams, bucketed_all_reduce, layer_timing, window

K = 0.15


def test_communication_shorter_than_compute_hides_and_costs_only_contention():
    w = window(compute=10.0, nccl=4.0, host=0.0, slowdown=K)
    assert w.exposed == 0 and w.contention == pytest.approx(K * 4) and w.seconds == pytest.approx(10 + K * 4)
    assert w.hidden == pytest.approx(4.0) and w.binding == "compute"


def test_communication_longer_than_compute_is_exposed():
    w = window(compute=2.0, nccl=5.0, host=1.0, slowdown=K)
    assert w.seconds == pytest.approx(5.0 + K * 2.0) and w.binding == "zero"
    assert w.exposed == pytest.approx(5.0 - 2.0) and w.contention == pytest.approx(K * 2.0)
    # the whole lane time is accounted for: exposed + hidden = what the lanes carried
    assert w.exposed + w.hidden == pytest.approx(6.0)


def test_a_forward_gather_cannot_hide_behind_backward_compute():
    """The old model pooled the layer: max(C_f + C_b, traffic). A gather longer than the forward's compute
    is exposed even when the backward is long."""
    s = LayerStreams(compute_fwd=1.0, compute_bwd=2.0, gather_fwd=1.8, gather_bwd=1.8, scatter_bwd=0.0)
    t = layer_timing(s, 0.0)
    assert t.exposed["zero"] == pytest.approx(0.8)
    assert t.total == pytest.approx(1.8 + 2.0)  # the pooled model said max(1 + 2, 1.8 + 1.8) = 3.6


def test_backward_gathers_and_reduce_scatters_share_one_network():
    s = LayerStreams(compute_fwd=1.0, compute_bwd=2.0, gather_bwd=1.5, scatter_bwd=1.5)
    t = layer_timing(s, 0.0)
    assert t.backward.seconds == pytest.approx(3.0) and t.exposed["zero"] == pytest.approx(1.0)


def test_offload_copies_share_the_host_link_with_the_nic():
    alone = layer_timing(LayerStreams(compute_fwd=1.0, compute_bwd=2.0, offload_out=0.8, offload_in=0.8), K)
    shared = layer_timing(LayerStreams(compute_fwd=1.0, compute_bwd=2.0, offload_out=0.8, offload_in=0.8,
                                       nic_fwd=0.5, nic_bwd=0.5), K)
    assert alone.exposed["offload"] == 0 and shared.exposed["offload"] > 0
    assert shared.total > alone.total


def test_offloaded_activations_are_copied_on_the_compute_stream_and_hide_behind_nothing():
    """save_on_cpu and HostStash copy on the current stream: however long the compute, the copies add to it
    (the host lane, which FSDP2's own offload streams use, would have hidden them)."""
    for compute in (1.0, 10.0):
        plain = layer_timing(LayerStreams(compute_fwd=compute, compute_bwd=2 * compute), K)
        copied = layer_timing(LayerStreams(compute_fwd=compute, compute_bwd=2 * compute, offload_serial=0.6), K)
        assert copied.total == pytest.approx(plain.total + 0.6) and copied.exposed["offload"] == pytest.approx(0.6)
        lane = layer_timing(LayerStreams(compute_fwd=compute, compute_bwd=2 * compute, offload_out=0.3,
                                         offload_in=0.3), K)
        assert lane.exposed["offload"] == 0  # as states' copies on their own stream


def test_tensor_parallel_collectives_stay_on_the_critical_path():
    t = layer_timing(LayerStreams(compute_fwd=1.0, compute_bwd=2.0, tp=0.5), K)
    assert t.total == pytest.approx(3.5) and t.exposed["tp"] == 0.5


def test_ddp_buckets_overlap_the_backward():
    assert bucketed_all_reduce(1.0, 3.0, K) == (0.0, pytest.approx(K))
    exposed, contention = bucketed_all_reduce(4.0, 3.0, K)
    assert exposed == pytest.approx(4.0 - 3.0) and contention == pytest.approx(K * 3.0)


@pytest.mark.parametrize("compute,comm", [(3.0, 1.0), (1.0, 3.0)])
def test_no_overlap_at_full_slowdown_and_perfect_overlap_at_none(compute, comm):
    """kappa = 1 (a CPU: collectives run on the computing cores) is serial, kappa = 0 perfect overlap."""
    assert window(compute, comm, 0.0, 1.0).seconds == pytest.approx(compute + comm)
    assert window(compute, comm, 0.0, 0.0).seconds == pytest.approx(max(compute, comm))
    exposed, contention = bucketed_all_reduce(comm, compute, 1.0)
    assert exposed + contention == pytest.approx(comm)


@pytest.fixture(scope="module")
def gpt3():
    from partita.costmodel.models import resolve_model
    from partita.costmodel.capture import capture
    return capture(resolve_model("gpt3-175b"), dtype="bf16")


def test_zero3_gathers_are_exposed_where_a_layer_computes_for_less_time_than_it_gathers(gpt3):
    """ZeRO-3 on 1,536 A100s at global batch 1536 (one sample per GPU): with the NIC share cut 4x each
    layer's gather outlasts its compute, and the plan pays for it -- exposed ZeRO time grows and
    throughput falls. The first cost model's max(compute, traffic) pooled forward and backward and
    charged no contention."""
    from dataclasses import replace
    from partita.costmodel.hardware import parse_cluster
    from partita.planner.estimate.build import predicted
    from partita.planner.search import SearchSpace, TrainConfig, search
    fast = parse_cluster("192x8xA100-80GB")
    slow = replace(fast, device=replace(fast.device, inter_node_bw=fast.device.inter_node_bw / 4))
    space = SearchSpace(tp=(1,), pp=(1,), zero=(3,), recompute=("selective",), offload=False, micro_batch=(1,))
    out = []
    for cluster in (fast, slow):
        r = search(gpt3, cluster, TrainConfig(global_batch=1536), space=space)
        p = predicted(r, r.best)
        out.append((p["step_time_s"], p["breakdown"]["zero_comm_s"], p["breakdown"]["contention_s"],
                    p["hidden_comm_s"], p["breakdown"]["compute_s"]))
    (t_fast, z_fast, k_fast, h_fast, c_fast), (t_slow, z_slow, k_slow, h_slow, c_slow) = out
    assert k_fast > 0 and h_fast > 0            # hidden gathers still slow the compute beside them
    # the slow network's gathers are exposed: more than its 4x (what the fast one hid shows too)
    assert z_slow > 4.5 * max(z_fast, 1e-3)
    assert t_slow > 1.3 * t_fast and c_slow == pytest.approx(c_fast)

"""Compute by kernel kind and shape (costmodel.price.kernels): GEMMs on a shape-dependent roofline, fused
attention by the kernel the stack dispatches, everything else memory-bound."""
from dataclasses import replace

import pytest

from partita.costmodel.hardware import DEVICES, gpu_device, parse_cluster
from partita.costmodel.price.kernels import (attention_work_share, gemm_efficiency, node_time, saturation, sdpa_kernel)
from partita.planner.enumerate.strategies import node_seconds, replicate_option, tensor_option

# A device with every curve set to known values, so the tests check the formulas, not fitted numbers.
DEV = replace(DEVICES["H100-80GB"], matmul_efficiency=0.7, gemm_half_mn=2e5, gemm_split_k=4096.0, gemm_half_dim=0.0,
              attention_efficiency=0.6, attention_bwd_efficiency=0.5, attention_half_seq=500.0,
              attention_half_dim=40.0, attention_causal_block=128.0, other_attention=None, mem_efficiency=0.8,
              step_efficiency=1.0)
FLAT = replace(DEV, gemm_half_mn=0.0, gemm_split_k=0.0)


def linear(m, n, k):
    return {"kind": "linear", "shape": (1, m, n), "fwd_flops": 2 * m * n * k, "bwd_flops": 4 * m * n * k,
            "mem_bytes": 2 * (m * k + m * n)}


def attention(b, h, s, d, causal=False):
    f = 4 * b * h * s * s * d
    return {"kind": "scaled_dot_product_attention", "shape": (b, h, s, d), "fwd_flops": f, "bwd_flops": 2.5 * f,
            "mem_bytes": 0, "causal": causal}


def rate(t, flops):
    return flops / (t.fwd + t.fixed_fwd)


def test_a_large_gemm_runs_near_the_device_efficiency_and_a_small_output_slows_it():
    big = node_time(linear(8192, 12288, 12288), DEV, "bf16")
    assert 0.95 * DEV.matmul_efficiency < rate(big, 2 * 8192 * 12288**2) / DEV.peak("bf16") < DEV.matmul_efficiency
    # a small output fills few SMs: the same FLOPs on 64 x 64 outputs with a shallow K run far below it
    small = node_time(linear(64, 64, 1024), DEV, "bf16")
    assert rate(small, 2 * 64 * 64 * 1024) < 0.1 * rate(big, 2 * 8192 * 12288**2)
    # ... unless K is deep enough to split: then the slices run in parallel (split-K)
    deep = node_time(linear(64, 64, 1024 * 64), DEV, "bf16")
    assert rate(deep, 2 * 64 * 64 * 1024 * 64) > 5 * rate(small, 2 * 64 * 64 * 1024)


def test_the_backward_prices_its_two_products_at_their_own_shapes():
    """dX is (M x N) @ (N x K), dW (N x M) @ (M x K): each at its own output and inner sizes."""
    m, n, k = 8192, 64, 8192
    t = node_time(linear(m, n, k), DEV, "bf16")
    f = 2 * m * n * k
    expected = f / (DEV.peak("bf16") * gemm_efficiency(DEV, m, k, n)) + f / (DEV.peak("bf16") * gemm_efficiency(DEV, n, k, m))
    assert t.bwd + t.fixed_bwd == pytest.approx(expected)
    # dX's output (M x K) is large, where the forward's (M x 64) is not: the backward runs nearer peak per FLOP
    assert t.bwd + t.fixed_bwd < 2 * (t.fwd + t.fixed_fwd)


def test_a_column_parallel_shard_is_less_than_t_times_faster():
    whole = node_time(linear(2048, 2304, 2304), DEV, "bf16")
    col = node_time(linear(2048, 2304, 2304), DEV, "bf16", n_div=8)  # its output is 1/8 as wide: fewer tiles
    row = node_time(linear(2048, 2304, 2304), DEV, "bf16", k_div=8)
    assert (whole.fwd + whole.fixed_fwd) / 8 < col.fwd + col.fixed_fwd < whole.fwd + whole.fixed_fwd
    assert row.fwd + row.fixed_fwd >= (whole.fwd + whole.fixed_fwd) / 8 * (1 - 1e-9)


@pytest.mark.parametrize("legacy", [0.0, 96.0])
def test_linear_time_is_affine_in_the_micro_batch(legacy):
    """t(b) = b t_1 + fixed, exact for each saturation alone: 1 / s(M N) = 1 + h / (b M_1 N)."""
    dev = replace(DEV, gemm_half_mn=0.0 if legacy else DEV.gemm_half_mn, gemm_half_dim=legacy)
    one = node_time(linear(512, 4096, 4096), dev, "bf16")
    for b in (1, 2, 8):
        m = b * 512
        direct = 2 * m * 4096 * 4096 / (dev.peak("bf16") * gemm_efficiency(dev, m, 4096, 4096))
        assert b * one.fwd + one.fixed_fwd == pytest.approx(direct)
    assert one.fixed_fwd > 0


def test_fused_attention_by_its_curve_and_memory_bound_kernels():
    t = node_time(attention(1, 32, 2048, 128), DEV, "bf16")
    shape = saturation(2048, 500)  # 128-wide heads: the curve's reference width
    assert t.fwd == pytest.approx(4 * 32 * 2048**2 * 128 / (DEV.peak("bf16") * 0.6 * shape))
    assert t.bwd == pytest.approx(2.5 * 4 * 32 * 2048**2 * 128 / (DEV.peak("bf16") * 0.5 * shape))
    norm = {"kind": "layernorm", "shape": (1, 2048, 4096), "fwd_flops": 0, "bwd_flops": 0, "mem_bytes": 4e7}
    t = node_time(norm, DEV, "bf16")
    assert t.fwd == pytest.approx(4e7 / (DEV.mem_bandwidth * 0.8)) and t.bwd == pytest.approx(2 * t.fwd)


def test_fused_attention_runs_further_from_peak_on_short_sequences_and_narrow_heads():
    short, long = node_time(attention(64, 16, 512, 128), DEV, "bf16"), node_time(attention(1, 16, 4096, 128), DEV, "bf16")
    per_flop = short.fwd / (64 * 512**2), long.fwd / 4096**2
    assert per_flop[0] / per_flop[1] == pytest.approx((512 + 500) / 512 * 4096 / (4096 + 500))
    narrow = node_time(attention(1, 32, 4096, 64), DEV, "bf16")
    wide = node_time(attention(1, 16, 4096, 128), DEV, "bf16")
    assert narrow.fwd / wide.fwd == pytest.approx((64 + 40) / 64 * 128 / (128 + 40))
    unknown = {**attention(1, 16, 512, 128), "shape": ()}  # no shape: the long-sequence rate, never zero
    assert 0 < node_time(unknown, DEV, "bf16").fwd < node_time(attention(1, 16, 512, 128), DEV, "bf16").fwd


def test_a_kernel_that_skips_masked_blocks_does_about_half_the_work_of_a_causal_attention():
    full, causal = node_time(attention(1, 16, 8192, 128), DEV, "bf16"), node_time(attention(1, 16, 8192, 128, True), DEV, "bf16")
    assert causal.fwd / full.fwd == pytest.approx(0.5 + 128 / (2 * 8192))
    assert attention_work_share(128, True, 128) == 1.0  # one block: the diagonal is all there is
    whole = replace(DEV, attention_causal_block=0.0)  # a kernel computing the whole square under the mask
    assert node_time(attention(1, 16, 8192, 128, True), whole, "bf16").fwd == pytest.approx(full.fwd)


def test_attention_is_priced_by_the_kernel_the_stack_dispatches():
    h100, a100 = gpu_device("H100-80GB"), gpu_device("A100-80GB")
    assert sdpa_kernel(h100, "bf16", 128) == "cudnn"          # torch >= 2.11 on Hopper: cuDNN flash attention
    assert sdpa_kernel(h100, "bf16", 256) == "flash2"         # cuDNN's limit is 128 here
    assert sdpa_kernel(a100, "bf16", 128) == "flash2"
    assert sdpa_kernel(h100, "fp32", 128) == "efficient"      # flash kernels are 16-bit only
    assert sdpa_kernel(gpu_device("H100-80GB", "flash-2023"), "bf16", 128) == "flash2"
    assert sdpa_kernel(gpu_device("H100-80GB", "te-2024"), "bf16", 128) == "cudnn"
    assert sdpa_kernel(gpu_device("A100-80GB", "triton-2023"), "bf16", 128) == "flash_triton"  # MPT's Triton FA
    assert sdpa_kernel(DEVICES["cpu"], "fp32", 64) == "cpu"
    # a kernel with its own curve is priced by it
    slow = replace(DEV, other_attention={"flash2": {"efficiency": 0.3, "bwd_efficiency": 0.3, "half_seq": 0.0,
                                                    "half_dim": 0.0, "causal_block": 0.0}})
    assert node_time(attention(1, 8, 4096, 256), slow, "bf16").fwd == pytest.approx(
        4 * 8 * 4096**2 * 256 / (DEV.peak("bf16") * 0.3))


def test_a_device_without_shape_curve_runs_every_gemm_at_one_efficiency():
    for dims in ((8192, 12288, 12288), (64, 64, 64)):
        t = node_time(linear(*dims), FLAT, "bf16")
        assert t.fixed_fwd == pytest.approx(0, abs=1e-18)
        assert t.fwd == pytest.approx(2 * dims[0] * dims[1] * dims[2] / (FLAT.peak("bf16") * FLAT.matmul_efficiency))


def test_block_options_carry_the_shape_effect(graph_of):
    """The planner's per-node times (planner.enumerate.strategies.node_seconds) carry the curve: a column-parallel
    Linear of a small layer split 4 ways costs each rank more than 1/4 of the whole; without the curve
    exactly 1/4. The per-micro-batch GEMM term reaches the block options and their recompute re-runs."""
    g = graph_of("small-gpt")
    c = replace(parse_cluster("8xA100-80GB"), device=DEV)
    flat = replace(c, device=FLAT)
    fc1 = next(d for _, d in g.g.nodes(data=True) if d["kind"] == "linear" and d["module"] == "blocks.0.mlp.fc1")
    whole, shard = node_seconds(fc1, c, "bf16"), node_seconds(fc1, c, "bf16", 4, "colwise")
    assert shard.fwd + shard.fixed_fwd > 1.1 * (whole.fwd + whole.fixed_fwd) / 4
    assert node_seconds(fc1, flat, "bf16", 4, "colwise").fwd == pytest.approx(node_seconds(fc1, flat, "bf16").fwd / 4)
    rep, split = replicate_option(g, "blocks.0", c, 1), tensor_option(g, "blocks.0", c, 4)
    assert rep.fixed_s > 0 and split.refixed_by_policy["full"] > 0 and split.refixed_by_policy["none"] == 0
    assert replicate_option(g, "blocks.0", flat, 1).fixed_s == pytest.approx(0, abs=1e-15)


def test_calibrate_fits_the_gemm_curve_it_is_given():
    """`partita calibrate` on a CPU fits e_max and x_half to square matmuls; synthetic rates from known
    parameters come back."""
    from partita.costmodel.calibrate.fit import fit_gemm_curve
    peak, e, half = 300e12, 0.8, 128.0
    rows = [{"n": n, "flops_per_s": peak * e * (n / (n + half)) ** 3} for n in (256, 512, 1024, 2048, 4096, 8192)]
    fit = fit_gemm_curve(rows, peak)
    assert fit["gemm_half_dim"] == pytest.approx(half, rel=0.05)
    assert fit["matmul_efficiency_of_measured_peak"] == pytest.approx(e, rel=0.02)
    flat = fit_gemm_curve([{"n": n, "flops_per_s": 0.5 * peak} for n in (256, 1024, 4096)], peak)
    assert flat["gemm_half_dim"] == 0.0 and flat["matmul_efficiency_of_measured_peak"] == pytest.approx(0.5)


def test_causal_is_recorded_by_capture(graph_of):
    # the presets' attention is causal (is_causal=True), HF llama's too, BERT's not
    for model, expected in (("tiny-llama", True), ("hf:llama:num_hidden_layers=1,hidden_size=64,num_attention_heads=4,"
                                                   "vocab_size=128,intermediate_size=128", True),
                            ("hf:bert:num_hidden_layers=1,hidden_size=64,num_attention_heads=4,vocab_size=128,"
                             "intermediate_size=128", False)):
        g = graph_of(model)
        flags = {bool(d.get("causal")) for _, d in g.g.nodes(data=True) if d["kind"] == "scaled_dot_product_attention"}
        assert flags == {expected}, model


def test_reading_a_parameter_costs_no_kernel():
    # transformers' MoE experts are 3-d parameters read by get_attr: their bytes are the GEMM's to read
    experts = {"kind": "get_attr", "op": "get_attr", "shape": (128, 1536, 2048), "fwd_flops": 0, "bwd_flops": 0,
               "mem_bytes": 805306368}
    assert node_time(experts, DEV, "bf16") == node_time({**experts, "mem_bytes": 0}, DEV, "bf16")
    assert node_time(experts, DEV, "bf16").fwd == 0


def test_a_cluster_on_another_stack_takes_that_stacks_kernel_constants():
    from partita.costmodel.hardware import cluster_on_stack, kernel_constants
    c = parse_cluster("2x8xH100-80GB")
    te = cluster_on_stack(c, "te-2024")
    assert c.device.stack == "pytorch" and te.device.stack == "te-2024"
    assert te.device.matmul_efficiency == kernel_constants("hopper", "te-2024")["matmul_efficiency"]
    assert (te.device.memory_bytes, te.num_devices) == (c.device.memory_bytes, c.num_devices)
    # a device whose kernels were measured keeps them: only the stack's name (its overlaps) changes
    cpu = cluster_on_stack(parse_cluster("2xcpu"), "te-2024")
    assert cpu.device.matmul_efficiency == DEVICES["cpu"].matmul_efficiency and cpu.device.stack == "te-2024"


def test_inside_a_step_memory_bound_operators_run_at_the_step_efficiency_and_gemms_and_attention_at_their_own():
    """Kernel timings (costmodel.hardware.kernel_fit) are isolated kernels. On the H200, GEMMs and attention ran inside
    whole steps at their timed rate (a 32K-token step, half attention, took what its kernels' sum says),
    while eager elementwise work did not (compiled layers, fusing it, ran 22% faster): Device.step_efficiency
    slows the memory-bound operators only (benchmarks.fit fits it to whole steps)."""
    from partita.costmodel.price.kernels import isolated_node_time
    slow = replace(DEV, step_efficiency=0.5)
    for d in (linear(4096, 4096, 4096), attention(1, 16, 4096, 128, True), bmm(16, 1024, 1024, 1024)):
        assert node_time(d, slow, "bf16") == isolated_node_time(d, slow, "bf16") == node_time(d, DEV, "bf16")
    add = {"kind": "add", "shape": (1, 4096, 4096), "fwd_flops": 0, "bwd_flops": 0, "mem_bytes": 1e8}
    t, alone = node_time(add, slow, "bf16"), isolated_node_time(add, slow, "bf16")
    assert t.fwd == pytest.approx(alone.fwd / 0.5) and t.bwd == pytest.approx(alone.bwd / 0.5)
    assert alone == node_time(add, DEV, "bf16")
    # a compute-bound operator priced outside the GEMM curve (a convolution: many FLOPs per byte) keeps its rate
    conv = {"kind": "convolution", "shape": (8, 256, 56, 56), "fwd_flops": 1e12, "bwd_flops": 2e12, "mem_bytes": 1e7}
    assert node_time(conv, slow, "bf16") == node_time(conv, DEV, "bf16")


def bmm(batch, m, n, k):
    return {"kind": "bmm", "shape": (batch, m, n), "fwd_flops": 2 * batch * m * n * k,
            "bwd_flops": 4 * batch * m * n * k, "mem_bytes": 2 * batch * (m * k + k * n + m * n)}


def test_a_batched_product_counts_every_matrix_of_its_launch():
    """The matrices of one bmm share the SMs: their output tiles together fill the GPU. Per sample the time
    is affine in the micro-batch -- the efficiency curve at b samples' matrices, split at b = 1 and 2."""
    t = node_time(bmm(16, 1024, 1024, 1024), DEV, "bf16")  # one sample's 16 heads (compute-bound: 341 FLOP/byte)
    f = 2 * 16 * 1024 ** 3
    for b in (1, 4):
        whole = b * t.fwd + t.fixed_fwd
        assert whole == pytest.approx(b * f / (DEV.peak("bf16") * gemm_efficiency(DEV, 1024, 1024, 1024, 16 * b)))
    assert t.fixed_fwd > 0  # a launch with more matrices runs nearer e_max


def test_tiny_batched_matrices_are_priced_by_their_bytes():
    """A DLRM's feature interaction, 27 x 128 @ 128 x 27 per sample: 186,624 FLOPs against 15 KB. Priced by
    tensor-core tiles it took 15 ms of a 16 ms step at 64K samples; it is memory-bound."""
    d = bmm(1, 27, 27, 128)
    t = node_time(d, DEV, "bf16")
    bw = DEV.mem_bandwidth * DEV.mem_efficiency
    assert t.fwd == pytest.approx(d["mem_bytes"] / bw) and t.bwd == pytest.approx(2 * d["mem_bytes"] / bw)
    assert t.fixed_fwd == t.fixed_bwd == 0.0

"""Compute by kernel kind and shape (costmodel.kernels): GEMMs on a shape-dependent roofline, fused
attention at its own efficiency, everything else memory-bound."""
from dataclasses import replace

import pytest

from partita.costmodel.hardware import DEVICES
from partita.costmodel.kernels import CAUSAL_SHARE, node_time, saturation
from partita.planner.strategies import node_seconds, replicate_option, tensor_option
from partita.costmodel.hardware import parse_cluster

A100 = DEVICES["A100-80GB"]
H100 = DEVICES["H100-80GB"]


def linear(m, n, k):
    return {"kind": "linear", "shape": (1, m, n), "fwd_flops": 2 * m * n * k, "bwd_flops": 4 * m * n * k,
            "mem_bytes": 2 * (m * k + m * n)}


def test_a_large_gemm_runs_near_the_device_efficiency_and_a_small_dimension_slows_it():
    big = node_time(linear(8192, 12288, 12288), A100, "bf16")
    rate = 2 * 8192 * 12288 * 12288 / (big.fwd + big.fixed_fwd)
    assert 0.9 * A100.matmul_efficiency < rate / A100.peak("bf16") < A100.matmul_efficiency
    # the same FLOPs with K = 128 (an attention head's width) run well below it
    thin = node_time(linear(8192, 12288, 128), A100, "bf16")
    thin_rate = 2 * 8192 * 12288 * 128 / (thin.fwd + thin.fixed_fwd)
    assert thin_rate < 0.6 * rate
    # the backward's two products have the same three sizes: the same efficiency, twice the FLOPs
    assert big.bwd == pytest.approx(2 * big.fwd)


def test_a_tensor_parallel_shard_is_less_than_t_times_faster():
    whole = node_time(linear(2048, 2304, 2304), A100, "bf16")
    col = node_time(linear(2048, 2304, 2304), A100, "bf16", n_div=8)
    row = node_time(linear(2048, 2304, 2304), A100, "bf16", k_div=8)
    for shard in (col, row):
        assert whole.fwd / 8 < shard.fwd < whole.fwd
    assert col.fwd == pytest.approx(row.fwd)  # s(N) s(K) is symmetric


def test_linear_time_is_affine_in_the_micro_batch():
    """t(b) = b t_1 + fixed: the per-micro-batch term is what the token dimension's saturation adds."""
    one = node_time(linear(512, 4096, 4096), A100, "bf16")
    for b in (1, 2, 8):
        direct = 2 * b * 512 * 4096 * 4096 / (A100.peak("bf16") * A100.matmul_efficiency * saturation(b * 512, A100.gemm_half_dim)
                                              * saturation(4096, A100.gemm_half_dim) ** 2)
        assert b * one.fwd + one.fixed_fwd == pytest.approx(direct)


def test_attention_and_memory_bound_kernels():
    att = {"kind": "scaled_dot_product_attention", "shape": (1, 32, 2048, 128), "fwd_flops": 1e12,
           "bwd_flops": 2.5e12, "mem_bytes": 1e8}
    t = node_time(att, A100, "bf16")
    rate = A100.peak("bf16") * A100.attention_efficiency * saturation(2048, A100.attention_half_seq)
    assert t.fwd == pytest.approx(1e12 / rate)
    norm = {"kind": "layernorm", "shape": (1, 2048, 4096), "fwd_flops": 0, "bwd_flops": 0, "mem_bytes": 4e7}
    t = node_time(norm, A100, "bf16")
    assert t.fwd == pytest.approx(4e7 / (A100.mem_bandwidth * A100.mem_efficiency)) and t.bwd == pytest.approx(2 * t.fwd)


def test_fused_attention_runs_further_from_peak_on_short_sequences():
    """The same FLOPs cost more in a short-sequence kernel: seq / (seq + half) of the long-sequence
    efficiency, from the query length of the node's (batch, heads, seq, head_dim) output."""
    assert A100.attention_half_seq > 0 and H100.attention_half_seq > 0
    def att(seq):
        return {"kind": "scaled_dot_product_attention", "shape": (1, 16, seq, 128), "fwd_flops": 1e12,
                "bwd_flops": 2.5e12, "mem_bytes": 0}
    short, long = node_time(att(512), A100, "bf16"), node_time(att(65536), A100, "bf16")
    half = A100.attention_half_seq
    assert short.fwd / long.fwd == pytest.approx((512 + half) / 512 * 65536 / (65536 + half))
    assert short.bwd / short.fwd == pytest.approx(2.5)
    flat = replace(A100, attention_half_seq=0.0)
    assert node_time(att(512), flat, "bf16").fwd == pytest.approx(node_time(att(65536), flat, "bf16").fwd)
    unknown = {**att(512), "shape": ()}  # no query length: the long-sequence rate, never a zero rate
    assert node_time(unknown, A100, "bf16").fwd == pytest.approx(node_time(att(512), flat, "bf16").fwd)


def test_a_device_without_shape_curve_runs_every_gemm_at_one_efficiency():
    flat = replace(A100, gemm_half_dim=0.0)
    for dims in ((8192, 12288, 12288), (64, 64, 64)):
        t = node_time(linear(*dims), flat, "bf16")
        assert t.fixed_fwd == 0
        assert t.fwd == pytest.approx(2 * dims[0] * dims[1] * dims[2] / (A100.peak("bf16") * A100.matmul_efficiency))


def test_block_options_carry_the_shape_effect(graph_of):
    """The planner's per-node times (planner.strategies.node_seconds) carry the curve: a column-parallel
    Linear of a small layer split 4 ways costs each rank more than 1/4 of the whole; without the curve
    exactly 1/4. The per-micro-batch GEMM term reaches the block options and their recompute re-runs."""
    g = graph_of("small-gpt")
    c = parse_cluster("8xA100-80GB")
    flat = replace(c, device=replace(c.device, gemm_half_dim=0.0))
    fc1 = next(d for _, d in g.g.nodes(data=True) if d["kind"] == "linear" and d["module"] == "blocks.0.mlp.fc1")
    whole, shard = node_seconds(fc1, c, "bf16"), node_seconds(fc1, c, "bf16", 4, "colwise")
    assert shard.fwd > 1.1 * whole.fwd / 4
    assert node_seconds(fc1, flat, "bf16", 4, "colwise").fwd == pytest.approx(node_seconds(fc1, flat, "bf16").fwd / 4)
    rep, split = replicate_option(g, "blocks.0", c, 1), tensor_option(g, "blocks.0", c, 4)
    assert rep.fixed_s > 0 and split.refixed_by_policy["full"] > 0 and split.refixed_by_policy["none"] == 0
    assert replicate_option(g, "blocks.0", flat, 1).fixed_s == 0


def test_calibrate_fits_the_gemm_curve_it_is_given():
    """`partita calibrate` on a GPU fits e_max and x_half to square matmuls; synthetic rates from known
    parameters come back."""
    from partita.costmodel.calibrate_fit import fit_gemm_curve
    peak, e, half = 300e12, 0.8, 128.0
    rows = [{"n": n, "flops_per_s": peak * e * (n / (n + half)) ** 3} for n in (256, 512, 1024, 2048, 4096, 8192)]
    fit = fit_gemm_curve(rows, peak)
    assert fit["gemm_half_dim"] == pytest.approx(half, rel=0.05)
    assert fit["matmul_efficiency_of_measured_peak"] == pytest.approx(e, rel=0.02)
    flat = fit_gemm_curve([{"n": n, "flops_per_s": 0.5 * peak} for n in (256, 1024, 4096)], peak)
    assert flat["gemm_half_dim"] == 0.0 and flat["matmul_efficiency_of_measured_peak"] == pytest.approx(0.5)


def test_a_causal_attention_is_priced_at_its_causal_share(graph_of):
    attn = {"kind": "scaled_dot_product_attention", "shape": (1, 16, 4096, 128), "fwd_flops": 4 * 16 * 4096**2 * 128,
            "bwd_flops": 10 * 16 * 4096**2 * 128, "mem_bytes": 0}
    full, causal = node_time(attn, A100, "bf16"), node_time({**attn, "causal": True}, A100, "bf16")
    assert causal.fwd == pytest.approx(full.fwd * CAUSAL_SHARE) and causal.bwd == pytest.approx(full.bwd * CAUSAL_SHARE)
    # capture records it: the presets' attention is causal (is_causal=True), HF llama's too, BERT's not
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
    assert node_time(experts, A100, "bf16") == node_time({**experts, "mem_bytes": 0}, A100, "bf16")
    assert node_time(experts, A100, "bf16").fwd == 0

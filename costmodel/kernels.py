"""Compute as kernels run: the seconds one operator takes on a device, by kernel kind and shape.

One efficiency for every operator (the first cost model: 0.75 of peak) makes a tp=8 shard of a small
layer, a micro-batch of one, and a 12288-wide GEMM equally fast per FLOP. They are not. Three kinds:

GEMMs (a Linear, a matmul / bmm): a roofline on the tensor cores with a shape-dependent efficiency,

    t = F / (peak * e_max * s(M) s(N) s(K)),     s(x) = x / (x + x_half)

for an (M x K) @ (K x N) product (batched products: per matrix, the batch multiplies F). e_max is what
cuBLAS sustains on large, aligned shapes (`Device.matmul_efficiency`); x_half (`Device.gemm_half_dim`)
is the size at which one dimension alone halves it. A dimension far above x_half costs nothing; a small
one -- a tensor-parallel shard of a narrow layer, an attention head's K = 64..128 in an unfused
q k^T, a micro-batch of a few tokens -- runs further from peak, the saturation that NVIDIA's GEMM
guide describes through tile and wave quantisation (NVIDIA Deep Learning Performance Guide, "Matrix
Multiplication Background", 2023; Anthony et al. 2024, "The Case for Co-Designing Model Architectures
with Hardware", measure A100 GEMM throughput rising with every dimension of transformer shapes). The
product of three saturations is symmetric in M, N, K, so a GEMM's two backward products (dX, dW: the
same three sizes in other roles) run at the forward's efficiency.
For a Linear the token dimension M grows with the micro-batch b: with M = b M_1,

    t(b) = b F_1 / (peak e_max s(N) s(K))  +  F_1 x_half / (M_1 peak e_max s(N) s(K))

-- affine in b: a per-sample term and a per-micro-batch term (`NodeTime.fixed_*`), which the planner
charges once per micro-batch like a kernel launch. A batched matmul's M is the sequence, independent
of b, so its efficiency is fixed per sample.

A grouped GEMM (a mixture-of-experts layer's experts, `groups` = E) is E such products, each on its
expert's rows: M = routed rows / E under balanced routing, so it scales with the micro-batch as a
Linear does.

Fused attention (scaled_dot_product_attention: FlashAttention-style kernels): F / (peak * e_attn),
`Device.attention_efficiency` (FlashAttention-2, Dao 2023: 50-73% of A100 peak forward, less in
backward; on H100 FlashAttention-2 reaches 35-50% of the dense peak). F is the full s x s product
(torch's formula, and the model FLOPs MFU counts), causal or not. A causal kernel skips the score blocks
above the diagonal (FlashAttention-2 Sec. 3.1.1) and its papers count causal TFLOP/s on half the FLOPs,
so CAUSAL_SHARE = 0.5 would be the kernel's own story. Measured against the published runs, it is not
what PyTorch training reaches: priced at 0.5, the eager-PyTorch rows of benchmarks.published (llm-foundry,
fms-fsdp, torchtitan) come out faster than measured -- llm-foundry's 16k-64k-token rows by 50-93%, fms
by 16% at the median against 7.5% -- while only Llama 3's in-house 128k-token run is closer (-12% against
-37%). So the efficiencies stand for attention as trained, on the full FLOPs (CAUSAL_SHARE = 1); the
capture still records `causal` on each attention node.

A fused attention kernel runs further from peak on short sequences: each query block's fixed work
(loading it, rescaling the running softmax, writing the output; under a causal mask, the diagonal block
computed whole) is amortised over the key blocks it streams, s / B_c of them. So its efficiency is a
saturation in the query length s of the node's (..., heads, s, head_dim) output,

    e_attn(s) = e_attn * s / (s + s_half)          (`Device.attention_half_seq` = s_half)

(FlashAttention-2's benchmarks rise over 512 to 16k tokens on A100 and H100). One curve per GPU
generation, fitted to llm-foundry's sweeps of one model over 512 to 65536 tokens: with a flat e_attn the
published errors ran from about -10% at 64k tokens to +25% at 512 within the same model and GPU, a trend
no per-token term can remove. Under context parallelism the node keeps the whole sequence's length:
each rank's query chunk streams every rank's keys (torch's all-gather context parallelism).

Everything else (norms, activations, residual adds, softmax, dropout, casts): memory-bound, bytes at
the achievable fraction of HBM bandwidth (`Device.mem_efficiency`; STREAM-like copies reach ~80-90% of
the datasheet figure), or its FLOPs at e_max if that is longer (a roofline):

    t = max(F / (peak e_max), bytes / (bandwidth e_mem))       (backward: twice the bytes)

A device with gemm_half_dim = 0 (a calibrated resource list, the `cpu` preset) has s = 1: one
efficiency for every GEMM, as `partita calibrate` measures it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

GEMM_KINDS = {"linear", "grouped_mm"}
BATCHED_GEMM_KINDS = {"matmul", "bmm", "baddbmm"}
ATTENTION_KINDS = {"scaled_dot_product_attention"}
CAUSAL_SHARE = 1.0
"""Of a causal attention's full s x s FLOPs, the share priced (module docstring: 0.5 is the kernel's own
count, 1 what the published PyTorch runs measure at these efficiencies)."""


@dataclass(frozen=True)
class NodeTime:
    """Seconds of one operator for one rank: per sample (times the micro-batch) and per micro-batch."""

    fwd: float
    bwd: float
    fixed_fwd: float = 0.0
    fixed_bwd: float = 0.0


def saturation(x: float, half: float) -> float:
    """s(x) = x / (x + x_half): the share of e_max a GEMM dimension of size x allows (module docstring)."""
    if half <= 0:
        return 1.0
    return x / (x + half) if x > 0 else 0.0


def gemm_dims(d: dict) -> tuple[float, float, float, float] | None:
    """(batch, M, N, K) of a GEMM-like node per traced sample, from its output shape and forward FLOPs
    (2 batch M N K), or None when the node is no GEMM or the FLOPs are unknown."""
    shape, flops = d.get("shape") or (), d.get("fwd_flops", 0)
    if not flops or len(shape) < 2:
        return None
    if d["kind"] == "grouped_mm":  # one GEMM per expert, each on its share of the routed rows
        groups = d.get("groups") or 1
        m, n, batch = math.prod(shape[:-1]) / groups, shape[-1], groups
    elif d["kind"] in GEMM_KINDS:
        m, n, batch = math.prod(shape[:-1]), shape[-1], 1
    elif d["kind"] in BATCHED_GEMM_KINDS:
        m, n, batch = shape[-2], shape[-1], math.prod(shape[:-2])
    else:
        return None
    if not (m and n and batch):
        return None
    return batch, m, n, flops / (2 * batch * m * n)


def attention_saturation(d: dict, half_seq: float) -> float:
    """s(seq) of an attention node (module docstring), seq the query length of its (..., heads, seq,
    head_dim) output; 1 where the shape is unknown (priced at the long-sequence rate, never at zero)."""
    shape = d.get("shape") or ()
    return saturation(shape[-2], half_seq) if len(shape) >= 2 and shape[-2] else 1.0


def node_time(d: dict, device, dtype: str, *, share: float = 1.0,
              n_div: int = 1, k_div: int = 1) -> NodeTime:
    """Seconds of node `d` (costmodel.graph attributes) for one rank doing `share` of its work.

    A tensor-parallel split passes the dimension it cuts: a column-parallel Linear divides N by t
    (`n_div`), a row-parallel one K (`k_div`); other sharded nodes (heads, sequence) do 1/t of the
    same-shaped work (`share` = 1/t, no change of efficiency).
    """
    if d.get("op") in ("get_attr", "placeholder"):
        return NodeTime(0.0, 0.0)  # reading a parameter, buffer or input launches no kernel
    peak = device.peak(dtype)
    e_max = device.matmul_efficiency
    dims = gemm_dims(d)
    if dims is not None:
        batch, m, n, k = dims
        n, k = n / n_div, k / k_div
        half = device.gemm_half_dim
        rate = peak * e_max * saturation(n, half) * saturation(k, half)
        f_share = share / (n_div * k_div)
        fwd_flops, bwd_flops = d["fwd_flops"] * f_share, d["bwd_flops"] * f_share
        if d["kind"] in GEMM_KINDS:
            # t(b) = b F1 / rate + F1 x_half / (M1 rate): per sample, then per micro-batch
            fixed = half / m if half > 0 else 0.0
            return NodeTime(fwd_flops / rate, bwd_flops / rate, fwd_flops / rate * fixed, bwd_flops / rate * fixed)
        rate *= saturation(m, half)
        return NodeTime(fwd_flops / rate, bwd_flops / rate)
    fwd_flops, bwd_flops = d["fwd_flops"] * share, d["bwd_flops"] * share
    if d["kind"] in ATTENTION_KINDS and fwd_flops:
        rate = (peak * (device.attention_efficiency or e_max) * attention_saturation(d, device.attention_half_seq)
                / (CAUSAL_SHARE if d.get("causal") else 1.0))
        return NodeTime(fwd_flops / rate, bwd_flops / rate)
    bw = device.mem_bandwidth * device.mem_efficiency
    mem = d["mem_bytes"] * share
    return NodeTime(max(fwd_flops / (peak * e_max), mem / bw), max(bwd_flops / (peak * e_max), 2 * mem / bw))

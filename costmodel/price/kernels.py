"""Compute as kernels run: the seconds one operator takes on a device, by kernel kind and shape.

One efficiency for every operator makes a tp=8 shard of a small layer, a micro-batch of one, and a
12288-wide GEMM equally fast per FLOP. They are not. Three kinds, each with a curve whose constants are
fitted to measurements by a program (costmodel.hardware.kernel_fit on kernel timings; benchmarks.fit on published
training runs), one set per GPU generation and software stack (costmodel.hardware.stacks), never per model:

GEMMs (a Linear, a matmul / bmm): a roofline on the tensor cores with a shape-dependent efficiency,

    t = F / (peak * e_max * s(W, h_mn)),   W = M N max(1, K / k_split),   s(x, h) = x / (x + h)

for an (M x K) @ (K x N) product (batched products -- a bmm, a grouped GEMM -- count every matrix of the
launch, W = batch M N max(1, K / k_split), and the batch multiplies F; a bmm takes the larger of that and
its bytes at the memory-bound rate, a roofline that binds for tiny matrices). e_max is what
cuBLAS sustains on large shapes (`Device.matmul_efficiency`). The output's M N elements are cut into
tiles spread over the SMs: a small output fills few of them (wave quantisation: NVIDIA Deep Learning
Performance Guide, "Matrix Multiplication Background", 2023), halving the rate at W = h_mn
(`Device.gemm_half_mn`), unless the inner K is deep enough to split: cuBLAS then cuts K into slices of
about k_split (`Device.gemm_split_k`) computed in parallel and summed (split-K; the same guide), so the
work units are M N K / k_split. Fitted to the H200 timings of GPU-MEASUREMENTS.md (M = 256..32768, N and
K = 1024..128256; costmodel.hardware.kernel_fit). Each launch also costs `Device.op_latency`, charged by the
planner per launch. A resource list written before this form may carry `gemm_half_dim` x: the older
s(M, x) s(N, x) s(K, x), still applied (0 in the presets).
A GEMM's backward is two products with the same three sizes in other roles (dX: M x N @ N x K; dW:
N x M @ M x K), each priced by the same curve.

Alignment. cuBLAS's fast tensor-core kernels read and write rows that start on 16-byte boundaries: in
16-bit precision every leading dimension a multiple of 8 elements (NVIDIA Deep Learning Performance Guide,
"Matrix Multiplication Background", Tensor Core requirements). A Linear's operands are row-major, so its
leading dimensions are K and N, never the token count M: the forward reads x and W along K and writes its
output along N; both backward products read dY along N and W or x along K, and write along K. A product that
writes unaligned rows runs at `Device.gemm_unaligned_write_efficiency` of the rate above, one that only reads
them at `Device.gemm_unaligned_read_efficiency` (ALIGN_BYTES / element size; fitted to kernel timings of
the same products at both sizes; 1 where none were measured: priced as aligned). On the H200 a GPT-2 LM
head (N = 50,257) ran 6.1x slower forward (an unaligned write) and 4.6x slower backward (unaligned reads)
than at 50,304 (benchmarks/data/kernels_h200_torch2.11.json, the probe rows). Measured on Linear layers
only: a batched matmul is priced as aligned.

For a Linear the token dimension M grows with the micro-batch b, M = b M_1, and W with it: 1 / s(W, h) =
1 + h / W makes the forward F + 2 h K / max(1, K / k_split) -- affine in b: a per-sample term and a
per-micro-batch term (`NodeTime.fixed_*`), which the planner charges once per micro-batch like a kernel launch. The node's time at b = 1 and b = 2
gives both (exact for each saturation alone). A batched matmul's M is the sequence, independent of b,
but its batch (b x heads) is not: the same split. A grouped GEMM (a mixture-of-experts layer's experts, `groups` =
E) is E such products, each on its expert's rows: M = routed rows / E under balanced routing.

Fused attention (scaled_dot_product_attention). Which kernel runs is the stack's choice
(`sdpa_kernel`): torch dispatches cuDNN's flash attention on Hopper in 16-bit precision (head_dim <= 128),
FlashAttention-2 on Ampere (head_dim <= 256), the memory-efficient kernel for fp32 or wider heads
(torch/nn/attention, sdp_utils); other stacks run their own kernel. Each kernel's curve:

    t_fwd = W / (peak * e_fwd * s(seq, h_seq) * r(d)),   t_bwd = 2.5 W / (peak * e_bwd * s(seq, h_seq) * r(d)),
    r(d) = s(d, h_d) / s(128, h_d)

W is the work the kernel does: the full s x s product 4 b h s^2 d (torch's FLOP formula, the model FLOPs
MFU counts); under a causal mask a kernel that skips the key blocks above the diagonal (FlashAttention-2,
Dao 2023, Sec. 3.1.1; cuDNN's and the memory-efficient kernel likewise: GPU-MEASUREMENTS.md measures
causal at 1.6-1.8x the non-causal rate on the full count) computes n (n + 1) / 2 of n^2 blocks of B rows,
W = 4 b h s^2 d (1/2 + B / (2 s)) (`attention_causal_block` = B; 0: a kernel computing the whole square).
e_fwd and e_bwd differ (a flash backward recomputes the scores and runs further from peak); s(seq) is a
kernel's fixed work per query block (loading it, rescaling the running softmax, writing out) amortised
over the key blocks it streams; r(d) the head width each tile multiplies (d = 64 runs slower per FLOP
than 128), relative to 128, so e_fwd and e_bwd are the efficiencies of 128-wide heads on long sequences. Under context parallelism the node keeps the whole sequence's length: each rank's query chunk
streams every rank's keys (torch's all-gather context parallelism).

Everything else (norms, activations, residual adds, softmax, dropout, casts): memory-bound, bytes at
the achievable fraction of HBM bandwidth (`Device.mem_efficiency`), or its FLOPs at e_max if that is
longer (a roofline):

    t = max(F / (peak e_max), bytes / (bandwidth e_mem))       (backward: twice the bytes)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

GEMM_KINDS = {"linear", "grouped_mm"}
ALIGN_BYTES = 16
"""Row alignment cuBLAS's tensor-core kernels need (module docstring: Alignment)."""
ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
BATCHED_GEMM_KINDS = {"matmul", "bmm", "baddbmm"}
ATTENTION_KINDS = {"scaled_dot_product_attention"}
SDPA_BWD_OVER_FWD = 2.5
"""Backward FLOPs of attention over its forward (torch's FLOP formulas: the backward recomputes the
scores, 5 batched matmuls against 2)."""
ATTENTION_CURVE_FIELDS = ("efficiency", "bwd_efficiency", "half_seq", "half_dim", "causal_block")
REFERENCE_HEAD_DIM = 128
"""Head width at which an attention curve's efficiencies are stated (the s(d) factor is relative to it)."""
FORWARD_LAUNCHES = 1
"""Kernels a node's forward launches (each costs Device.op_latency beyond its FLOPs and bytes)."""
BACKWARD_LAUNCHES = 2
"""Kernels the backward of a launching node takes (its input and weight gradients, or an elementwise
gradient and its accumulation)."""


@dataclass(frozen=True)
class NodeTime:
    """Seconds of one operator for one rank: per sample (times the micro-batch) and per micro-batch."""

    fwd: float
    bwd: float
    fixed_fwd: float = 0.0
    fixed_bwd: float = 0.0


def saturation(x: float, half: float) -> float:
    """s(x) = x / (x + x_half) (module docstring); 1 when there is no curve (half <= 0)."""
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


def gemm_efficiency(device, m: float, n: float, k: float, count: float = 1.0) -> float:
    """The fraction of peak `count` (m x k) @ (k x n) products of one launch reach (module docstring):
    their output tiles share the SMs, so W counts them all."""
    legacy = device.gemm_half_dim
    split = max(1.0, k / device.gemm_split_k) if device.gemm_split_k > 0 else 1.0
    return (device.matmul_efficiency * saturation(count * m * n * split, device.gemm_half_mn)
            * saturation(m, legacy) * saturation(n, legacy) * saturation(k, legacy))


def aligned(dtype: str, *dims: float) -> bool:
    """Whether leading dimensions `dims` are whole multiples of ALIGN_BYTES (module docstring: Alignment)."""
    step = ALIGN_BYTES / ELEMENT_BYTES.get(dtype, 2)
    return all(abs(x / step - round(x / step)) < 1e-9 for x in dims)


def alignment_factors(device, dtype: str, n: float, k: float) -> tuple[float, float]:
    """The fraction of its rate a Linear's forward and each backward product keep (module docstring:
    Alignment): the forward writes along N and reads along K, the backward's two write along K and read N."""
    read, write = device.gemm_unaligned_read_efficiency, device.gemm_unaligned_write_efficiency
    n_ok, k_ok = aligned(dtype, n), aligned(dtype, k)
    fwd = min(1.0 if n_ok else write, 1.0 if k_ok else read)
    bwd = min(1.0 if k_ok else write, 1.0 if n_ok else read)
    return fwd, bwd


def unaligned_linears(graph, dtype: str) -> list[tuple[str, int, int]]:
    """(module, K, N) of each Linear node of `graph` (costmodel.capture.graph.OpGraph) whose K or N is unaligned
    in `dtype` (module docstring: Alignment), in graph order."""
    out = []
    for _, d in graph.g.nodes(data=True):
        dims = gemm_dims(d) if d.get("kind") == "linear" else None
        if dims is not None and not aligned(dtype, dims[2], dims[3]):
            out.append((d.get("module") or "", round(dims[3]), round(dims[2])))
    return out


def gemm_seconds(device, dtype: str, m: float, n: float, k: float, batch: float = 1.0,
                 linear: bool = True) -> tuple[float, float]:
    """(forward, backward) seconds of one launch of `batch` (m x k) @ (k x n) products: the forward, and the
    backward's dX (m x n @ n x k) and dW (n x m @ m x k), each at its own shape's efficiency; a `linear`'s
    (row-major operands) at its `alignment_factors` of that."""
    peak = device.peak(dtype)
    f = 2 * batch * m * n * k
    keep_fwd, keep_bwd = alignment_factors(device, dtype, n, k) if linear else (1.0, 1.0)
    fwd = f / (peak * keep_fwd * gemm_efficiency(device, m, n, k, batch))
    bwd = (f / (peak * keep_bwd * gemm_efficiency(device, m, k, n, batch))
           + f / (peak * keep_bwd * gemm_efficiency(device, n, k, m, batch)))
    return fwd, bwd


def sdpa_kernel(device, dtype: str, head_dim: float) -> str:
    """The fused-attention kernel the device's stack runs for this dtype and head width (module docstring)."""
    from partita.costmodel.hardware.stacks import get_stack
    if device.name == "cpu":
        return "cpu"
    kind = get_stack(device.stack).attention
    sixteen = dtype in ("bf16", "fp16")
    if kind == "torch":  # torch's SDPA priority on CUDA: cuDNN (Hopper+), flash, memory-efficient
        if sixteen and device.generation in ("hopper",) and head_dim <= 128:
            return "cudnn"
        if sixteen and device.generation in ("ampere", "hopper") and head_dim <= 256:
            return "flash2"
        return "efficient"
    return kind if sixteen else "efficient"


def attention_curve(device, kernel: str) -> dict:
    """The curve constants of `kernel` on `device`: its own where the device lists it, else the device's
    attention_* fields (the kernel its stack runs for training)."""
    own = (device.other_attention or {}).get(kernel)
    if own:
        return own
    return {"efficiency": device.attention_efficiency or device.matmul_efficiency,
            "bwd_efficiency": device.attention_bwd_efficiency or device.attention_efficiency or device.matmul_efficiency,
            "half_seq": device.attention_half_seq, "half_dim": device.attention_half_dim,
            "causal_block": device.attention_causal_block}


def attention_work_share(seq: float, causal: bool, block: float) -> float:
    """Share of the full s x s product a kernel computes: 1, or (1/2 + B / (2 s)) when it skips the blocks
    above a causal mask's diagonal (module docstring)."""
    if not causal or block <= 0 or seq <= 0:
        return 1.0
    return min(1.0, 0.5 + block / (2 * seq))


def curve_seconds(curve: dict, peak: float, fwd_flops: float, bwd_flops: float, seq: float, head_dim: float,
                  causal: bool) -> tuple[float, float]:
    """(forward, backward) seconds of fused attention by one kernel's `curve`, its full-square FLOPs given."""
    work = attention_work_share(seq, causal, curve["causal_block"])
    # an unknown shape (0) is priced at the long-sequence rate and the reference head width: never at zero
    width = saturation(head_dim, curve["half_dim"]) / saturation(REFERENCE_HEAD_DIM, curve["half_dim"]) if head_dim else 1.0
    shape = (saturation(seq, curve["half_seq"]) if seq else 1.0) * width
    return (fwd_flops * work / (peak * curve["efficiency"] * shape),
            bwd_flops * work / (peak * (curve["bwd_efficiency"] or curve["efficiency"]) * shape))


def attention_seconds(device, dtype: str, fwd_flops: float, bwd_flops: float, seq: float, head_dim: float,
                      causal: bool, kernel: str | None = None) -> tuple[float, float]:
    """(forward, backward) seconds of fused attention on `device`: by `kernel`, or the one its stack runs."""
    kernel = kernel or sdpa_kernel(device, dtype, head_dim)
    return curve_seconds(attention_curve(device, kernel), device.peak(dtype), fwd_flops, bwd_flops, seq, head_dim,
                         causal)


def node_time(d: dict, device, dtype: str, *, share: float = 1.0,
              n_div: int = 1, k_div: int = 1) -> NodeTime:
    """Seconds of node `d` (costmodel.capture.graph attributes) for one rank doing `share` of its work, inside a
    training step: GEMMs and fused attention at their isolated rate, memory-bound operators at
    `Device.step_efficiency` of theirs (what the H200's whole steps say: benchmarks.fit).

    A tensor-parallel split passes the dimension it cuts: a column-parallel Linear divides N by t
    (`n_div`), a row-parallel one K (`k_div`); other sharded nodes (heads, sequence) do 1/t of the
    same-shaped work (`share` = 1/t, no change of efficiency).
    """
    return isolated_node_time(d, device, dtype, share=share, n_div=n_div, k_div=k_div,
                              memory_rate=device.step_efficiency)


def isolated_node_time(d: dict, device, dtype: str, *, share: float = 1.0,
                       n_div: int = 1, k_div: int = 1, memory_rate: float = 1.0) -> NodeTime:
    """`node_time` of the kernel timed on its own (a benchmark's figure, before Device.step_efficiency);
    `memory_rate`: the fraction of that rate the memory-bound operators' bytes move at (node_time passes
    the step's)."""
    if d.get("op") in ("get_attr", "placeholder"):
        return NodeTime(0.0, 0.0)  # reading a parameter, buffer or input launches no kernel
    peak = device.peak(dtype)
    dims = gemm_dims(d)
    if dims is not None:
        batch, m, n, k = dims
        n, k = n / n_div, k / k_div
        if d["kind"] in GEMM_KINDS:
            # t(b) = b t_1 + fixed: from the products at micro-batch 1 and 2 (module docstring)
            f1, b1 = gemm_seconds(device, dtype, m, n, k, batch)
            f2, b2 = gemm_seconds(device, dtype, 2 * m, n, k, batch)
            scale = share * d["bwd_flops"] / (2 * d["fwd_flops"])  # the graph's backward FLOPs (2x, or 1x
            fwd_share = share                                        # without a weight gradient) per product
            return NodeTime((f2 - f1) * fwd_share, (b2 - b1) * scale, (2 * f1 - f2) * fwd_share, (2 * b1 - b2) * scale)
        # a batched product: the samples add matrices to the launch (batch, per sample, grows with b), so the
        # same b = 1 / b = 2 split; a memory roofline on the bytes it moves (tiny matrices, such as a
        # DLRM's 27 x 27 feature interaction, are memory-bound)
        count = batch * share
        f1, b1 = gemm_seconds(device, dtype, m, n, k, count, linear=False)
        f2, b2 = gemm_seconds(device, dtype, m, n, k, 2 * count, linear=False)
        scale = d["bwd_flops"] / (2 * d["fwd_flops"])
        mem = d["mem_bytes"] * share / (device.mem_bandwidth * device.mem_efficiency)
        fwd, fixed_fwd = (f2 - f1, 2 * f1 - f2) if f2 - f1 >= mem else (mem, 0.0)
        bwd, fixed_bwd = ((b2 - b1) * scale, (2 * b1 - b2) * scale) if (b2 - b1) * scale >= 2 * mem else (2 * mem, 0.0)
        return NodeTime(fwd, bwd, fixed_fwd, fixed_bwd)
    fwd_flops, bwd_flops = d["fwd_flops"] * share, d["bwd_flops"] * share
    if d["kind"] in ATTENTION_KINDS and fwd_flops:
        shape = d.get("shape") or ()
        seq, head_dim = (shape[-2], shape[-1]) if len(shape) >= 2 else (0, 0)
        f, b = attention_seconds(device, dtype, fwd_flops, bwd_flops, seq, head_dim, bool(d.get("causal")))
        return NodeTime(f, b)
    bw = device.mem_bandwidth * device.mem_efficiency * memory_rate
    mem = d["mem_bytes"] * share
    e_max = device.matmul_efficiency
    return NodeTime(max(fwd_flops / (peak * e_max), mem / bw), max(bwd_flops / (peak * e_max), 2 * mem / bw))

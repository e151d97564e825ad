"""FLOP counting: torch's FlopCounterMode, completed where it is blind, plus backward rules.

FlopCounterMode has no formula for CPU's fused attention (`_scaled_dot_product_flash_attention_for_cpu`,
TORCH-NOTES.md), so attention FLOPs would vanish on CPU and under fake tensors; we register torch's own
SDPA formulas for it. Backward FLOPs per forward op follow the same counter's formulas: a matmul's
backward is two matmuls of the same size (grad input, grad weight), so 2x; fused attention recomputes the
scores, 5 batched matmuls against 2 forward, so 2.5x.

Grouped GEMMs (mixture-of-experts layers: `aten._grouped_mm`, and transformers' CPU fallback custom op
`transformers::grouped_mm_fallback`, and partita's own `partita::grouped_mm` of the tiny-moe preset) have no
formula in torch either. Their rows are the routed tokens,
sorted by expert: with top-k routing each token is processed by k experts, so the rows are tokens x k
and the FLOPs 2 (tokens k) K N -- k times one expert's GEMM per token, never x E (the Switch Transformer,
Fedus et al. 2022, Sec. 2.1: the cost of a token is that of the experts it is routed to; Mixtral, Jiang et
al. 2024, Sec. 2: top-2 of 8 experts, 13B active of 47B parameters).

An op that runs without a formula is either memory-bound by nature (elementwise, views, copies, indexing,
reductions, norms: priced by the bytes it moves, costmodel.price.kernels) or a compute kernel whose FLOPs we
do not know (`is_uncosted`). The latter are listed on the captured graph (`OpGraph.uncosted_ops`) and in
the plan's report, never priced as zero silently.
"""
from __future__ import annotations

import math

import torch
from torch.utils import flop_counter as fc

aten = torch.ops.aten


def register_missing_formulas() -> None:
    """Register the formulas torch lacks (idempotent; a custom op registered later, e.g. once transformers'
    MoE integration is imported, is picked up by the next call)."""
    cpu_fwd = aten._scaled_dot_product_flash_attention_for_cpu
    cpu_bwd = aten._scaled_dot_product_flash_attention_for_cpu_backward
    if cpu_fwd not in fc.flop_registry:
        @fc.register_flop_formula(cpu_fwd)
        def _sdpa_cpu(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
            return fc.sdpa_flop_count(query_shape, key_shape, value_shape)
    if cpu_bwd not in fc.flop_registry:
        @fc.register_flop_formula(cpu_bwd)
        def _sdpa_cpu_bwd(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
            return fc.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)
    if hasattr(aten, "_grouped_mm") and aten._grouped_mm not in fc.flop_registry:
        fc.register_flop_formula(aten._grouped_mm)(_grouped_mm_flop)
    for namespace, name in (("transformers", "grouped_mm_fallback"), ("partita", "grouped_mm")):
        ops = getattr(torch.ops, namespace, None)  # partita's: costmodel.models.gpt (the MoE preset's experts)
        if ops is None or not _has_op(ops, name):
            continue
        fwd = getattr(ops, name)
        if fwd not in fc.flop_registry:
            fc.register_flop_formula(fwd)(_grouped_mm_flop)
        if _has_op(ops, name + "_backward"):
            bwd = getattr(ops, name + "_backward")
            if bwd not in fc.flop_registry:
                fc.register_flop_formula(bwd)(_grouped_mm_backward_flop)


def _has_op(namespace, name: str) -> bool:
    try:
        getattr(namespace, name)
    except (AttributeError, RuntimeError):
        return False
    return True


def _grouped_mm_flop(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """A grouped GEMM: each group multiplies its own rows by its own matrix, so the FLOPs are those of one
    product over all rows, 2 M K N (not x groups). (S, K) x (E, K, N) -> (S, N): rows S sorted by group;
    (E, M, K) x (E, K, N): a batched product; (K, S) x (S, N) -> (E, K, N): the weight gradient, the
    contracted dimension S split into groups."""
    if len(a_shape) == 2 and len(b_shape) == 3:
        return 2 * a_shape[0] * a_shape[1] * b_shape[2]
    if len(a_shape) == 3 and len(b_shape) == 3:
        return 2 * a_shape[0] * a_shape[1] * a_shape[2] * b_shape[2]
    if len(a_shape) == 2 and len(b_shape) == 2:
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]
    return 2 * math.prod(a_shape) * b_shape[-1]  # (E, M, K) x (K, N) -> (M_total, N)


def _grouped_mm_backward_flop(input_shape, weight_shape, offs_shape, grad_shape, *args, out_shape=None,
                              **kwargs) -> int:
    """grad input (S, N) x (E, N, K) and grad weight (K, S) x (S, N): two products of the forward's size."""
    return 2 * _grouped_mm_flop(input_shape, weight_shape)


_ATTENTION_OPS = {"_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                  "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"}

# Operand positions whose gradients a product's backward computes (one forward-sized product each).
PRODUCT_OPERANDS = {"mm": (0, 1), "bmm": (0, 1), "addmm": (1, 2), "baddbmm": (1, 2),
                    "convolution": (0, 1), "_convolution": (0, 1), "convolution_overrideable": (0, 1),
                    "_grouped_mm": (0, 1), "grouped_mm_fallback": (0, 1), "grouped_mm": (0, 1)}


def backward_flops(op_counts: dict) -> int:
    """Backward FLOPs implied by the forward aten-op counts of one node (see module docstring)."""
    total = 0
    for op, flops in op_counts.items():
        parts = str(op).split(".")  # "aten.mm" (a packet) or "aten.mm.default" (an overload)
        name = parts[1] if len(parts) > 1 else parts[0]
        total += flops * 5 // 2 if name in _ATTENTION_OPS else 2 * flops
    return total


# Name parts of compute kernels (products, convolutions, attention, linear algebra, transforms, RNNs):
# such an op without a FLOP formula is uncosted; any other aten op without one moves bytes.
_COMPUTE_PARTS = ("mm", "mv", "dot", "matmul", "einsum", "tensordot", "bilinear", "outer", "ger", "kron",
                  "cdist", "conv", "convolution", "linalg", "fft", "attention", "lstm", "gru", "rnn")


def is_uncosted(func_packet, out) -> bool:
    """Whether an op the counter saw has FLOPs we cannot count: no formula, a floating-point result, and
    either a kernel outside aten/prims (a custom op: its arithmetic is opaque) or an aten compute kernel
    (by name: a product, convolution, attention, linear algebra, FFT or RNN). Elementwise (tagged
    pointwise), data-movement, indexing and reduction ops are memory-bound: their bytes price them."""
    if func_packet in fc.flop_registry:
        return False
    outs = out if isinstance(out, (tuple, list)) else (out,)
    if not any(isinstance(t, torch.Tensor) and t.dtype.is_floating_point for t in outs):
        return False  # indices, masks, counts, sizes
    namespace = getattr(func_packet, "_qualified_op_name", "aten::").split("::")[0]
    if namespace not in ("aten", "prims"):
        return True
    try:
        if any(torch.Tag.pointwise in getattr(func_packet, o).tags for o in func_packet.overloads()):
            return False
    except AttributeError:
        pass
    name = getattr(func_packet, "__name__", str(func_packet)).strip("_")
    parts = name.split("_")
    return any(p in _COMPUTE_PARTS or p.endswith(("mm", "mv")) for p in parts) or any(
        c in name for c in ("conv", "linalg", "fft", "attention", "lstm", "gru", "rnn"))

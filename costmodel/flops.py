"""FLOP counting: torch's FlopCounterMode, completed where it is blind, plus backward rules.

FlopCounterMode has no formula for CPU's fused attention (`_scaled_dot_product_flash_attention_for_cpu`,
TORCH-NOTES.md), so attention FLOPs would vanish on CPU and under fake tensors; we register torch's own
SDPA formulas for it. Backward FLOPs per forward op follow the same counter's formulas: a matmul's
backward is two matmuls of the same size (grad input, grad weight), so 2x; fused attention recomputes the
scores, 5 batched matmuls against 2 forward, so 2.5x.
"""
from __future__ import annotations

import torch
from torch.utils import flop_counter as fc

aten = torch.ops.aten

_registered = False


def register_missing_formulas() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    cpu_fwd = aten._scaled_dot_product_flash_attention_for_cpu
    cpu_bwd = aten._scaled_dot_product_flash_attention_for_cpu_backward
    if cpu_fwd.default not in fc.flop_registry:
        @fc.register_flop_formula(cpu_fwd)
        def _sdpa_cpu(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
            return fc.sdpa_flop_count(query_shape, key_shape, value_shape)
    if cpu_bwd.default not in fc.flop_registry:
        @fc.register_flop_formula(cpu_bwd)
        def _sdpa_cpu_bwd(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
            return fc.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


_ATTENTION_OPS = {"_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                  "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"}


def backward_flops(op_counts: dict) -> int:
    """Backward FLOPs implied by the forward aten-op counts of one node (see module docstring)."""
    total = 0
    for op, flops in op_counts.items():
        parts = str(op).split(".")  # "aten.mm" (a packet) or "aten.mm.default" (an overload)
        name = parts[1] if len(parts) > 1 else parts[0]
        total += flops * 5 // 2 if name in _ATTENTION_OPS else 2 * flops
    return total

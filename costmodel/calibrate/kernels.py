"""`partita calibrate` on a GPU: the kernel rows a kernel-constant fit reads, timed on one device.

Two curves, in 16-bit precision, in the row shape of the shared GPU measurements (GPU-MEASUREMENTS.md, its
kernels2.py and kernels2_h200.json), so rows from either source feed the same fit:

    {"kind": "gemm", "mkn": [M, K, N], "dtype": "bf16", "fwd_s", "fwd_bwd_s", "tflops"}
    {"kind": "sdpa", "backend": "CUDNN_ATTENTION", "shape": [b, h, s, d], "causal": true, "dtype": "bf16",
     "fwd_s", "fwd_bwd_s", "tflops_fwd_full", "tflops_fwdbwd_full"}

- GEMM: `F.linear(x [M, K], w [N, K])`, a Linear's forward, 2 M K N FLOPs (`tflops` is the forward's rate);
  fwd_bwd_s adds both backward products (dX and dW, 4 M K N FLOPs).
- Attention: `F.scaled_dot_product_attention(q, k, v, is_causal=...)` with the backend torch dispatches for
  this device, dtype and shape (no `sdpa_kernel` pin: what a user's training runs), named in "backend"
  (`default_sdpa_backend`). FLOPs are counted on the full s x s product, causal or not: 4 b h s^2 d forward,
  3.5 times that forward + backward (torch's FlopCounter formulas, the count MFU uses), so a kernel that
  skips the masked half of a causal product shows about twice the non-causal rate.

Times are means over `reps` calls after two warm-up calls, between CUDA events on a GPU (perf_counter
elsewhere). A shape the device cannot run (out of memory, no kernel for it) gives its row an "error" (the
exception's first line) in place of times: a sweep never stops at one shape.
"""
from __future__ import annotations

import time

from partita.costmodel.calibrate.local import sync_device

DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def time_call(fn, device, reps: int) -> float:
    """Seconds per call of `fn` on `device`: CUDA events around `reps` calls (perf_counter off a GPU)."""
    import torch
    for _ in range(2):
        fn()
    sync_device(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / reps / 1e3
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def _dtype(name: str):
    import torch
    return getattr(torch, DTYPES[name])


def _error(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def _release(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure_gemm(shapes, device, dtype: str = "bf16", reps: int = 10) -> list[dict]:
    """One "gemm" row (module docstring) per (M, K, N) of `shapes`."""
    import torch
    import torch.nn.functional as F
    rows = []
    for m, k, n in shapes:
        row = {"kind": "gemm", "mkn": [m, k, n], "dtype": dtype}
        try:
            x = torch.randn(m, k, device=device, dtype=_dtype(dtype), requires_grad=True)
            w = torch.randn(n, k, device=device, dtype=_dtype(dtype), requires_grad=True)
            grad = torch.randn(m, n, device=device, dtype=_dtype(dtype))
            fwd = time_call(lambda: F.linear(x, w), device, reps)
            both = time_call(lambda: torch.autograd.grad(F.linear(x, w), (x, w), grad), device, reps)
            row.update(fwd_s=fwd, fwd_bwd_s=both, tflops=2 * m * k * n / fwd / 1e12)
        except RuntimeError as e:  # torch.OutOfMemoryError is one
            row["error"] = _error(e)
        finally:
            x = w = grad = None
            _release(device)
        rows.append(row)
    return rows


def default_sdpa_backend(q, k, v, causal: bool) -> str:
    """The SDPA backend torch dispatches for these inputs ("CUDNN_ATTENTION", "FLASH_ATTENTION",
    "EFFICIENT_ATTENTION", "MATH"; torch._fused_sdp_choice, the function F.scaled_dot_product_attention asks),
    or "default" where this torch has no such function."""
    import torch
    from torch.nn.attention import SDPBackend
    choose = getattr(torch, "_fused_sdp_choice", None)
    if choose is None:
        return "default"
    try:
        return SDPBackend(choose(q, k, v, is_causal=causal)).name
    except (RuntimeError, ValueError, TypeError):
        return "default"


def measure_attention(shapes, device, dtype: str = "bf16", reps: int = 10) -> list[dict]:
    """Two "sdpa" rows (module docstring), causal and not, per (b, h, s, d) of `shapes`."""
    import torch
    import torch.nn.functional as F
    rows = []
    for b, h, s, d in shapes:
        full = 4 * b * h * s * s * d
        for causal in (True, False):
            row = {"kind": "sdpa", "backend": "default", "shape": [b, h, s, d], "causal": causal, "dtype": dtype}
            try:
                q, k, v = (torch.randn(b, h, s, d, device=device, dtype=_dtype(dtype), requires_grad=True)
                           for _ in range(3))
                row["backend"] = default_sdpa_backend(q, k, v, causal)
                grad = torch.randn(b, h, s, d, device=device, dtype=_dtype(dtype))

                def forward():
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                fwd = time_call(forward, device, reps)
                both = time_call(lambda: torch.autograd.grad(forward(), (q, k, v), grad), device, reps)
                row.update(fwd_s=fwd, fwd_bwd_s=both, tflops_fwd_full=full / fwd / 1e12,
                           tflops_fwdbwd_full=3.5 * full / both / 1e12)
            except RuntimeError as e:  # torch.OutOfMemoryError is one
                row["error"] = _error(e)
            finally:
                q = k = v = grad = None
                _release(device)
            rows.append(row)
    return rows

"""`partita calibrate`, one device: matmul rates, memory bandwidth and the per-operator overhead, timed in
this process on the CPU or one GPU (costmodel.calibrate's module docstring says how each becomes a Device
field)."""
from __future__ import annotations

import math
import os
import statistics
import time

LAUNCHES_PER_NODE = 3
"""Launches the planner counts per node and training step: 1 forward + planner.enumerate.strategies.BACKWARD_LAUNCHES
(measure_op_latency and calibrate_dtensor.measure_dtensor divide by it; tests check that the two agree)."""


def sync_device(device):
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_matmul(sizes, dtypes=("fp32", "bf16"), budget_s: float = 0.1, device=None) -> dict:
    """{dtype: [{"n", "seconds", "flops_per_s"}]}: median time of an n x n matmul."""
    import torch
    device = device or torch.device("cpu")
    out = {}
    for name in dtypes:
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[name]
        rows = []
        for n in sizes:
            a = torch.randn(n, n, device=device).to(dtype)
            b = torch.randn(n, n, device=device).to(dtype)
            torch.mm(a, b)
            sync_device(device)
            times, start = [], time.perf_counter()
            while len(times) < 3 or (time.perf_counter() - start < budget_s and len(times) < 1000):
                t0 = time.perf_counter()
                torch.mm(a, b)
                sync_device(device)
                times.append(time.perf_counter() - t0)
            t = statistics.median(times)
            rows.append({"n": n, "seconds": t, "flops_per_s": 2 * n**3 / t})
        out[name] = rows
    return out


def measure_op_latency(device=None, layers: int = 64, repeats: int = 5) -> float:
    """Seconds each operator of a training step costs beyond its arithmetic: forward and backward through
    a chain of tiny Linear + GELU modules (module call, dispatch, autograd engine), divided by the
    launches the cost model charges for them (planner.enumerate.strategies: 1 forward + 2 backward per operator)."""
    import torch
    import torch.nn as nn
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(8, 8), nn.GELU())]).to(device)
    x = torch.ones(4, 8, device=device)
    times = []
    for _ in range(repeats + 1):
        sync_device(device)
        t0 = time.perf_counter()
        model(x).sum().backward()
        sync_device(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:]) / (2 * layers * LAUNCHES_PER_NODE)


def measure_copy(nbytes: int, device=None, repeats: int = 5) -> dict:
    """Memory bandwidth of a large copy, read + write: 2 * bytes / seconds (best of `repeats`)."""
    import torch
    device = device or torch.device("cpu")
    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync_device(device)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        sync_device(device)
        best = min(best, time.perf_counter() - t0)
    return {"bytes": nbytes, "seconds": best, "bytes_per_s": 2 * nbytes / best}


def physical_memory() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 8 * 2**30

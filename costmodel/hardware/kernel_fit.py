"""Kernel constants from kernel timings, by least squares: the GEMM curve, each attention kernel's curve,
and the achievable memory bandwidth (the formulas are costmodel.price.kernels').

Input rows (as `partita calibrate` writes them under "kernels", and benchmarks/data/kernels_*.json holds
what a lent GPU measured):

    {"kind": "gemm", "m", "k", "n", "fwd_s"[, "bwd_s" | "fwd_bwd_s"]}   (m x k) @ (k x n); bwd_s the backward
                                                             alone ("mkn": [m, k, n] is read as well)
    {"kind": "sdpa", "backend", "shape": [b, h, s, d], "causal", "fwd_s"[, "bwd_s" | "fwd_bwd_s"]}
    {"kind": "copy", "bytes", "seconds"}                     bytes read + written by a device copy
    {"kind": "host_copy", "bytes", "direction", "seconds"}   bytes to ("d2h") or from ("h2d") pinned host
                                                             memory (priced at Device.host_bw; fits nothing yet)

`backend` is torch's SDPBackend name (CUDNN_ATTENTION, FLASH_ATTENTION, EFFICIENT_ATTENTION) or
"default" (what torch dispatched by itself: `costmodel.price.kernels.sdpa_kernel` says which).

Each curve is fitted by minimising the squared log ratio of predicted to measured seconds over its rows
(scipy.optimize.least_squares), so a row's error counts the same whatever its size; `predict` prices a
row with a device's constants, so the fit and the kernel test share one pricing.
"""
from __future__ import annotations

import dataclasses
import math

from partita.costmodel.hardware.device import UNALIGNED_FIELDS

from partita.costmodel.price.kernels import (BACKWARD_LAUNCHES, FORWARD_LAUNCHES, SDPA_BWD_OVER_FWD, aligned,
                                             attention_seconds, gemm_seconds, sdpa_kernel)

BACKENDS = {"CUDNN_ATTENTION": "cudnn", "FLASH_ATTENTION": "flash2", "EFFICIENT_ATTENTION": "efficient",
            "MATH": "math"}


def row_kernel(row: dict, device, dtype: str = "bf16") -> str:
    """The costmodel kernel name a measured sdpa row ran."""
    if row["backend"] == "default":
        return sdpa_kernel(device, dtype, row["shape"][-1])
    return BACKENDS[row["backend"]]


def normalise(row: dict) -> dict:
    """A row with "mkn" (calibrate's and kernels2.py's spelling) as m, k, n."""
    if row["kind"] == "gemm" and "mkn" in row and "m" not in row:
        m, k, n = row["mkn"]
        return {**row, "m": m, "k": k, "n": n}
    return row


def usable(rows) -> list[dict]:
    """The rows a fit can read: normalised, without the ones that failed to run (an "error" in place of times)."""
    return [normalise(r) for r in rows if "error" not in r and r.get("kind") in ("gemm", "sdpa", "copy")]


def predict(row: dict, device, dtype: str = "bf16") -> dict:
    """Seconds `device` prices a measured row at, under the row's own keys (fwd_s, bwd_s, fwd_bwd_s, seconds)."""
    row = normalise(row)
    if row["kind"] == "gemm":
        fwd, bwd = gemm_seconds(device, dtype, row["m"], row["n"], row["k"])
    elif row["kind"] == "sdpa":
        b, h, s, d = row["shape"]
        flops = 4 * b * h * s * s * d
        fwd, bwd = attention_seconds(device, dtype, flops, SDPA_BWD_OVER_FWD * flops, s, d, row["causal"],
                                     kernel=row_kernel(row, device, dtype))
    elif row["kind"] == "copy":
        return {"seconds": row["bytes"] / (device.mem_bandwidth * device.mem_efficiency)}
    elif row["kind"] == "host_copy":  # to or from pinned host memory (offload), at the device's host link
        return {"seconds": row["bytes"] / device.host_bw}
    else:
        raise ValueError(f"unknown kernel row kind {row['kind']!r}")
    # timed on their own: no step_efficiency (costmodel.price.kernels.node_time); each launch costs op_latency
    # beyond FLOPs and bytes, as the planner charges it (planner.enumerate.strategies)
    fwd, bwd = fwd + FORWARD_LAUNCHES * device.op_latency, bwd + BACKWARD_LAUNCHES * device.op_latency
    return {"fwd_s": fwd, "bwd_s": bwd, "fwd_bwd_s": fwd + bwd}


HOST_BOUND_BWD_OVER_FWD = 3.0
"""A GEMM's backward is two products of its forward's size: on a GPU it takes 1.9-2.3x the forward
(GPU-MEASUREMENTS.md). One that takes over 3x waited on the host (an autograd call per repetition, slower
than the kernels it launched: 2.9-6.5x on small shapes in the H200 sessions): a launch rate, not a kernel."""


def host_bound(row: dict) -> set[str]:
    """The backward times of a GEMM row that measured the host rather than the GPU (HOST_BOUND_BWD_OVER_FWD)."""
    if row.get("kind") != "gemm" or not row.get("fwd_s"):
        return set()
    fwd, limit = row["fwd_s"], HOST_BOUND_BWD_OVER_FWD
    return ({"bwd_s"} if row.get("bwd_s", 0) > limit * fwd else set()) | (
        {"fwd_bwd_s"} if row.get("fwd_bwd_s", 0) > (1 + limit) * fwd else set())


def measured_keys(row: dict, anomalies: bool = False) -> list[str]:
    """The measured times of a row; without `anomalies`, less the one its `anomaly` names (a time other
    measurements contradict) and host-bound GEMM backwards (`host_bound`), left out of every fit."""
    skip = set() if anomalies else {(row.get("anomaly") or {}).get("key")} | host_bound(row)
    return [k for k in ("fwd_s", "bwd_s", "fwd_bwd_s", "seconds") if k in row and k not in skip]


def errors(rows, device, dtype: str = "bf16", anomalies: bool = False) -> list[dict]:
    """Each measured time of each row beside its price: {row, key, measured, predicted, error, anomaly}."""
    out = []
    for r in rows:
        p = predict(r, device, dtype)
        out += [{"row": r, "key": k, "measured": r[k], "predicted": p[k], "error": p[k] / r[k] - 1,
                 "anomaly": (r.get("anomaly") or {}).get("key") == k} for k in measured_keys(r, anomalies)]
    return out


def _log_fit(rows, device_of, x0, lower, upper, dtype):
    """x minimising sum over rows of log(predicted / measured)^2, `device_of(x)` the device priced."""
    from scipy.optimize import least_squares

    def residuals(x):
        return [math.log(e["predicted"] / e["measured"]) for e in errors(rows, device_of(x), dtype)]
    return least_squares(residuals, x0, bounds=(lower, upper), x_scale="jac").x


def fit_gemm(rows, device, dtype: str = "bf16") -> dict:
    """matmul_efficiency, gemm_half_mn, gemm_split_k and op_latency (the seconds each kernel costs beyond
    its FLOPs: launch, prologue and tail, charged per launch as the planner does) from the aligned GEMM rows,
    then the unaligned factors from the others (`fit_unaligned`). The split-K slice makes the sum of
    squares bumpy (split or not is a threshold): the best of a few starts is kept, so the result does not
    depend on one starting guess."""
    rows = [r for r in rows if r["kind"] == "gemm"]
    curve_rows = [r for r in rows if aligned(dtype, r["n"], r["k"])]
    out = {}
    if curve_rows:
        def device_of(x):
            return dataclasses.replace(device, matmul_efficiency=x[0], gemm_half_mn=x[1], gemm_split_k=x[2],
                                       gemm_half_dim=0.0, op_latency=x[3])

        def cost(x):
            return sum(math.log(e["predicted"] / e["measured"]) ** 2 for e in errors(curve_rows, device_of(x), dtype))
        starts = [[0.7, 2e5, k, 5e-6] for k in (1024.0, 4096.0, 16384.0)]
        x = min((_log_fit(curve_rows, device_of, x0, [0.01, 0.0, 16.0, 0.0], [1.0, 1e9, 1e6, 1e-3], dtype)
                 for x0 in starts), key=cost)
        out = {"matmul_efficiency": float(x[0]), "gemm_half_mn": float(x[1]), "gemm_split_k": float(x[2]),
               "gemm_half_dim": 0.0, "op_latency": float(x[3])}
    unaligned = [r for r in rows if not aligned(dtype, r["n"], r["k"])]
    return {**out, **fit_unaligned(unaligned, dataclasses.replace(device, **out), dtype)}


def fit_unaligned(rows, device, dtype: str = "bf16") -> dict:
    """gemm_unaligned_read_efficiency and gemm_unaligned_write_efficiency: the factors that price GEMM rows
    whose K or N is unaligned (costmodel.price.kernels, Alignment) best against `device`'s aligned curve; {}
    without such rows. A row timed forward and backward apart sets both (N unaligned: the forward writes
    unaligned rows, the backward reads them; K: the other way round)."""
    if not rows:
        return {}
    x = _log_fit(rows, lambda x: dataclasses.replace(device, **dict(zip(UNALIGNED_FIELDS, x))),
                 [0.5, 0.5], [0.01, 0.01], [1.0, 1.0], dtype)
    return {k: float(v) for k, v in zip(UNALIGNED_FIELDS, x)}


def fit_attention(rows, device, kernel: str, dtype: str = "bf16") -> dict:
    """The curve {efficiency, bwd_efficiency, half_seq, half_dim, causal_block} of one kernel from its rows
    (causal_block 0 when no row is causal: nothing measures it)."""
    rows = [r for r in rows if r["kind"] == "sdpa" and row_kernel(r, device, dtype) == kernel]
    if not rows:
        return {}
    causal = any(r["causal"] for r in rows)

    def curve(x):
        return {"efficiency": float(x[0]), "bwd_efficiency": float(x[1]), "half_seq": float(x[2]),
                "half_dim": float(x[3]), "causal_block": float(x[4]) if causal else 0.0}
    x = _log_fit(rows, lambda x: dataclasses.replace(device, other_attention={kernel: curve(x)}),
                 [0.5, 0.4, 500.0, 32.0, 128.0], [0.01, 0.01, 0.0, 0.0, 0.0], [1.0, 1.0, 1e5, 1e4, 4096.0], dtype)
    return curve(x)


def fit_memory(rows, device) -> dict:
    """mem_efficiency: the copies' bytes over their seconds, over the datasheet bandwidth (mean of rows)."""
    rows = [r for r in rows if r["kind"] == "copy"]
    if not rows:
        return {}
    rates = [r["bytes"] / r["seconds"] for r in rows]
    return {"mem_efficiency": min(1.0, sum(rates) / len(rates) / device.mem_bandwidth)}


def fit_kernel_constants(rows, device, dtype: str = "bf16") -> dict:
    """Every Device kernel field the rows determine: the GEMM curve; the attention curve of the kernel the
    device's stack runs for 16-bit training (its attention_* fields) and of every other measured kernel
    (other_attention); mem_efficiency. Fields the rows do not determine are left out (the caller keeps
    its own)."""
    rows = usable(rows)
    out = {**fit_gemm(rows, device, dtype), **fit_memory(rows, device)}
    device = dataclasses.replace(device, **out)  # attention is fitted with the launch cost the GEMMs gave
    main = sdpa_kernel(device, dtype, 128)
    curves = {k: fit_attention(rows, device, k, dtype)
              for k in sorted({row_kernel(r, device, dtype) for r in rows if r["kind"] == "sdpa"})}
    if main in curves:
        c = curves[main]
        out.update(attention_efficiency=c["efficiency"], attention_bwd_efficiency=c["bwd_efficiency"],
                   attention_half_seq=c["half_seq"], attention_half_dim=c["half_dim"],
                   attention_causal_block=c["causal_block"])
    if curves:
        out["other_attention"] = curves
    return out

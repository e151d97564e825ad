"""`partita calibrate`'s fits: link latency and bandwidth (alpha, beta) from collective timings, the GEMM curve
from square matmuls, and the in-step cost of a collective message step (Device.sync_latency)."""
from __future__ import annotations

import statistics

import numpy as np

# (latency factor, bandwidth factor) of the ring forms in costmodel.price.comm, for k ranks and B bytes
FORMS = {
    "all_reduce": lambda k: (2 * (k - 1), 2 * (k - 1) / k),
    "all_gather": lambda k: (k - 1, (k - 1) / k),
    "reduce_scatter": lambda k: (k - 1, (k - 1) / k),
    "all_to_all": lambda k: (k - 1, (k - 1) / k),
    "broadcast": lambda k: (k - 1, 1.0),   # pipelined ring
    "p2p": lambda k: (1, 1.0),
}



def fit_alpha_beta(kind: str, points: list[dict]) -> dict:
    """Least-squares alpha, beta of `kind`'s form over points {"ranks", "bytes", "seconds"}, on relative
    error, with alpha >= 0 and beta > 0. Returns alpha, beta and the fit's relative RMS error."""
    form = FORMS[kind]
    a = np.array([[form(p["ranks"])[0], form(p["ranks"])[1] * p["bytes"]] for p in points], dtype=float)
    t = np.array([p["seconds"] for p in points], dtype=float)
    w = a / t[:, None]                       # rows scaled by 1/t: minimise sum ((pred - t) / t)^2
    ones = np.ones(len(t))
    coef, *_ = np.linalg.lstsq(w, ones, rcond=None)
    if coef[1] <= 0:                         # no bandwidth term left: fit latency only, beta huge
        coef = np.array([max(0.0, float(np.linalg.lstsq(w[:, :1], ones, rcond=None)[0][0])), 1e-15])
    elif coef[0] < 0:                        # negative latency: fit bandwidth only
        coef = np.array([0.0, float(np.linalg.lstsq(w[:, 1:], ones, rcond=None)[0][0])])
    pred = a @ coef
    rel_rms = float(np.sqrt(np.mean(((pred - t) / t) ** 2)))
    return {"alpha_s": float(coef[0]), "beta_bytes_per_s": float(1 / coef[1]), "rel_rms_error": rel_rms,
            "form": kind}


def fit_gemm_curve(rows: list[dict], peak: float) -> dict:
    """Device.gemm_half_dim and matmul_efficiency from square n x n matmuls (costmodel.price.kernels: the rate
    of an n^3 GEMM is peak e_max s(n)^3, s(n) = n / (n + x_half)): least squares on log rate over a grid
    of x_half, e_max from the largest sizes' fit. `rows` are measure_matmul's {"n", "flops_per_s"};
    `peak` the FLOP/s the efficiency is a fraction of. Returns gemm_half_dim, and e_max under the key
    matmul_efficiency_of_measured_peak."""
    ns = np.array([r["n"] for r in rows], dtype=float)
    rate = np.array([r["flops_per_s"] for r in rows], dtype=float)
    best = (float("inf"), 0.0, 1.0)
    for half in np.concatenate([[0.0], np.geomspace(1, 4096, 97)]):
        s3 = (ns / (ns + half)) ** 3
        log_e = float(np.mean(np.log(rate / (peak * s3))))
        err = float(np.sum((np.log(peak * np.exp(log_e) * s3) - np.log(rate)) ** 2))
        if err < best[0] - 1e-12:
            best = (err, float(half), float(np.exp(log_e)))
    return {"gemm_half_dim": best[1], "matmul_efficiency_of_measured_peak": min(1.0, best[2])}


def sync_latency(in_step: dict, fits: dict) -> float:
    """Device.sync_latency from `measure_in_step`'s rows and the back-to-back alpha-beta `fits`.

    The cost model charges a row's collective in a step as (costmodel.price.comm, module docstring)

        t = f_a(k) (alpha + s) + f_b(k) B / beta        (f_a, f_b: the form's factors, FORMS)

    so each row i (all-reduce, all-gather, reduce-scatter at every group size k; p2p), with t_i the
    measured in-step seconds and h_i = f_a alpha + f_b B / beta its back-to-back fit, gives one estimate
    s_i = (t_i - h_i) / f_a,i, and

        s = median_i s_i                                  (clamped at 0)

    The median, not a least-squares fit: a single in-step timing is a scheduling event, occasionally
    several times its usual size or near zero (a weighted fit follows whichever row is smallest)."""
    estimates = []
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "p2p"):
        fit = fits.get(kind)
        for r in in_step.get(kind, []):
            if fit is None:
                continue
            if r["in_step_s"] is None:  # too noisy to measure (measure_in_step)
                continue
            fa, fb = FORMS[kind](r["ranks"])
            h = fa * fit["alpha_s"] + fb * r["bytes"] / fit["beta_bytes_per_s"]
            estimates.append((r["in_step_s"] - h) / fa)
    return max(0.0, statistics.median(estimates)) if estimates else 0.0

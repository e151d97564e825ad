"""costmodel.hardware.kernel_fit: kernel constants by least squares from kernel timings. Rows priced by a device with
known constants come back as those constants (the fit is the inverse of the pricing)."""
import dataclasses

import pytest

from partita.costmodel.hardware import DEVICES
from partita.costmodel.hardware.kernel_fit import fit_kernel_constants, normalise, predict, usable

TRUE = dataclasses.replace(
    DEVICES["H200-141GB"], matmul_efficiency=0.72, gemm_half_mn=3e5, gemm_split_k=8192.0, gemm_half_dim=0.0,
    op_latency=4e-6, mem_efficiency=0.85, attention_efficiency=0.6, attention_bwd_efficiency=0.45,
    attention_half_seq=400.0, attention_half_dim=50.0, attention_causal_block=256.0, other_attention=None)
GEMMS = [(m, k, n) for m in (256, 1024, 4096, 16384) for (k, n) in ((4096, 4096), (8192, 1024), (1024, 8192),
                                                                       (16384, 512))]
SDPA = [(b, h, s, d) for (b, h, s, d) in ((8, 16, 1024, 64), (4, 32, 2048, 128), (1, 32, 8192, 128),
                                          (2, 16, 4096, 64), (1, 8, 32768, 128))]


def timed(device) -> list[dict]:
    """Rows as a GPU would time them, if it ran exactly as `device` prices."""
    rows = [{"kind": "gemm", "mkn": [m, k, n]} for m, k, n in GEMMS]
    rows += [{"kind": "sdpa", "backend": "default", "shape": [b, h, s, d], "causal": c}
             for b, h, s, d in SDPA for c in (True, False)]
    rows.append({"kind": "copy", "bytes": 2**31})
    out = []
    for r in rows:
        p = predict(r, device)
        if r["kind"] == "copy":
            out.append({**r, "seconds": p["seconds"]})
        else:
            out.append({**r, "fwd_s": p["fwd_s"], "fwd_bwd_s": p["fwd_bwd_s"]})
    return out


def test_timings_priced_by_known_constants_give_those_constants_back():
    fitted = fit_kernel_constants(timed(TRUE), DEVICES["H200-141GB"])
    for k in ("matmul_efficiency", "gemm_half_mn", "op_latency", "mem_efficiency", "attention_efficiency",
              "attention_bwd_efficiency", "attention_half_seq", "attention_half_dim"):
        assert fitted[k] == pytest.approx(getattr(TRUE, k), rel=0.03), k
    assert fitted["gemm_split_k"] == pytest.approx(TRUE.gemm_split_k, rel=0.1)
    assert fitted["attention_causal_block"] == pytest.approx(TRUE.attention_causal_block, rel=0.1)
    # the default-dispatch kernel on Hopper is cuDNN: its curve is the device's attention_* fields
    assert set(fitted["other_attention"]) == {"cudnn"}


def test_a_fit_is_not_the_answer_it_started_from():
    """The same rows from other constants give other constants: the fit follows the data."""
    slower = dataclasses.replace(TRUE, matmul_efficiency=0.5, attention_efficiency=0.3, attention_bwd_efficiency=0.2)
    fitted = fit_kernel_constants(timed(slower), DEVICES["H200-141GB"])
    assert fitted["matmul_efficiency"] == pytest.approx(0.5, rel=0.03)
    assert fitted["attention_efficiency"] == pytest.approx(0.3, rel=0.03)


def test_rows_that_failed_to_run_or_are_spelled_mkn_are_read():
    rows = [{"kind": "gemm", "mkn": [1, 2, 3], "fwd_s": 1.0}, {"kind": "gemm", "mkn": [4, 5, 6], "error": "OOM"},
            {"kind": "unknown"}]
    assert usable(rows) == [normalise(rows[0])] and normalise(rows[0])["m"] == 1 and normalise(rows[0])["n"] == 3


def test_a_host_bound_gemm_backward_is_left_out_of_fits_and_named_when_judged():
    from partita.costmodel.hardware.kernel_fit import host_bound, measured_keys
    compute_bound = {"kind": "gemm", "m": 8192, "k": 4096, "n": 4096, "fwd_s": 4.0e-4, "bwd_s": 8.4e-4}
    waited = {"kind": "gemm", "mkn": [1024, 8192, 1024], "fwd_s": 3.9e-5, "fwd_bwd_s": 3.4e-4}  # H200, quick calibrate
    assert host_bound(compute_bound) == set() and measured_keys(compute_bound) == ["fwd_s", "bwd_s"]
    assert host_bound(waited) == {"fwd_bwd_s"} and measured_keys(waited) == ["fwd_s"]
    assert measured_keys(waited, anomalies=True) == ["fwd_s", "fwd_bwd_s"]


def test_unaligned_gemm_factors_come_from_unaligned_rows_only():
    """cuBLAS runs other kernels on rows of no multiple of 16 bytes (costmodel.price.kernels, Alignment): an LM
    head at vocabulary 50,257 and a Linear with K = 4,100 give back the read and write factors they were timed
    with; rows that are all aligned leave both out (the device keeps 'priced as aligned')."""
    slow = dataclasses.replace(TRUE, gemm_unaligned_read_efficiency=0.25, gemm_unaligned_write_efficiency=0.12)
    odd = [{"kind": "gemm", "mkn": list(s)} for s in ((65536, 1024, 50257), (8192, 4100, 4096))]
    rows = timed(slow) + [{**r, **{k: v for k, v in predict(r, slow).items() if k != "bwd_s"}} for r in odd]
    fitted = fit_kernel_constants(rows, DEVICES["H200-141GB"])
    assert fitted["gemm_unaligned_read_efficiency"] == pytest.approx(0.25, rel=0.03)
    assert fitted["gemm_unaligned_write_efficiency"] == pytest.approx(0.12, rel=0.03)
    assert fitted["matmul_efficiency"] == pytest.approx(TRUE.matmul_efficiency, rel=0.03)  # the curve: aligned rows
    assert "gemm_unaligned_read_efficiency" not in fit_kernel_constants(timed(slow), DEVICES["H200-141GB"])


def test_every_gpu_calibration_times_an_unaligned_gemm_beside_aligned_ones():
    """So `partita calibrate` on a GPU fits that GPU's unaligned factors, not only the curve."""
    from partita.costmodel.calibrate import SETTINGS
    from partita.costmodel.price.kernels import aligned
    for name, s in SETTINGS.items():
        kinds = {aligned("bf16", n, k) for _, k, n in s.gemm_shapes}
        assert kinds == {True, False}, name

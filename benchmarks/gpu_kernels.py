"""Every kernel row of a GPU's measurement file timed again, in one session, beside what its preset prices.

    python -m benchmarks.gpu_kernels [--data benchmarks/data/kernels_h200_torch2.11.json] [--reps-s 0.05]

Then the PROBES: shapes no session has timed (unaligned GEMMs the data file does not hold). The kernel rows in
benchmarks/data/ came from two sessions on the same H200 (GPU-MEASUREMENTS.md: the
'Kernels' table and the sweep), and the two disagree by 20-25% on GEMMs of the same class (16384 x 4096 x
4096 at 782 TFLOP/s in the sweep, 8192 x 4096 x 4096 at 629 in the Kernels table). This times every row's
shape again in one process, with one method, so a disagreement between sessions can be told from a curve
that cannot hold both:

- GEMM: `F.linear(x [M, K], w [N, K])`; fwd_s the forward, bwd_s the backward's two products (dX and dW)
  timed alone, as one `torch.autograd.grad` over a saved forward (fwd_bwd_s is their sum);
- attention: `F.scaled_dot_product_attention(q, k, v, is_causal=...)`, under the row's pinned backend
  (`torch.nn.attention.sdpa_kernel`) or torch's own dispatch for backend "default";
- copy: a device-to-device copy of the row's bytes (read + write).

Each time is the median of 5 batches of CUDA-event-timed calls, each after two warm-up calls (the committed
H200 results were taken with three warm-up calls before the first batch only); a batch runs at least
`--reps-s` seconds (at least 5 calls), so a short kernel is not timed against the host's launch rate. Rows
keep the source file's keys, and `--out` (default benchmarks/results/gpu_kernels.json) holds the
measured rows in the data file's format (kernel_fit reads them as they are) with the preset's price and
error per time. A shape the device cannot run keeps an "error". Without CUDA it says so in one line and
exits 0.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from benchmarks import common

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data" / "kernels_h200_torch2.11.json"
BATCHES = 5
PROBES = [{"kind": "gemm", "m": 8192, "k": 4096, "n": n, "table": "probe"} for n in (32000, 32001)] + [
    {"kind": "gemm", "m": 8192, "k": 4100, "n": 4096, "table": "probe"}] + [
    {"kind": "host_copy", "bytes": 2**30, "direction": d, "table": "probe"} for d in ("d2h", "h2d")]
"""Shapes no session has timed, measured beside the data file's rows (no source time to compare) and left out
where the data file already holds them. The GPT-2 LM heads (N = 50,257 beside 50,304), timed here on
2026-11-30, showed cuBLAS's unaligned kernels 4.6-6.1x slower (costmodel.price.kernels, Alignment) and are
data rows now; these test that term elsewhere: a Llama 2 head with one added token (32,001, as tokenizers
that add a pad token make it) beside 32,000, and an unaligned inner K. And the host link, which no session has
timed (the presets say 25 GB/s each way): a GiB copied to pinned host memory and back, as activation offload
moves it. The llama3-8b-auto profile of 2026-11-30 suggests about 56 GB/s (its offloaded [1, 4096, 14336]
tensors took 2.1 ms each), which would make the planner's offload seconds twice too long."""


def time_batches(fn, device, min_s: float, batches: int = BATCHES) -> float:
    """Median seconds per call of `fn` over `batches` batches, each of at least `min_s` seconds and 5 calls
    (calibrate_kernels.time_call: CUDA events on a GPU, perf_counter elsewhere, after its warm-up calls)."""
    from partita.costmodel.calibrate.kernels import time_call
    reps = max(5, int(min_s / max(time_call(fn, device, 1), 1e-6)))
    return statistics.median(time_call(fn, device, reps) for _ in range(batches))


def _gemm(row: dict, device, dtype, min_s: float) -> dict:
    import torch
    import torch.nn.functional as F
    m, k, n = row["m"], row["k"], row["n"]
    x = torch.randn(m, k, device=device, dtype=dtype, requires_grad=True)
    w = torch.randn(n, k, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(m, n, device=device, dtype=dtype)
    fwd = time_batches(lambda: F.linear(x, w), device, min_s)
    y = F.linear(x, w)
    bwd = time_batches(lambda: torch.autograd.grad(y, (x, w), grad, retain_graph=True), device, min_s)
    return {"fwd_s": fwd, "bwd_s": bwd, "fwd_bwd_s": fwd + bwd}


def _sdpa(row: dict, device, dtype, min_s: float) -> dict:
    import contextlib

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    b, h, s, d = row["shape"]
    q, k, v = (torch.randn(b, h, s, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn(b, h, s, d, device=device, dtype=dtype)
    pin = (contextlib.nullcontext() if row["backend"] == "default"
           else sdpa_kernel(getattr(SDPBackend, row["backend"])))
    with pin:
        def forward():
            return F.scaled_dot_product_attention(q, k, v, is_causal=row["causal"])
        fwd = time_batches(forward, device, min_s)
        out = forward()
        bwd = time_batches(lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True), device, min_s)
    return {"fwd_s": fwd, "bwd_s": bwd, "fwd_bwd_s": fwd + bwd}


def _copy(row: dict, device, min_s: float) -> dict:
    import torch
    src = torch.empty(row["bytes"] // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return {"seconds": time_batches(lambda: dst.copy_(src), device, min_s)}


def _host_copy(row: dict, device, min_s: float) -> dict:
    """A copy of the row's bytes between the device and pinned host memory, in its direction ("d2h", "h2d")."""
    import torch
    gpu = torch.empty(row["bytes"], dtype=torch.uint8, device=device)
    host = torch.empty(row["bytes"], dtype=torch.uint8, pin_memory=True)
    src, dst = (gpu, host) if row["direction"] == "d2h" else (host, gpu)
    return {"seconds": time_batches(lambda: dst.copy_(src, non_blocking=True), device, min_s)}


def measure_row(row: dict, device, dtype_name: str = "bf16", min_s: float = 0.05) -> dict:
    """`row` (a data file's row) with its times measured here under the same keys; "error" if it cannot run."""
    import torch
    from partita.costmodel.calibrate.kernels import _error, _release
    keep = {k: v for k, v in row.items() if k not in ("fwd_s", "bwd_s", "fwd_bwd_s", "seconds", "anomaly",
                                                       "tflops", "note")}
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    try:
        if row["kind"] == "gemm":
            times = _gemm(row, device, dtype, min_s)
        elif row["kind"] == "sdpa":
            times = _sdpa(row, device, dtype, min_s)
        elif row["kind"] == "host_copy":
            times = _host_copy(row, device, min_s)
        else:
            times = _copy(row, device, min_s)
    except RuntimeError as e:  # out of memory, no kernel for this shape or backend
        return {**keep, "error": _error(e)}
    finally:
        _release(device)
    return {**keep, **times}


def compare(source: dict, measured: dict, device) -> list[dict]:
    """Per time of `measured`: the source session's time, this session's, and the preset's price."""
    from partita.costmodel.hardware.kernel_fit import measured_keys, predict
    if "error" in measured:
        return []
    price = predict(measured, device)
    return [{"key": k, "source_s": source.get(k), "measured_s": measured[k], "predicted_s": price[k],
             "error": price[k] / measured[k] - 1,
             "sessions_differ": (source[k] / measured[k] - 1) if source.get(k) else None}
            for k in measured_keys(measured, anomalies=True)]


def _label(row: dict) -> str:
    if row["kind"] == "gemm":
        return f"gemm {row['m']}x{row['k']}x{row['n']}"
    if row["kind"] == "sdpa":
        return f"sdpa {row['backend']} {tuple(row['shape'])} {'causal' if row['causal'] else 'full'}"
    if row["kind"] == "host_copy":
        return f"host copy {row['direction']} {row['bytes'] / 2**30:.0f} GiB"
    return f"copy {row['bytes'] / 2**30:.0f} GiB"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_kernels", description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DATA, help="the measurement file whose rows are timed again")
    ap.add_argument("--reps-s", type=float, default=0.05, help="seconds per timed batch (default 0.05)")
    ap.add_argument("--name", default="gpu_kernels", help="results/<name>.json (default gpu_kernels)")
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print(f"benchmarks.gpu_kernels: no CUDA device here (torch {torch.__version__}): nothing measured")
        return 0
    from partita.costmodel.hardware import DEVICES, gpu_preset
    data = json.loads(args.data.read_text())
    name = torch.cuda.get_device_name(0)
    preset = gpu_preset(name, float(torch.cuda.get_device_properties(0).total_memory))
    if preset != data.get("preset"):
        print(f"benchmarks.gpu_kernels: this is a {name} ({preset}); {args.data.name} holds {data.get('preset')} "
              "rows: nothing measured", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0)
    rows, compared = [], []
    held = {_label(r) for r in data["rows"]}
    for src in data["rows"] + [p for p in PROBES if _label(p) not in held]:
        got = measure_row(src, device, data.get("dtype", "bf16"), args.reps_s)
        rows.append(got)
        compared.append({"row": _label(src), "table": src.get("table"), "error_line": got.get("error"),
                         "times": compare(src, got, DEVICES[preset])})
        for t in compared[-1]["times"]:
            differ = f", source session {100 * t['sessions_differ']:+.1f}%" if t["sessions_differ"] is not None else ""
            print(f"{_label(src):<48} {t['key']:<9} {1e3 * t['measured_s']:9.4f} ms measured, priced "
                  f"{100 * t['error']:+.1f}%{differ}", flush=True)
        if got.get("error"):
            print(f"{_label(src):<48} failed: {got['error']}", flush=True)
    judged = [t for c in compared for t in c["times"]]
    summary = {"rows": len(rows), "failed": sum("error" in r for r in rows),
               "max_abs_error": max((abs(t["error"]) for t in judged), default=None),
               "within_15pct": sum(abs(t["error"]) <= 0.15 for t in judged), "times": len(judged)}
    path = common.write(args.name, {"source": str(args.data.relative_to(ROOT)), "device": name,
                                    "preset": preset, "torch": torch.__version__,
                                    "method": f"median of {BATCHES} CUDA-event batches of >= {args.reps_s} s, "
                                              "each after 2 warm-up calls; backward timed alone over a saved forward",
                                    "dtype": data.get("dtype", "bf16"), "rows": rows, "compared": compared,
                                    "summary": summary})
    print(f"{summary['within_15pct']} of {summary['times']} times priced within 15%; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""benchmarks.gpu_kernels without a GPU: each kind of kernel row is timed again on this CPU under the source
row's keys (tiny shapes; the times are real), compared with the preset's price, and without CUDA the
benchmark says so in one line."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import gpu_kernels  # noqa: E402
from partita.costmodel.hardware import DEVICES  # noqa: E402

ROWS = [
    {"kind": "gemm", "m": 64, "k": 128, "n": 32, "fwd_s": 1e-5, "bwd_s": 2e-5, "table": "kernels"},
    {"kind": "sdpa", "backend": "default", "shape": [1, 2, 64, 16], "causal": True, "fwd_s": 1e-5, "bwd_s": 3e-5},
    {"kind": "sdpa", "backend": "MATH", "shape": [1, 2, 64, 16], "causal": False, "fwd_s": 1e-5, "fwd_bwd_s": 4e-5,
     "anomaly": {"key": "fwd_bwd_s", "reason": "x"}},
    {"kind": "copy", "bytes": 2**20, "seconds": 1e-5},
]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['kind']}-{r.get('backend', '')}")
def test_a_row_is_timed_again_under_its_own_keys(row):
    got = gpu_kernels.measure_row(row, torch.device("cpu"), "bf16", min_s=0.002)
    assert "error" not in got and "anomaly" not in got  # a new measurement carries no old verdict
    keys = ("fwd_s", "bwd_s", "fwd_bwd_s", "seconds")
    assert {k: v for k, v in got.items() if k not in keys} == {
        k: v for k, v in row.items() if k not in keys and k != "anomaly"}
    times = [k for k in keys if k in got]
    assert times and all(got[k] > 0 for k in times)
    if "fwd_bwd_s" in got:
        assert got["fwd_bwd_s"] == pytest.approx(got["fwd_s"] + got["bwd_s"])
    compared = gpu_kernels.compare(row, got, DEVICES["H200-141GB"])
    assert [c["key"] for c in compared] == times
    assert all(c["sessions_differ"] == (pytest.approx(row[c["key"]] / got[c["key"]] - 1) if c["key"] in row else None)
               for c in compared)


def test_without_cuda_it_says_so_in_one_line(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_kernels.main([]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("benchmarks.gpu_kernels: no CUDA device here") and out.out.count("\n") == 1


def test_a_probe_has_no_source_time_and_is_priced():
    """A PROBES row (a shape no session timed) measured like any row: nothing to compare with, a price beside it."""
    probe = {**gpu_kernels.PROBES[0], "m": 64, "k": 32, "n": 57}  # its kind and keys, at a CPU's size: n unaligned
    got = gpu_kernels.measure_row(probe, torch.device("cpu"), "bf16", min_s=0.002)
    compared = gpu_kernels.compare(probe, got, DEVICES["H200-141GB"])
    assert [c["key"] for c in compared] == ["fwd_s", "bwd_s", "fwd_bwd_s"]
    assert all(c["source_s"] is None and c["sessions_differ"] is None and c["predicted_s"] > 0 for c in compared)
    # the next questions: an unaligned N and an unaligned K beside an aligned twin, none a data row already
    from partita.costmodel.price.kernels import aligned
    gemms = [p for p in gpu_kernels.PROBES if p["kind"] == "gemm"]
    assert {aligned("bf16", p["n"]) for p in gemms} == {True, False}
    assert {aligned("bf16", p["k"]) for p in gemms} == {True, False}
    held = {gpu_kernels._label(r) for r in json.loads(gpu_kernels.DATA.read_text())["rows"]}
    assert not held & {gpu_kernels._label(p) for p in gpu_kernels.PROBES}


def test_the_host_link_probes_are_priced_at_the_presets_host_bandwidth():
    """Offload's link, timed by no session yet: each direction's probe is priced as the planner prices an
    offload copy (bytes / Device.host_bw), so the next GPU session's run says how far the preset is off."""
    from partita.costmodel.hardware.kernel_fit import predict
    h200 = DEVICES["H200-141GB"]
    probes = [p for p in gpu_kernels.PROBES if p["kind"] == "host_copy"]
    assert {p["direction"] for p in probes} == {"d2h", "h2d"}
    for p in probes:
        assert predict(p, h200)["seconds"] == p["bytes"] / h200.host_bw
        assert gpu_kernels._label(p).startswith(f"host copy {p['direction']}")

"""Shared helpers for the benchmarks: where results go, and how they are written."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path

RESULTS = Path(os.environ.get("PARTITA_BENCH_OUT", Path(__file__).resolve().parent / "results"))


def machine() -> dict:
    import torch
    return {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
            "platform": platform.platform(), "date": time.strftime("%Y-%m-%d"),
            "load_average_at_write": list(os.getloadavg())}  # other work on the machine skews timings


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        return ""


def write(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "machine": machine(), "commit": commit(), **payload},
                               indent=2) + "\n")
    return path


def plot_path(name: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    return RESULTS / f"{name}.png"


def save_figure(fig, name: str, dpi: int = 110) -> Path:
    """Lay out `fig`, write it to results/<name>.png and release it."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    path = plot_path(name)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (benchmarks write PNGs, never open windows)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def try_plot(plot, payload) -> None:
    """Draw a benchmark's plot; without matplotlib, say so and keep the JSON."""
    import sys
    try:
        plot(payload)
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)


def p95(values) -> float | None:
    """The 95th percentile by nearest rank: the smallest value at least 95% of `values` do not exceed."""
    import math
    a = sorted(values)
    return a[math.ceil(0.95 * len(a)) - 1] if a else None


def hardware_over_model(seq: int, hidden: int, layers: int, vocab: int) -> float:
    """Megatron's full-recompute FLOPs over model FLOPs, 96 (1 + s/6h + V/16lh) / (72 (1 + s/6h + V/12lh))
    (Narayanan et al. SC'21; Korthikanti et al. 2022; REFERENCE.md): converts a published hardware TFLOP/s
    to the model TFLOP/s partita reports."""
    s, h, n, v = seq, hidden, layers, vocab
    return 96 * (1 + s / (6 * h) + v / (16 * n * h)) / (72 * (1 + s / (6 * h) + v / (12 * n * h)))

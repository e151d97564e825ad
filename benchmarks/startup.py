"""How long a user waits for the smallest things partita does, phase by phase (issue 44: a 2-rank tiny run in
<= 5 s end to end, a small plan in <= 2 s).

Each figure is the median of REPEATS fresh processes, wall time from launch to exit, on this machine with
the load average it had (stated: other work on 2 cores doubles these):

    python     `python -c pass`                                        the interpreter alone
    torch      `python -c "import torch"`                              what every process of a run pays first
    cli        `python -m partita.cli models`                  the CLI's own start (no torch)
    plan       `partita plan --model tiny-gpt --cluster 2xcpu ...`     capture + search + report of a small model,
                                                                       capture cache off (PARTITA_CACHE_DIR=off)
    plan-dynamo  the cold plan with PARTITA_DEFER_DYNAMO=0             the capture imports torch._dynamo, as it did
                                                                       before costmodel.capture.defer (side by side)
    plan-warm  the same plan with its capture cached                   search + report: the capture, name, config
                                                                       and fingerprint read from the capture cache
                                                                       (costmodel.capture.cache), warmed by one
                                                                       untimed run; no torch import
    check      `python -m partita.runtime.train PLAN --check`          the pre-flight alone (inside `partita run`
                                                                       it runs in the launcher's process)
    run        `partita run PLAN --model tiny-gpt --steps 2`           launcher with its pre-flight, torchrun's
                                                                       agent, 2 workers forked from it
                                                                       (runtime.launcher.fork), 2 steps, report
    run-spawn  the same with PARTITA_WORKER_START=spawn                the workers as new interpreters, as on a
                                                                       GPU host (each imports torch and more)

    python -m benchmarks.startup        # writes benchmarks/results/startup.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import write

ROOT = Path(__file__).resolve().parents[1]
REPEATS = 5
TARGETS = {"plan-warm": 2.0, "run": 5.0}
"""Seconds the issue asks for, end to end, on this project's 2-core machine (a small plan: with its capture
cached, as every plan of a model but the first is)."""
WARMED = ("plan-warm",)
"""Phases run once, untimed, before their timed runs."""


def _env(work: Path, phase: str) -> dict:
    """The phase's environment: a capture cache of the run's own (never the user's), off for the cold plan."""
    cache = "off" if phase in ("plan", "plan-dynamo") else str(work / "cache")
    start = {"PARTITA_WORKER_START": "spawn"} if phase == "run-spawn" else {}
    dynamo = {"PARTITA_DEFER_DYNAMO": "0"} if phase == "plan-dynamo" else {}
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PARTITA_CACHE_DIR": cache, **start,
            **dynamo}


def timed(cmd: list[str], cwd: Path, phase: str) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=_env(cwd, phase), capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return wall


def phases(work: Path) -> dict[str, list[str]]:
    py, cli = sys.executable, [sys.executable, "-m", "partita.cli"]
    plan = str(work / "tiny.json")
    return {
        "python": [py, "-c", "pass"],
        "torch": [py, "-c", "import torch"],
        "cli": [*cli, "models"],
        "plan": [*cli, "plan", "--model", "tiny-gpt", "--cluster", "2xcpu", "--global-batch", "4", "--out", plan],
        "plan-dynamo": [*cli, "plan", "--model", "tiny-gpt", "--cluster", "2xcpu", "--global-batch", "4", "--out", plan],
        "plan-warm": [*cli, "plan", "--model", "tiny-gpt", "--cluster", "2xcpu", "--global-batch", "4", "--out", plan],
        "check": [py, "-m", "partita.runtime.train", plan, "--model", "tiny-gpt", "--check"],
        "run": [*cli, "run", plan, "--model", "tiny-gpt", "--steps", "2"],
        "run-spawn": [*cli, "run", plan, "--model", "tiny-gpt", "--steps", "2"],
    }


def measure(repeats: int = REPEATS) -> dict:
    with tempfile.TemporaryDirectory(prefix="partita-startup-") as tmp:
        work = Path(tmp)
        load_before = list(os.getloadavg())
        rows = {}
        for name, cmd in phases(work).items():  # in order: `plan` writes the plan the later phases read
            if name in WARMED:
                timed(cmd, work, name)
            times = [timed(cmd, work, name) for _ in range(repeats)]
            rows[name] = {"median_s": statistics.median(times), "times_s": times, "command": " ".join(cmd[1:])}
            if name.startswith("plan"):
                rows[name]["capture_cache"] = "warm" if name in WARMED else "off"
            print(f"{name:<11} {rows[name]['median_s']:6.2f} s  (median of {repeats}: "
                  f"{', '.join(f'{t:.2f}' for t in times)})", flush=True)
    targets = {k: {"target_s": v, "median_s": rows[k]["median_s"], "met": rows[k]["median_s"] <= v}
               for k, v in TARGETS.items()}
    return {"repeats": repeats, "load_average_before": load_before, "load_average_after": list(os.getloadavg()),
            "phases": rows, "targets": targets}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.startup", description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=REPEATS)
    args = ap.parse_args(argv)
    result = measure(args.repeats)
    print(f"wrote {write('startup', result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

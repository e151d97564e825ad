"""Run every benchmark, each in its own process, and record how long each took.

    python -m benchmarks.run_all                      # all of them (about 30 minutes on 2 cores)
    python -m benchmarks.run_all solver fidelity      # only these

Each benchmark writes its own benchmarks/results/NAME.json and NAME.png; this writes run_all.json with
every benchmark's exit code and wall time. Timings are only as quiet as the machine: run it alone.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import write

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ["table1", "planner_speed", "solver", "fidelity", "runtime_overhead", "published", "examples", "rec"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.run_all", description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", metavar="NAME", help=f"benchmarks to run, of {', '.join(BENCHMARKS)} (default: all)")
    args = ap.parse_args(argv)
    names = args.names or BENCHMARKS
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        ap.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rows, t0 = [], time.perf_counter()
    for name in names:
        print(f"=== {name}", flush=True)
        t1 = time.perf_counter()
        code = subprocess.call([sys.executable, "-m", f"benchmarks.{name}"], cwd=ROOT, env=env)
        rows.append({"name": name, "exit_code": code, "wall_s": time.perf_counter() - t1})
        print(f"=== {name}: exit {code} in {rows[-1]['wall_s']:.0f} s", flush=True)
    total = time.perf_counter() - t0
    path = write("run_all", {"benchmarks": rows, "total_wall_s": total})
    for r in rows:
        print(f"{r['name']:<18} exit {r['exit_code']}  {r['wall_s']:7.1f} s")
    print(f"total {total:.0f} s; wrote {path}")
    return max((r["exit_code"] for r in rows), default=0)


if __name__ == "__main__":
    sys.exit(main())

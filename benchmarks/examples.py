"""The README's example outputs, produced by running their commands (never retyped).

    python -m benchmarks.examples      # writes benchmarks/results/examples.json; benchmarks.report puts it in README.md and docs/plans.md

Each example is a shell command line of the `partita` CLI run in a fresh process from the repository root
(`partita` is `python -m partita.cli`); its standard output is recorded as printed, at 120 columns.
The tiny run trains on this machine, so its measured times are this machine's.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import write

ROOT = Path(__file__).resolve().parents[1]
PLAN = "partita plan --model gpt3-175b --cluster 128x8xA100-80GB --global-batch 1536 --seq 2048 --baselines"
WHAT_IF = "partita plan --model gpt3-175b --cluster 128x8xA100-80GB --global-batch 1536 --seq 2048 --tp 8 --pp 8 --zero 0"
TINY_PLAN = "partita plan --model tiny-gpt --cluster 4xcpu --global-batch 8 --out {dir}/tiny.json"
TINY_RUN = "partita run {dir}/tiny.json --model tiny-gpt --steps 3 --verify"


def run(command: str) -> dict:
    argv = command.split()
    assert argv[0] == "partita"
    # no capture cache: the printed capture and search seconds are what a model's first plan costs (as planner_speed)
    env = {**os.environ, "COLUMNS": "120", "OMP_NUM_THREADS": "1", "PARTITA_CACHE_DIR": "off"}
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "partita.cli", *argv[1:]], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"benchmarks.examples: `{command}` failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    return {"command": command, "stdout": p.stdout.rstrip("\n"), "seconds": time.perf_counter() - t0}


def main() -> int:
    out = {"plan": run(PLAN), "what_if": run(WHAT_IF)}
    with tempfile.TemporaryDirectory() as d:
        plan = run(TINY_PLAN.format(dir=d))
        train = run(TINY_RUN.format(dir=d))
    shown = "/tmp"  # the temporary directory's name is noise: the README shows a stable one
    for r in (plan, train):
        r["command"] = r["command"].replace(d, shown)
        r["stdout"] = r["stdout"].replace(d, shown)
    out["tiny_plan"], out["tiny_run"] = plan, train
    path = write("examples", out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

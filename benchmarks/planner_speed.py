"""How long planning takes: capture + costs + search, against model size and against cluster size.

Every configuration is planned in a fresh Python process with the capture cache off (PARTITA_CACHE_DIR=off:
nothing, graph capture included, is cached between them), and then once more with a warm capture cache (the plan
after a model's first) through `partita.planner.api.plan_search`, the call behind `partita plan`; the process
reports its own split (imports, capture, search, MILP time summed over the candidates solved, how many
candidates there were and how many were solved rather than pruned by the lower bound), and the parent
times the whole process from launch to exit.

- model size: the ten megatron-* presets (1.7B .. 1T) on their Megatron-LM Table 1 clusters and batches
  (benchmarks.table1.ROWS);
- cluster size: gpt3-175b on 64 .. 4096 A100-80GB (global batch 1536, seq 2048), llama3-405b on
  1,024 .. 16,384 H100-80GB (global batch 2048);
- headline targets, timed as a user runs them (`python -m partita.cli plan ... --json`, the `partita`
  console script's module, in a fresh process, wall time from launch to exit, `REPEATS` times):
  gpt3-175b on 1024 A100-80GB under 30 s, llama3-405b on 16,384 H100-80GB under 60 s.

    python -m benchmarks.planner_speed          # writes benchmarks/results/planner_speed.json and .png
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import pyplot, save_figure, try_plot, write

ROOT = Path(__file__).resolve().parents[1]
REPEATS = 3
HEADLINES = [  # name, model, cluster, global batch, seq, target seconds
    ("gpt3-175b on 1024 A100-80GB", "gpt3-175b", "128x8xA100-80GB", 1536, 2048, 30.0),
    ("llama3-405b on 16384 H100-80GB", "llama3-405b", "2048x8xH100-80GB", 2048, None, 60.0),
]
GPT3_GPUS = (64, 128, 256, 512, 1024, 2048, 4096)
LLAMA_GPUS = (1024, 2048, 4096, 8192, 16384)


def _env(cache: str = "off") -> dict:
    """`cache` "off": every plan captures (what a model's first plan costs); a directory: the capture cache there."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            "PARTITA_CACHE_DIR": cache}


# ------------------------------------------------------------------------------- in the fresh process

def worker(model: str, cluster: str, global_batch: int, seq: int | None) -> dict:
    """Plan once in this process and return the split of its time (the parent adds the process wall)."""
    from partita.planner.api import plan_search
    from partita.planner.search import TrainConfig
    t1 = time.perf_counter()
    result, plan = plan_search(model, cluster=cluster, train=TrainConfig(global_batch=global_batch, seq_len=seq))
    t2 = time.perf_counter()
    solved = [c for c in result.candidates if c.solution is not None]
    mesh = plan.mesh
    return {
        "capture_s": result.graph.capture_seconds, "search_s": result.wall_time_s,
        "milp_s": sum(c.solution.wall_time_s for c in solved), "plan_total_s": t2 - t1,
        "candidates": result.considered, "candidates_built": len(result.candidates), "candidates_solved": len(solved),
        "graph_nodes": len(result.graph), "layers": len(result.layers),
        "plan": {"pp": mesh.pp, "dp": mesh.dp, "tp": mesh.tp, "zero": plan.zero_stage,
                 "micro_batch": plan.schedule.micro_batch_size, "schedule": plan.schedule.name,
                 "step_time_s": plan.predicted["step_time_s"], "mfu": plan.predicted["mfu"]},
    }


# ------------------------------------------------------------------------------------- in the parent

def measure(model: str, cluster: str, global_batch: int, seq: int | None = None, timeout: float = 600) -> dict:
    """Plan `model` on `cluster` in a fresh process; its own split plus the process wall time. Then again with a warm
    capture cache (a plan that stored the capture in a fresh cache directory first, untimed): `warm_process_wall_s`
    and `warm_search_s`, what every later plan of the model costs."""
    row, wall = _worker(model, cluster, global_batch, seq, "off", timeout)
    with tempfile.TemporaryDirectory(prefix="partita-speed-cache-") as cache:
        _worker(model, cluster, global_batch, seq, cache, timeout)
        warm, warm_wall = _worker(model, cluster, global_batch, seq, cache, timeout)
    return {"model": model, "cluster": cluster, "global_batch": global_batch, "seq": seq,
            "devices": _devices(cluster), "process_wall_s": wall, **row,
            "startup_s": wall - row["plan_total_s"],  # interpreter start, imports, exit
            "warm_process_wall_s": warm_wall, "warm_search_s": warm["search_s"], "warm_capture_s": warm["capture_s"]}


def _worker(model: str, cluster: str, global_batch: int, seq: int | None, cache: str,
            timeout: float) -> tuple[dict, float]:
    cmd = [sys.executable, "-m", "benchmarks.planner_speed", "--worker", model, cluster, str(global_batch),
           str(seq or 0)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(cache), capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"planning {model} on {cluster} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), wall


def headline(name: str, model: str, cluster: str, global_batch: int, seq: int | None, target: float,
             repeats: int = REPEATS) -> dict:
    """`python -m partita.cli plan ... --json` in a fresh process, timed from launch to exit."""
    cmd = [sys.executable, "-m", "partita.cli", "plan", "--model", model, "--cluster", cluster,
           "--global-batch", str(global_batch), "--json"] + (["--seq", str(seq)] if seq else [])
    walls, solver = [], {}
    for _ in range(repeats):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
        walls.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
        out = json.loads(proc.stdout)
        solver = out["solver"]
        mesh = out["mesh"]
    return {"name": name, "command": "partita " + " ".join(cmd[3:]), "target_s": target,
            "wall_s": walls, "median_s": statistics.median(walls), "max_s": max(walls),
            "passed": max(walls) < target,
            "solver": {k: solver.get(k) for k in ("capture_s", "wall_time_s", "total_s", "candidates",
                                                   "candidates_solved", "status", "mip_gap")},
            "plan_mesh": mesh}


def _devices(cluster: str) -> int:
    n = 1
    for part in cluster.split("x")[:-1]:
        n *= int(part)
    return n


def _line(r: dict) -> str:
    return (f"{r['model']:<14} {r['devices']:>6} devices  layers {r['layers']:>3}  capture {r['capture_s']:5.2f} s  "
            f"search {r['search_s']:5.2f} s (MILP {r['milp_s']:5.2f} s, {r['candidates_solved']}/{r['candidates']} "
            f"solved)  process {r['process_wall_s']:5.1f} s (warm cache {r['warm_process_wall_s']:4.1f} s)  "
            f"-> pp={r['plan']['pp']} dp={r['plan']['dp']} "
            f"tp={r['plan']['tp']}")


def run(model_rows, gpt3_gpus, llama_gpus, headlines, repeats: int = REPEATS) -> dict:
    by_model, by_cluster = [], {"gpt3-175b": [], "llama3-405b": []}
    for name, _tp, _pp, gpus, batch, _pub in model_rows:
        by_model.append(measure(name, f"{gpus // 8}x8xA100-80GB", batch))
        print(_line(by_model[-1]), flush=True)
    for gpus in gpt3_gpus:
        by_cluster["gpt3-175b"].append(measure("gpt3-175b", f"{gpus // 8}x8xA100-80GB", 1536, 2048))
        print(_line(by_cluster["gpt3-175b"][-1]), flush=True)
    for gpus in llama_gpus:
        by_cluster["llama3-405b"].append(measure("llama3-405b", f"{gpus // 8}x8xH100-80GB", 2048))
        print(_line(by_cluster["llama3-405b"][-1]), flush=True)
    heads = []
    for h in headlines:
        heads.append(headline(*h, repeats=repeats))
        r = heads[-1]
        print(f"headline {r['name']}: {', '.join(f'{w:.1f}' for w in r['wall_s'])} s end to end "
              f"(target < {r['target_s']:.0f} s): {'PASS' if r['passed'] else 'FAIL'}", flush=True)
    rows = by_model + by_cluster["gpt3-175b"] + by_cluster["llama3-405b"]
    summary = {"max_search_s": max(r["search_s"] for r in rows), "max_process_wall_s": max(r["process_wall_s"] for r in rows),
               "max_capture_s": max(r["capture_s"] for r in rows),
               "max_warm_process_wall_s": max(r["warm_process_wall_s"] for r in rows),
               "headlines_passed": all(h["passed"] for h in heads)}
    return {"by_model": by_model, "by_cluster": by_cluster, "headlines": heads, "summary": summary}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.planner_speed", description=__doc__.split("\n")[0])
    ap.add_argument("--worker", nargs=4, metavar=("MODEL", "CLUSTER", "BATCH", "SEQ"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        model, cluster, batch, seq = args.worker
        print(json.dumps(worker(model, cluster, int(batch), int(seq) or None)))
        return 0
    t0 = time.perf_counter()
    from benchmarks.table1 import ROWS  # here, not at the top: it imports torch, which a warm plan does not
    payload = run(ROWS, GPT3_GPUS, LLAMA_GPUS, HEADLINES)
    payload["benchmark_wall_s"] = time.perf_counter() - t0
    path = write("planner_speed", payload)
    print(f"summary: {payload['summary']}\nwrote {path}")
    try_plot(_plot, payload)
    return 0


def _plot(payload: dict) -> None:
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    rows = payload["by_model"]
    layers = [r["layers"] for r in rows]
    for key, label in (("process_wall_s", "end to end (fresh process)"), ("capture_s", "capture"),
                       ("search_s", "search (all candidates)")):
        ax1.plot(layers, [r[key] for r in rows], "o-", label=label)
    for r in rows:
        ax1.annotate(r["model"].replace("megatron-", ""), (r["layers"], r["process_wall_s"]), fontsize=7,
                     textcoords="offset points", xytext=(2, 4))
    ax1.set_xlabel("transformer layers (megatron-* presets on their Table 1 clusters)")
    ax1.set_ylabel("seconds")
    ax1.set_title("planning time against model size")
    ax1.legend(fontsize=8)
    for model, rows in payload["by_cluster"].items():
        if not rows:
            continue
        gpus = [r["devices"] for r in rows]
        line, = ax2.plot(gpus, [r["process_wall_s"] for r in rows], "o-", label=f"{model}: end to end")
        ax2.plot(gpus, [r["search_s"] for r in rows], "s--", color=line.get_color(), label=f"{model}: search")
    for h in payload["headlines"]:
        ax2.axhline(h["target_s"], color="grey", lw=0.8, ls=":")
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("devices")
    ax2.set_ylabel("seconds")
    ax2.set_title("planning time against cluster size")
    ax2.legend(fontsize=8)
    save_figure(fig, "planner_speed")


if __name__ == "__main__":
    sys.exit(main())

"""Cost-model fidelity on this machine: predicted against measured step time and peak memory.

1. Calibrate this machine (`partita.costmodel.calibrate.calibrate(path, ranks=R)`, the code behind `partita
   calibrate --ranks R`) for R = 2 and R = 4 ranks: a calibrated device is one rank's share of the host
   while R ranks compute at once, so plans on W ranks use the calibration made with max(2, W) ranks (the
   resource list a user would write for that run). `--cluster FILE` uses one resource list for all.
2. For each case of PLANS -- a (tp, pp, world size) and a precision path: fp32; bf16 under torch.autocast
   over fp32 parameters (ZeRO-0: DDP, hand-averaged dp, tp, pp); bf16 FSDP2 MixedPrecisionPolicy
   (ZeRO-2/3); compiled layers -- plan a small GPT with the planner's own machinery on that many of the
   calibrated devices: `partita.planner.search.search` restricted to that mesh and ZeRO stage (no
   recompute or offload, 1F1B; the search still picks the micro-batch size) and
   `partita.planner.estimate.build.build_plan`, so each plan's `predicted` comes from the real cost model. A bf16
   capture records the model as CPU autocast runs it (costmodel.capture.trace, autocast="cpu").
3. Run each plan with torchrun on gloo (`python -m torch.distributed.run --standalone --nproc-per-node W
   -m partita.runtime.train plan.json --model M --steps N --losses-out out.json`) and set its measured step time
   (median of steps 2..N, each step the slowest rank's) and peak memory (the runtime's, see
   runtime/loop/memory.py) beside the prediction.

Reported: per plan, and over the fp32 eager plans (the ones the calibrated time model is checked on) the
median absolute step-time error and the Spearman rank correlation of predicted and measured step times;
over all plans, and per precision path, the median and largest absolute memory error. Targets: rank
correlation >= 0.9, median step-time error <= 20%, memory error <= 5%.

The cost model charges, beside FLOPs and bytes, what this runtime costs on a CPU host and `partita
calibrate` measures (costmodel.hardware.Device): operator launches (op_latency), each collective message
step inside a step (sync_latency, costmodel.price.comm), DTensor's dispatch on tensor-parallel nodes
(sharded_op_latency), per tensor-parallel collective (redistribute_latency) and per DTensor parameter
in the optimizer (sharded_param_latency), and the loss all-reduce of every step (planner.search).

    python -m benchmarks.fidelity [--cluster FILE] [--steps N] [--reuse] [--launches N]
    # writes results/fidelity.json and .png; --reuse: the calibrations of the last run; --launches N:
    # each plan N times, keeping the least disturbed launch
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from benchmarks import common
from benchmarks.common import pyplot, save_figure, try_plot, write

ROOT = Path(__file__).resolve().parents[1]
MODEL = "gpt:layers=4,hidden=256,heads=4,seq=128,vocab=2048"
GLOBAL_BATCH = 8
STEPS = 10


class Case(NamedTuple):
    """One plan of the benchmark: a mesh (dp = world / (tp pp)), a precision and a ZeRO stage, the kernels."""

    tp: int
    pp: int
    world: int
    dtype: str = "fp32"
    zero: int = 0
    kernels: str = "eager"

    @property
    def precision(self) -> str:
        """The runtime's precision path (runtime/parallel/precision.py), with "compiled" for compiled layers."""
        from partita.planner.plan.executable import runs_autocast
        path = ("fp32" if self.dtype == "fp32" else
                "bf16 autocast" if runs_autocast(self.dtype, self.zero) else "bf16 FSDP2")
        return path + (", compiled" if self.kernels == "compiled" else "")


PLANS = [Case(*c) for c in [
    (1, 1, 1),
    (1, 1, 2), (2, 1, 2), (1, 2, 2),
    (1, 1, 4), (4, 1, 4), (1, 4, 4), (2, 1, 4), (1, 2, 4), (2, 2, 4),
    # bf16 under autocast over fp32 parameters: one rank, DDP, tp, pp, and dp averaged by hand beside tp / pp
    (1, 1, 1, "bf16"), (1, 1, 2, "bf16"), (2, 1, 2, "bf16"), (1, 2, 2, "bf16"), (2, 1, 4, "bf16"),
    (1, 2, 4, "bf16"),
    # bf16 FSDP2 (MixedPrecisionPolicy): ZeRO-3 and ZeRO-2
    (1, 1, 2, "bf16", 3), (1, 1, 2, "bf16", 2), (1, 1, 4, "bf16", 3),
    # compiled layers (torch.compile per block), fp32 and bf16 autocast
    (1, 1, 1, "fp32", 0, "compiled"), (1, 1, 1, "bf16", 0, "compiled"),
]]
TIMED = "fp32"
"""The precision path whose step times the targets judge: the calibration measures fp32 (a CPU runs bf16
matmuls by other kernels than the GPUs the bf16 model is for)."""
TARGETS = {"spearman_min": 0.9, "median_step_time_error_max": 0.20, "memory_error_max": 0.05}


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation: Pearson's correlation of the ranks (ties get their mean rank)."""
    def ranks(v):
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else float("nan")


def calibrated_cluster(resources: dict, devices: int):
    """The calibrated resource list with `devices` devices on its one node (measured figures unchanged)."""
    from partita.costmodel.hardware.resources import cluster_from_dict
    d = copy.deepcopy(resources)
    d["groups"][0]["devices_per_node"] = devices
    return cluster_from_dict(d, spec=f"{devices}x calibrated cpu")


def make_plans(resources, model: str = MODEL, plans=PLANS, global_batch: int = GLOBAL_BATCH) -> list:
    """(Case, Plan) for each case (a Case or a (tp, pp, world) tuple), each solved by the planner under the
    calibrated cost model. `resources` is a resource list (dict) or a function world size -> resource list."""
    pick = resources if callable(resources) else (lambda world: resources)
    from partita.costmodel import model_fingerprint
    from partita.costmodel.models import resolve_model
    from partita.costmodel.capture import capture
    from partita.planner.estimate.build import build_plan
    from partita.planner.search import SearchSpace, TrainConfig, search
    from partita.runtime.launcher.checks import build_meta
    spec = resolve_model(model)
    graphs = {}
    fingerprint = model_fingerprint(build_meta(spec))
    out = []
    for case in (Case(*c) for c in plans):
        if case.dtype not in graphs:  # CPU ranks run CPU autocast's lists
            graphs[case.dtype] = capture(spec, dtype=case.dtype, autocast="cpu")
        train = TrainConfig(global_batch=global_batch, dtype=case.dtype, schedule="1F1B")
        space = SearchSpace(name=f"tp{case.tp} pp{case.pp}", tp=(case.tp,), pp=(case.pp,), zero=(case.zero,),
                            recompute=("none",), offload=False, kernels=case.kernels)
        result = search(graphs[case.dtype], calibrated_cluster(pick(case.world), case.world), train, space=space)
        plan = build_plan(result, spec.name, fingerprint, spec.config)
        # as planner.api records them (the runtime reads the kernels there: Plan.kernels)
        plan.solver["fixed"] = {k: list(v) if isinstance(v, tuple) else v for k, v in space.fixed().items()}
        out.append((case, plan))
    return out


def run_plan(plan, world: int, model: str, steps: int, workdir: Path) -> dict:
    """torchrun the plan; returns runtime.train's --losses-out JSON and the launch's wall time."""
    m = plan.mesh
    stem = f"pp{m.pp}-dp{m.dp}-tp{m.tp}"
    plan_file, out_file = workdir / f"{stem}.plan.json", workdir / f"{stem}.out.json"
    plan.save(plan_file)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
           "-m", "partita.runtime.train", str(plan_file), "--model", model, "--steps", str(steps),
           "--losses-out", str(out_file)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not out_file.exists():
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return {**json.loads(out_file.read_text()), "launch_wall_s": wall, "load_average_1min_at_launch": load}


def compare(case: Case, plan, out: dict) -> dict:
    pred = plan.predicted
    timed = out["step_times_s"][1:]
    measured_t = statistics.median(timed)
    stage = max(pred["memory_per_stage"], key=lambda r: r["total"])
    return {
        "mesh": {"pp": plan.mesh.pp, "dp": plan.mesh.dp, "tp": plan.mesh.tp, "world": case.world},
        "precision": case.precision, "dtype": case.dtype, "zero": case.zero, "kernels": case.kernels,
        "schedule": {"name": plan.schedule.name, "num_microbatches": plan.schedule.num_microbatches,
                     "micro_batch_size": plan.schedule.micro_batch_size},
        "predicted_step_time_s": pred["step_time_s"], "measured_step_time_s": measured_t,
        "measured_step_time_mean_s": out["step_time_s"], "measured_step_times_s": out["step_times_s"],
        "step_time_error": pred["step_time_s"] / measured_t - 1,
        "predicted_breakdown": pred["breakdown"],
        "predicted_peak_memory_bytes": pred["peak_memory_bytes"], "measured_peak_memory_bytes": out["peak_memory_bytes"],
        "memory_error": pred["peak_memory_bytes"] / out["peak_memory_bytes"] - 1,
        "predicted_memory_largest_stage": stage,
        "memory_method": out["memory_method"], "peak_rss_bytes": out["peak_rss_bytes"],
        "measured_memory_detail": out.get("memory_detail"),
        "launch_wall_s": out["launch_wall_s"], "load_average_1min_at_launch": out["load_average_1min_at_launch"],
    }


def summarise(rows: list[dict]) -> dict:
    """Step-time figures over the TIMED (fp32 eager) plans; memory over all plans and per precision path."""
    timed = [r for r in rows if r.get("precision", TIMED) == TIMED] or rows
    pred = [r["predicted_step_time_s"] for r in timed]
    meas = [r["measured_step_time_s"] for r in timed]
    t_err = [abs(r["step_time_error"]) for r in timed]
    m_err = [abs(r["memory_error"]) for r in rows]
    rho = spearman(pred, meas)
    by_world = {}
    for w in sorted({r["mesh"]["world"] for r in timed}):
        errs = [r["step_time_error"] for r in timed if r["mesh"]["world"] == w]
        by_world[str(w)] = {"plans": len(errs), "median_step_time_error": statistics.median(errs)}
    by_precision = {}
    for path in dict.fromkeys(r.get("precision", TIMED) for r in rows):
        errs = [abs(r["memory_error"]) for r in rows if r.get("precision", TIMED) == path]
        by_precision[path] = {"plans": len(errs), "median_abs_memory_error": statistics.median(errs),
                              "max_abs_memory_error": max(errs)}
    s = {
        "plans": len(rows), "timed_plans": len(timed), "spearman_step_time": rho,
        "median_abs_step_time_error": statistics.median(t_err), "max_abs_step_time_error": max(t_err),
        "median_abs_memory_error": statistics.median(m_err), "max_abs_memory_error": max(m_err),
        "step_time_error_by_world_size": by_world, "memory_error_by_precision": by_precision,
    }
    cap = TARGETS["memory_error_max"]
    s["targets"] = {
        "spearman >= 0.9": {"value": rho, "passed": rho >= TARGETS["spearman_min"]},
        "median step-time error <= 20%": {"value": s["median_abs_step_time_error"],
                                          "passed": s["median_abs_step_time_error"] <= TARGETS["median_step_time_error_max"]},
        "memory error <= 5% (median over plans)": {"value": s["median_abs_memory_error"],
                                                   "passed": s["median_abs_memory_error"] <= cap},
        "memory error <= 5% (every plan)": {"value": s["max_abs_memory_error"],
                                            "passed": s["max_abs_memory_error"] <= cap},
    }
    for path, v in by_precision.items():
        if path != TIMED:
            s["targets"][f"memory error <= 5% (every {path} plan)"] = {
                "value": v["max_abs_memory_error"], "passed": v["max_abs_memory_error"] <= cap}
    return s


def notes(rows: list[dict], summary: dict, calibrations: dict) -> list[str]:
    """What the numbers say about where the error comes from (every figure computed from the data)."""
    cpus = os.cpu_count() or 1
    out = [f"measured memory is {rows[0]['memory_method']} (runtime/loop/memory.py: one extra, untimed step traced "
           "by PyTorch's allocator events; the largest rank)"]
    phases = sorted({r["predicted_memory_largest_stage"].get("phase", "?") for r in rows})
    out.append(f"the predicted peak is the largest phase of the largest stage (planner/search.py memory_phases): "
               f"{', '.join(phases)}")
    for w, e in summary["step_time_error_by_world_size"].items():
        out.append(f"world size {w}: median step-time error {100 * e['median_step_time_error']:+.0f}% "
                   f"({e['plans']} plans; negative = predicted faster than measured)")
    for ranks, res in sorted(calibrations.items()):
        dev, meas = res["groups"][0]["device"], res.get("measurements", {})
        line = (f"calibration with {ranks} ranks: fp32 {dev['peak_flops']['fp32'] / 1e9:.0f} GFLOP/s per rank")
        if "compute_share_per_rank" in meas:
            line += f" (a rank's share while all compute: {meas['compute_share_per_rank']:.2f})"
        if "op_latency" in dev:
            line += f", {dev['op_latency'] * 1e6:.0f} us per operator launch"
        line += (f", all-reduce latency {dev['intra_node_latency'] * 1e6:.0f} us and bandwidth "
                 f"{dev['intra_node_bw'] / 1e9:.2f} GB/s")
        if "sync_latency" in dev:
            line += (f"; in a step +{dev['sync_latency'] * 1e6:.0f} us per collective message step, DTensor "
                     f"+{dev.get('sharded_op_latency', 0) * 1e6:.0f} us per launch, "
                     f"+{dev.get('redistribute_latency', 0) * 1e6:.0f} us per tensor-parallel collective, "
                     f"+{dev.get('sharded_param_latency', 0) * 1e6:.0f} us per parameter per optimizer step")
        out.append(line)
        share, bound = meas.get("compute_share_per_rank"), min(1.0, cpus / ranks)
        if share is not None and share > 1.05 * bound:
            out.append(f"the {ranks}-rank calibration credits each rank {share:.2f} of a core, but {ranks} "
                       f"single-threaded ranks on {cpus} cores can have at most {bound:.2f} each: the share is "
                       "measured from per-matmul times while all ranks run, and time a rank spends descheduled "
                       "between matmuls does not show in them, so the cost model charges these ranks too little")
    loads = [r["load_average_1min_at_launch"] for r in rows if "load_average_1min_at_launch" in r]
    if loads and max(loads) > cpus:
        out.append(f"other processes ran beside the benchmark: the 1-minute load average at the launches was "
                   f"{min(loads):.1f}-{max(loads):.1f} on {cpus} cores, so measured step times include waiting for "
                   "a core (memory is not affected)")
    upper = [r for r in rows if ((r.get("measured_memory_detail") or {}).get("unreported_free_bytes") or 0) > 0]
    if upper:
        worst = max(upper, key=lambda r: abs(r["memory_error"]))
        m = worst["mesh"]
        out.append(f"{len(upper)} plans' measured peaks are upper bounds: blocks freed on gloo's threads are not "
                   f"reported and count as live until their address is reused (runtime/loop/memory.py); on the one "
                   f"predicted furthest below its measurement, pp{m['pp']} dp{m['dp']} tp{m['tp']} "
                   f"({worst.get('precision', TIMED)}, {100 * worst['memory_error']:+.1f}%), "
                   f"{worst['measured_memory_detail']['unreported_free_bytes'] / 2**20:.1f} MiB were counted so")
    if max(r["mesh"]["world"] for r in rows) > cpus:
        out.append(f"this machine has {cpus} cores: ranks beyond that (OMP_NUM_THREADS=1 each) time-share the "
                   "cores, so timings of 4-rank plans depend on how the OS schedules them and on any other load "
                   f"(load average before/after the runs is recorded)")
    timed = [r for r in rows if r.get("precision", TIMED) == TIMED]
    tp = [r["step_time_error"] for r in timed if r["mesh"]["tp"] > 1]
    rest = [r["step_time_error"] for r in timed if r["mesh"]["tp"] == 1]
    if tp and rest:
        out.append(f"tensor-parallel plans: median step-time error {100 * statistics.median(tp):+.0f}% against "
                   f"{100 * statistics.median(rest):+.0f}% for the others; TP issues several small gloo collectives "
                   "per layer (forward and backward), each paying gloo's latency and DTensor's Python dispatch")
    for path, v in summary.get("memory_error_by_precision", {}).items():
        worst = max((r for r in rows if r.get("precision", TIMED) == path), key=lambda r: abs(r["memory_error"]))
        m = worst["mesh"]
        out.append(f"{path}: peak memory within {100 * v['max_abs_memory_error']:.1f}% of the allocator on all "
                   f"{v['plans']} plans (median {100 * v['median_abs_memory_error']:.1f}%; largest pp{m['pp']} "
                   f"dp{m['dp']} tp{m['tp']} ZeRO-{worst.get('zero', 0)}, {100 * worst['memory_error']:+.1f}%)")
    if any(r.get("precision", TIMED) != TIMED for r in rows):
        out.append("step-time figures are over the fp32 eager plans: the calibration measures fp32, and this CPU runs "
                   "bf16 matmuls by other kernels than the GPUs the bf16 model is for")
    return out


def run(cluster_file: str | None = None, steps: int = STEPS, model: str = MODEL, plans=PLANS,
        global_batch: int = GLOBAL_BATCH, reuse: bool = False, launches: int = 1) -> dict:
    """`reuse`: take the calibrations an earlier run wrote (results/fidelity_cluster_<R>ranks.json) instead
    of calibrating again. `launches`: run each plan that many times and keep the launch with the lowest
    median step time (the one least disturbed by other load on a shared machine)."""
    t0 = time.perf_counter()
    load_before = os.getloadavg()
    files: dict[int, str] = {}
    plans = [Case(*c) for c in plans]
    wanted = {r: common.RESULTS / f"fidelity_cluster_{r}ranks.json" for r in {max(2, c.world) for c in plans}}
    if reuse and cluster_file is None and all(f.exists() for f in wanted.values()):
        files = {ranks: str(f) for ranks, f in wanted.items()}
    elif cluster_file is None:
        from partita.costmodel.calibrate import calibrate
        common.RESULTS.mkdir(parents=True, exist_ok=True)
        for ranks in sorted({max(2, c.world) for c in plans}):
            files[ranks] = str(common.RESULTS / f"fidelity_cluster_{ranks}ranks.json")
            calibrate(files[ranks], ranks=ranks, quick=False)
            print(f"calibrated this machine for {ranks} ranks: {files[ranks]} [{time.perf_counter() - t0:.1f} s]",
                  flush=True)
    else:
        files = {max(2, c.world): cluster_file for c in plans}
    calibrations = {ranks: json.loads(Path(f).read_text()) for ranks, f in files.items()}
    rows = []
    with tempfile.TemporaryDirectory(prefix="partita-fidelity-") as tmp:
        for case, plan in make_plans(lambda w: calibrations[max(2, w)], model, plans, global_batch):
            outs = [run_plan(plan, case.world, model, steps, Path(tmp)) for _ in range(max(1, launches))]
            medians = [statistics.median(o["step_times_s"][1:]) for o in outs]
            rows.append(compare(case, plan, outs[medians.index(min(medians))]))
            rows[-1]["launch_medians_s"] = medians
            r = rows[-1]
            print(f"{case.precision}, ZeRO-{case.zero}: pp={r['mesh']['pp']} dp={r['mesh']['dp']} tp={r['mesh']['tp']} (W={case.world}, "
                  f"{r['schedule']['num_microbatches']}x{r['schedule']['micro_batch_size']}): step "
                  f"{r['predicted_step_time_s'] * 1e3:6.1f} ms predicted / {r['measured_step_time_s'] * 1e3:6.1f} ms "
                  f"measured ({100 * r['step_time_error']:+5.0f}%), memory {r['predicted_peak_memory_bytes'] / 2**20:6.1f} / "
                  f"{r['measured_peak_memory_bytes'] / 2**20:6.1f} MiB ({100 * r['memory_error']:+5.1f}%)", flush=True)
    summary = summarise(rows)
    rel = lambda f: os.path.relpath(f, ROOT) if f.startswith(str(ROOT)) else f
    return {"model": model, "global_batch": global_batch, "steps": steps,
            "dtype": "/".join(dict.fromkeys(c.dtype for c in plans)),
            "precisions": list(dict.fromkeys(c.precision for c in plans)),
            "cluster_files": {str(r): rel(f) for r, f in files.items()},
            "calibrated_devices": {str(r): c["groups"][0]["device"] for r, c in calibrations.items()},
            "plans": rows, "summary": summary, "notes": notes(rows, summary, calibrations),
            "load_average": {"before": load_before, "after": os.getloadavg()},
            "benchmark_wall_s": time.perf_counter() - t0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.fidelity", description=__doc__.split("\n")[0])
    ap.add_argument("--cluster", help="a calibrated resource list to reuse (default: calibrate now)")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--reuse", action="store_true",
                    help="reuse the calibrations of an earlier run (results/fidelity_cluster_<R>ranks.json)")
    ap.add_argument("--launches", type=int, default=1,
                    help="launch each plan N times and keep the least disturbed launch (lowest median step)")
    args = ap.parse_args(argv)
    payload = run(args.cluster, args.steps, reuse=args.reuse, launches=args.launches)
    path = write("fidelity", payload)
    for name, t in payload["summary"]["targets"].items():
        print(f"  {name}: {t['value']:.3f} {'PASS' if t['passed'] else 'FAIL'}")
    print(f"wrote {path}")
    try_plot(_plot, payload)
    return 0


def _plot(payload: dict) -> None:
    plt = pyplot()
    every = payload["plans"]
    timed = [r for r in every if r.get("precision", TIMED) == TIMED]
    marks = {p: m for p, m in zip(dict.fromkeys(r.get("precision", TIMED) for r in every), "osD^vP")}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, key, unit, scale, rows in ((ax1, "step_time_s", "ms", 1e3, timed),
                                       (ax2, "peak_memory_bytes", "MiB", 1 / 2**20, every)):
        xs = [r[f"measured_{key}"] * scale for r in rows]
        ys = [r[f"predicted_{key}"] * scale for r in rows]
        for path, mark in marks.items():
            pick = [i for i, r in enumerate(rows) if r.get("precision", TIMED) == path]
            if pick:
                ax.scatter([xs[i] for i in pick], [ys[i] for i in pick], marker=mark, label=path,
                           c=[{1: "C0", 2: "C1", 4: "C2"}.get(rows[i]["mesh"]["world"], "C3") for i in pick])
        if ax is ax2 and len(marks) > 1:
            ax.legend(fontsize=7)
        for r, x, y in zip(rows, xs, ys):
            m = r["mesh"]
            ax.annotate(f"pp{m['pp']}dp{m['dp']}tp{m['tp']}", (x, y), fontsize=7, textcoords="offset points",
                        xytext=(3, 3))
        lo, hi = min(xs + ys) * 0.8, max(xs + ys) * 1.2
        ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8)
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"measured, {unit}")
        ax.set_ylabel(f"predicted, {unit}")
    s = payload["summary"]
    ax1.set_title(f"step time, fp32 (Spearman {s['spearman_step_time']:.2f}, median |err| "
                  f"{100 * s['median_abs_step_time_error']:.0f}%)\nblue W=1, orange W=2, green W=4", fontsize=9)
    ax2.set_title(f"peak memory (median |err| {100 * s['median_abs_memory_error']:.1f}%)", fontsize=9)
    save_figure(fig, "fidelity")


if __name__ == "__main__":
    sys.exit(main())

"""A GPU check: the planner's plans for the local GPU, run, with predicted beside measured.

    python -m benchmarks.gpu [--steps N] [--only CASE ...] [--timeout S]   # on a CUDA machine: results/gpu.json
                             [--budget-s S]                             #   (--only, --budget-s keep the other
                                                                        #   cases' rows; --budget-s prints the rest)
    python -m benchmarks.gpu --plan-only [--device PRESET ...]             # with the solver: benchmarks/gpu_plans/
    python -m benchmarks.gpu --reprice                                      # with the solver: gpu.json's cases
                                                                            #   predicted again at this commit

On a machine with CUDA it takes the local GPU's preset (costmodel.hardware.gpu_preset: an H100 80 GB is
H100-80GB, an H200 H200-141GB), the fixed set of plans for one such GPU (benchmarks.gpu_plans: M1 of
GPU-MEASUREMENTS.md as the planner chooses it and with no recompute, full recompute, micro-batch 2 and compiled
layers; llama3-8b as the planner chooses it; the largest llama3-8b-shaped model that fits), runs each with

    partita run PLAN --model MODEL --steps N --losses-out OUT      (python -m partita.cli, a subprocess)

and writes, per plan, predicted beside measured to benchmarks/results/gpu.json:

- step time: the plan's `predicted.step_time_s` against the run's mean of steps 2..N (runtime/loop/report.py);
  the run takes one step more, N + 1, under the profiler (`partita run --profile-out`, runtime.loop.profile), left
  out of the mean: its operators' device times, largest first, are the row's "profile" -- which operators a
  mispriced step spent its time in;
- peak memory: the plan's `predicted.peak_memory_bytes` against torch.cuda.max_memory_allocated (what the
  prediction counts), and torch.cuda.max_memory_reserved beside it (allocated + the caching allocator's cache,
  what an out-of-memory is decided against);
- errors (predicted - measured) / measured: negative when the prediction is faster or smaller;
- a run that fails: `oom` when it ran out of memory (CUDA's "out of memory", or the CPU allocator's "can't
  allocate memory"), and its error line; a plan the planner refused: its one line, not run.

Without CUDA it says so in one line and exits 0.

On a lent GPU machine (torch preinstalled, no cvxpy or highspy, no package index: TORCH-NOTES.md) the whole
check is one command from the repository root, nothing to install: `python -m benchmarks.gpu`. The plans are
made beforehand with `--plan-only` on a machine with the solver and shipped in benchmarks/gpu_plans/ (re-run
it and commit the plans whenever the planner or the presets change: gpu.json records the commit they were
planned at); where the solver imports, the benchmark plans afresh instead. It says which in one line.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common
from benchmarks.gpu_plans import PRESETS, Planned, plan_set, read_plans, solver_available, write_plans

ROOT = Path(__file__).resolve().parents[1]
STEPS = 6
TIMEOUT_S = 300
FAILED_TAIL_CHARS = 3000
PROFILE_TOP = 40
"""Operators of each run's profiled step kept in gpu.json (largest self time first)."""
OOM = re.compile(r"out of memory|OutOfMemoryError|can't allocate memory", re.I)


def error_line(output: str) -> str | None:
    """The run's own one-line error (`partita: error: ...`), else its last line that names an error."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("partita: error:"):
            return line
    named = [line for line in lines if "Error" in line or "error" in line]
    return named[-1] if named else (lines[-1] if lines else None)


def _error(predicted: float | None, measured: float | None) -> float | None:
    return None if not predicted or not measured else (predicted - measured) / measured


def _plan_summary(plan: dict) -> dict:
    """What the planner chose, in the words of `partita plan`: mesh, micro-batching, recompute per block."""
    recompute: dict[str, int] = {}
    for b in plan.get("blocks", []):
        recompute[b["recompute"]] = recompute.get(b["recompute"], 0) + 1
    fixed = (plan.get("solver") or {}).get("fixed") or {}
    return {"mesh": plan["mesh"], "micro_batch": plan["schedule"]["micro_batch_size"],
            "num_microbatches": plan["schedule"]["num_microbatches"], "recompute": recompute,
            "offloaded_blocks": sum(bool(b.get("offload_activations")) for b in plan.get("blocks", [])),
            "kernels": fixed.get("kernels", "eager"), "fixed": fixed}


def result_row(planned: Planned, returncode: int | None, output: str, measured: dict | None,
               wall_s: float | None = None) -> dict:
    """One row of gpu.json: the case, the plan's choices and prediction, and what its run measured.

    `measured` is the run's --losses-out JSON (runtime.loop.session), None when the run wrote none; `output` its
    stdout and stderr, read for the error line and whether it ran out of memory."""
    case = planned.case
    row = {"name": case.name, "what": case.what, "model": case.model, "global_batch": case.global_batch,
           "seq": case.seq}
    if planned.plan is None:
        return {**row, "infeasible": planned.infeasible, "oom": False, "error": None, "measured": None}
    plan = json.loads(planned.plan.to_json())
    pred = plan["predicted"]
    row.update(plan=_plan_summary(plan), predicted={"step_time_s": pred["step_time_s"],
                                                    "peak_memory_bytes": pred["peak_memory_bytes"],
                                                    "usable_bytes": pred.get("memory_capacity_bytes"),
                                                    # the headroom it was planned under: a flat fraction, or
                                                    # null for the allocator's predicted cache
                                                    "memory_headroom": pred.get("memory_headroom"),
                                                    "allocator_cache_bytes": pred.get("memory_allocator_cache_per_stage"),
                                                    "allocator_cache_factors": pred.get("memory_allocator_cache_factors")},
               returncode=returncode, wall_s=wall_s, alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
    ok = returncode == 0 and measured is not None
    row["oom"] = not ok and bool(OOM.search(output))
    row["error"] = None if ok else error_line(output)
    if not ok:  # the end of what it printed: how far a run that timed out got
        row["measured"], row["output_tail"] = None, output[-FAILED_TAIL_CHARS:]
        return row
    row["measured"] = {"step_time_s": measured["step_time_s"], "step_times_s": measured["step_times_s"],
                       "peak_allocated_bytes": measured["peak_memory_bytes"],
                       "peak_reserved_bytes": measured.get("peak_reserved_bytes"),
                       "memory_method": measured["memory_method"], "losses": measured["losses"]}
    row["step_time_error"] = _error(pred["step_time_s"], measured["step_time_s"])
    row["memory_error"] = _error(pred["peak_memory_bytes"], measured["peak_memory_bytes"])
    return row


def run_case(planned: Planned, steps: int, workdir: Path, timeout_s: float = TIMEOUT_S) -> dict:
    """Run one planned case with `partita run` and return its row (`result_row`)."""
    if planned.plan is None:
        return result_row(planned, None, "", None)
    name = planned.case.name
    plan_file, out_file = workdir / f"{name}.plan.json", workdir / f"{name}.out.json"
    profile_file = workdir / f"{name}.profile.json"
    planned.plan.save(plan_file)
    for f in (out_file, profile_file):
        f.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "partita.cli", "run", str(plan_file), "--model", planned.case.model,
           "--steps", str(steps + 1), "--profile-out", str(profile_file), "--losses-out", str(out_file)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=ROOT)
        code, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:  # its captured output may be bytes, whatever `text` said
        parts = [x.decode(errors="replace") if isinstance(x, bytes) else x for x in (e.stdout, e.stderr) if x]
        code, output = None, "".join(parts) + f"\npartita: error: timed out after {timeout_s:g} s"
    measured = without_profiled_step(json.loads(out_file.read_text())) if out_file.exists() else None
    row = {**result_row(planned, code, output, measured, time.perf_counter() - t0), "steps": steps}
    if profile_file.exists():
        row["profile"] = profile_summary(json.loads(profile_file.read_text()))
    return row


def without_profiled_step(measured: dict) -> dict:
    """A run's --losses-out of N + 1 steps whose last ran under the profiler (--profile-out): the mean step time
    of steps 2..N, the profiled step (slower by the profiler's host overhead) left out as step 1 is."""
    times = measured["step_times_s"][:-1]
    return {**measured, "step_times_s": times, "step_time_s": sum(times[1:]) / max(1, len(times) - 1),
            "profiled_step_s": measured["step_times_s"][-1]}


def profile_summary(profile: dict, top: int = PROFILE_TOP) -> dict:
    """What gpu.json keeps of a run's --profile-out (runtime.loop.profile): its totals and the `top` operators by
    the time it measures (the device's on a GPU), each with its calls and self time."""
    key = "self_device_s" if profile["time"] == "device" else "self_cpu_s"
    return {"time": profile["time"], "total_s": profile["total_s"], "step_time_s": profile["step_time_s"],
            "ops": [{"name": o["name"], "shapes": o.get("shapes", []), "calls": o["calls"], "self_s": o[key]}
                    for o in profile["ops"][:top]]}


def same_run(a, b) -> bool:
    """Whether two plans run alike: the same plan file but for the solver's record (its timings and the
    restrictions it was asked for). M1's own choice is no recompute, so m1-auto and m1-no-recompute are one
    run: measured once, a minute of a lent GPU's short time saved."""
    strip = lambda plan: {k: v for k, v in json.loads(plan.to_json()).items() if k != "solver"}  # noqa: E731
    return a is not None and b is not None and strip(a) == strip(b)


def measured_as(row: dict, planned: Planned) -> dict:
    """`row` (of a case that ran) as the row of `planned`, whose plan runs alike (`same_run`): its own case
    and plan summary, the same measurement, and which case was run ("measured_with")."""
    own = result_row(planned, None, "", None)
    keep = ("returncode", "wall_s", "alloc_conf", "oom", "error", "measured", "step_time_error", "memory_error")
    return {**own, **{k: row[k] for k in keep if k in row}, "measured_with": row["name"]}


def with_earlier_rows(rows: list[dict], earlier: dict | None, preset: str, order: list[str]) -> list[dict]:
    """`rows` of a run of some cases (`--only`) beside an `earlier` gpu.json's rows of the other cases, when
    that file is of the same GPU preset, in the set's `order`: rerunning one case keeps the others'
    measurements. A kept row says which run it came from ("earlier_run") and how many steps it ran ("steps")."""
    if not earlier or earlier.get("gpu", {}).get("preset") != preset:
        return rows
    ran = {r["name"] for r in rows}
    when = {"commit": earlier.get("commit"), "date": (earlier.get("machine") or {}).get("date"),
            "plans_commit": (earlier.get("plans") or {}).get("commit")}
    kept = {r["name"]: {"earlier_run": when, "steps": earlier.get("steps"), **r}
            for r in earlier.get("rows", []) if r["name"] not in ran}
    mine = {r["name"]: r for r in rows}
    return [mine.get(n) or kept[n] for n in order if n in mine or n in kept]


def local_gpu() -> tuple[str, float]:
    import torch
    return torch.cuda.get_device_name(0), float(torch.cuda.get_device_properties(0).total_memory)


def plans_for(preset: str) -> tuple[list[Planned], dict]:
    """The set for one `preset` GPU: planned here when the solver imports, else the shipped plans."""
    if solver_available():
        return plan_set(preset), {"source": "made here", "commit": common.commit()}
    planned, index = read_plans(preset)
    return planned, {"source": "made beforehand and shipped in benchmarks/gpu_plans", "commit": index.get("commit"),
                     "date": index.get("date")}


def write_results(rows: list[dict], gpu: dict, plans: dict, steps: int, name: str = "gpu") -> Path:
    """benchmarks/results/<name>.json (benchmarks.common.write: machine and commit beside the rows)."""
    import torch
    done = [r for r in rows if r.get("measured")]
    summary = {"plans": len(rows), "ran": len(done), "oom": sum(r["oom"] for r in rows),
               "failed": sum(bool(r.get("error")) and not r["oom"] for r in rows),
               "refused": sum(bool(r.get("infeasible")) for r in rows),
               "max_abs_step_time_error": max((abs(r["step_time_error"]) for r in done), default=None),
               "max_abs_memory_error": max((abs(r["memory_error"]) for r in done), default=None)}
    return common.write(name, {"gpu": gpu, "torch": torch.__version__, "plans": plans, "steps": steps,
                               "rows": rows, "summary": summary})


def _line(r: dict) -> str:
    if r.get("measured_with"):
        return f"{r['name']:<20} the same plan as {r['measured_with']}: measured once"
    if r.get("infeasible"):
        return f"{r['name']:<20} not run: {r['infeasible']}"
    p = r["predicted"]
    if r["measured"] is None:
        return (f"{r['name']:<20} {'OOM' if r['oom'] else 'FAILED'}: {r['error']} "
                f"(predicted {p['peak_memory_bytes'] / 2**30:.2f} GiB)")
    m = r["measured"]
    return (f"{r['name']:<20} step {p['step_time_s']:.3f} s predicted, {m['step_time_s']:.3f} s measured "
            f"({100 * r['step_time_error']:+.1f}%); peak {p['peak_memory_bytes'] / 2**30:.2f} GiB predicted, "
            f"{m['peak_allocated_bytes'] / 2**30:.2f} GiB allocated ({100 * r['memory_error']:+.1f}%)"
            + (f", {m['peak_reserved_bytes'] / 2**30:.2f} GiB reserved" if m.get("peak_reserved_bytes") else ""))


def reprice(result: dict) -> dict:
    """`result` (a gpu.json) with each measured row's case planned again at this commit, under "repriced":
    the new prediction beside the same measurement where the planner makes the same choices (mesh,
    micro-batching, recompute, offload, kernels), else which of them changed, and not priced. A row whose
    run joins the fit's data (benchmarks.published_data_gpu) is then in-sample; the others test the
    constants on runs they were not fitted to."""
    from benchmarks.gpu_plans import Case, plan_case
    from partita.costmodel.errors import InfeasibleError
    preset, now = result["gpu"]["preset"], common.commit()
    for r in result["rows"]:
        if not r.get("measured"):
            continue
        case = Case(r["name"], r["what"], r["model"], r["global_batch"], r.get("seq"), r["plan"]["fixed"])
        try:
            plan = json.loads(plan_case(case, preset).to_json())
        except InfeasibleError as e:
            r["repriced"] = {"commit": now, "same_plan": False, "changed": f"now refused: {e}"}
            continue
        summary, was = _plan_summary(plan), r["plan"]
        changed = [k for k in ("mesh", "micro_batch", "num_microbatches", "recompute", "offloaded_blocks", "kernels")
                   if summary[k] != was[k]]
        pred = plan["predicted"]
        r["repriced"] = {"commit": now, "same_plan": not changed, "changed": ", ".join(changed) or None}
        if not changed:
            r["repriced"].update(step_time_s=pred["step_time_s"], peak_memory_bytes=pred["peak_memory_bytes"],
                                 step_time_error=_error(pred["step_time_s"], r["measured"]["step_time_s"]),
                                 memory_error=_error(pred["peak_memory_bytes"], r["measured"]["peak_allocated_bytes"]))
    return result


def plan_only(presets) -> int:
    if not solver_available():
        print("benchmarks.gpu --plan-only: planning needs cvxpy and highspy (pip install -e .)", file=sys.stderr)
        return 2
    for preset in presets:
        planned = plan_set(preset)
        folder = write_plans(preset, planned)
        print(f"{preset}: {sum(p.plan is not None for p in planned)} plans in {folder.relative_to(ROOT)} "
              f"({', '.join(p.case.name for p in planned if p.plan is None) or 'none'} refused)")
    return 0


def reprice_results(path: Path | None = None) -> int:
    path = path or common.RESULTS / "gpu.json"
    if not solver_available():
        print("benchmarks.gpu --reprice: planning needs cvxpy and highspy (pip install -e .)", file=sys.stderr)
        return 2
    if not path.exists():
        print(f"benchmarks.gpu --reprice: no {path}: run `python -m benchmarks.gpu` on a GPU first", file=sys.stderr)
        return 2
    result = reprice(json.loads(path.read_text()))
    path.write_text(json.dumps(result, indent=2) + "\n")
    for r in result["rows"]:
        rp = r.get("repriced")
        if rp is None:
            continue
        if not rp["same_plan"]:
            print(f"{r['name']:<20} the planner now chooses differently ({rp['changed']}): not repriced")
            continue
        print(f"{r['name']:<20} step {rp['step_time_s']:.3f} s predicted now ({100 * rp['step_time_error']:+.1f}%, "
              f"was {100 * r['step_time_error']:+.1f}%); peak {rp['peak_memory_bytes'] / 2**30:.2f} GiB "
              f"({100 * rp['memory_error']:+.1f}%, was {100 * r['memory_error']:+.1f}%)")
    print(f"wrote {path}")
    return 0


def run_set(planned: list[Planned], args, earlier: dict | None, gpu: dict, plans: dict) -> Path:
    """Run the cases `args` selects (--only), writing gpu.json after each; with --budget-s, a case starts only
    while the time spent and the longest case so far fit in the budget, and the line to run the rest is printed."""
    rows, ran, left, order = [], [], [], [p.case.name for p in planned]
    start, longest = time.perf_counter(), 0.0
    path = common.RESULTS / "gpu.json"
    with tempfile.TemporaryDirectory(prefix="partita-gpu-") as tmp:
        for p in planned:
            if args.only and p.case.name not in args.only:
                continue
            twin = next((r for q, r in ran if same_run(q.plan, p.plan)), None)
            if not twin and args.budget_s and time.perf_counter() - start + longest > args.budget_s:
                left.append(p.case.name)
                continue
            t0 = time.perf_counter()
            rows.append(measured_as(twin, p) if twin else run_case(p, args.steps, Path(tmp), args.timeout))
            longest = max(longest, time.perf_counter() - t0)
            ran.append((p, rows[-1]))
            print(_line(rows[-1]), flush=True)
            # after every case: a check stopped part way (its machine's time is short) keeps what it measured
            path = write_results(with_earlier_rows(rows, earlier, gpu["preset"], order), gpu, plans, args.steps)
    if left:
        print(f"benchmarks.gpu: --budget-s {args.budget_s:g} left {len(left)} case(s) to run; they are run, beside "
              f"these results, by: python -m benchmarks.gpu {' '.join(f'--only {n}' for n in left)}", flush=True)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=STEPS, help=f"training steps per plan (default {STEPS})")
    ap.add_argument("--only", action="append", metavar="CASE", help="run only these cases (benchmarks.gpu_plans)")
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per run before it counts as failed")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no case once the time spent and the longest case so far exceed this; print the "
                         "command that runs the rest (a lent GPU's call is limited)")
    ap.add_argument("--plan-only", action="store_true", help="plan the set and ship it in benchmarks/gpu_plans/")
    ap.add_argument("--device", action="append", choices=PRESETS, help="with --plan-only: presets (default all)")
    ap.add_argument("--reprice", action="store_true",
                    help="no GPU needed: plan results/gpu.json's cases again at this commit and add the new "
                         "predictions beside its measurements")
    args = ap.parse_args(argv)
    if args.plan_only:
        return plan_only(args.device or PRESETS)
    if args.reprice:
        return reprice_results()
    import torch
    if not torch.cuda.is_available():
        print(f"benchmarks.gpu: no CUDA device here (torch {torch.__version__}): nothing measured; run it on a "
              "machine with a GPU")
        return 0
    from partita.costmodel.hardware import gpu_preset
    name, memory = local_gpu()
    preset = gpu_preset(name, memory)
    if preset is None:
        print(f"benchmarks.gpu: no device preset is a {name} ({memory / 2**30:.0f} GiB): nothing measured",
              file=sys.stderr)
        return 2
    planned, plans = plans_for(preset)
    if not planned:
        print(f"benchmarks.gpu: no solver here and no plans shipped for {preset}: run `python -m benchmarks.gpu "
              f"--plan-only --device {preset}` where cvxpy and highspy are installed", file=sys.stderr)
        return 2
    unknown = sorted(set(args.only or ()) - {p.case.name for p in planned})
    if unknown:
        print(f"benchmarks.gpu: no case {', '.join(unknown)}; the cases: {', '.join(p.case.name for p in planned)}",
              file=sys.stderr)
        return 2
    print(f"benchmarks.gpu: {name} ({preset}), {len(planned)} plans {plans['source']} "
          f"(commit {plans.get('commit') or '?'}), {args.steps} steps each", flush=True)
    previous = common.RESULTS / "gpu.json"
    earlier = json.loads(previous.read_text()) if (args.only or args.budget_s) and previous.exists() else None
    path = run_set(planned, args, earlier, {"name": name, "memory_bytes": memory, "preset": preset}, plans)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

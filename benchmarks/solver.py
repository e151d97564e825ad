"""The stage MILP as a solver: exactness, solve times on real programs, and HiGHS against CBC.

(a) exactness: many small random stage programs (1-4 stages, up to 8 layers, 1-3 options, 1F1B or
    interleaved, with a must-use option at random), each solved exactly (mip_rel_gap = 0) and by
    enumerating every assignment of layers to stages and options; reports the largest relative gap
    between the two optima (expected 0) and any disagreement on feasibility.
(b) solve times on large real programs: every candidate program (mesh, ZeRO stage, micro-batch size,
    schedule) of gpt3-175b on 1,024 A100-80GB (global batch 1536) and llama3-405b on 16,384 H100-80GB
    (global batch 2048), each solved as the search would but without the incumbent cutoff (so no
    candidate is pruned or cut short): median, p90, max of the per-candidate wall time (building
    the matrices included: planner.solve.stage_matrix), and how many hit the 3 s time limit.
(c) HiGHS against CBC on the same programs and settings (relative gap 0.5%, time limit 3 s; no cutoff):
    the relative difference of the objectives and the ratio of the wall times. CBC comes from cvxpy's
    CBC interface (the `cylp` package); without it the JSON says so and (c) is skipped. To keep the
    benchmark under ten minutes, (c) takes every `CBC_STRIDE`-th gpt3-175b candidate (in lower-bound
    order) and every llama3-405b one.

    python -m benchmarks.solver           # writes benchmarks/results/solver.json and solver.png
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time

import numpy as np

from benchmarks.common import pyplot, save_figure, try_plot, write
from partita.planner.solve.milp import StageProblem, evaluate, fits, solve_stages

INSTANCES = 500
CBC_STRIDE = 8
LARGE = [  # name, model, cluster, global batch
    ("gpt3-175b on 1024 A100-80GB", "gpt3-175b", "128x8xA100-80GB", 1536),
    ("llama3-405b on 16384 H100-80GB", "llama3-405b", "2048x8xH100-80GB", 2048),
]


# ------------------------------------------------------------------------------------ (a) exactness

def compositions(total: int, parts: int):
    """Every way to write `total` as an ordered sum of `parts` positive integers."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield [bounds[i + 1] - bounds[i] for i in range(parts)]


def brute_force(prob: StageProblem) -> float:
    """The best objective over every assignment that fits (inf if none does)."""
    n_opt = len(prob.option_time)
    best = float("inf")
    for sizes in compositions(prob.num_layers, prob.num_stages):
        if min(sizes) < prob.virtual_stages:
            continue
        splits = [[c for c in itertools.product(range(n + 1), repeat=n_opt) if sum(c) == n] for n in sizes]
        for choice in itertools.product(*splits):
            counts = np.array(choice)
            if fits(prob, counts):
                best = min(best, evaluate(prob, counts))
    return best


def random_problem(rng: np.random.Generator) -> StageProblem:
    p = int(rng.integers(1, 5))
    n_opt = int(rng.integers(1, 4))
    v = int(rng.integers(1, 3))
    L = int(rng.integers(p * v, max(p * v, 8) + 1))
    t = rng.uniform(0.5, 2.0, n_opt)
    w = rng.uniform(1.0, 4.0, n_opt)
    a = rng.uniform(0.1, 1.0, n_opt)
    m = int(rng.integers(p, 3 * p + 2))
    in_flight = np.array([min(p - s, m) for s in range(p)], dtype=float)
    if v > 1:
        in_flight *= 1 + (p - 1) / (p * m)
    extra_t = np.zeros(p)
    extra_t[0] += rng.uniform(0, 1)
    extra_t[-1] += rng.uniform(0, 1.5)
    extra_m = np.zeros(p)
    extra_m[0] += rng.uniform(0, 3)
    extra_m[-1] += rng.uniform(0, 3)
    extra_f = np.zeros(p)
    extra_f[-1] += rng.uniform(0, 0.3)
    cap = float(rng.uniform(0.6, 1.2) * (w.mean() + a.mean() * p) * L / p + 3)
    return StageProblem(num_stages=p, num_layers=L, num_microbatches=m, option_time=t, option_state=w,
                        option_act=a, option_flush=rng.uniform(0, 0.2, n_opt), extra_time=extra_t,
                        extra_mem=extra_m, extra_flush=extra_f, in_flight=in_flight, capacity=cap,
                        mip_rel_gap=0.0, virtual_stages=v,
                        must_use=np.array([False] * (n_opt - 1) + [bool(rng.integers(0, 2))]))


def exactness(instances: int = INSTANCES, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    gaps, mismatches, feasible, milp_times = [], 0, 0, []
    for _ in range(instances):
        prob = random_problem(rng)
        expected = brute_force(prob)
        sol = solve_stages(prob)
        milp_times.append(sol.wall_time_s)
        if expected == float("inf") or not sol.feasible:
            mismatches += (expected == float("inf")) != (not sol.feasible)
            continue
        feasible += 1
        if not fits(prob, sol.counts):
            mismatches += 1
        gaps.append((sol.objective - expected) / expected)
    return {"instances": instances, "seed": seed, "feasible": feasible, "infeasible": instances - feasible,
            "feasibility_mismatches": int(mismatches), "max_rel_gap": max(map(abs, gaps), default=0.0),
            "mean_milp_s": statistics.mean(milp_times), "mip_rel_gap_setting": 0.0,
            "passed": mismatches == 0 and max(map(abs, gaps), default=0.0) <= 1e-6}


# --------------------------------------------------------------------- (b) real programs, (c) CBC

def real_candidates(model: str, cluster: str, global_batch: int):
    from partita.costmodel.hardware import parse_cluster
    from partita.costmodel.models import resolve_model
    from partita.costmodel.capture import capture
    from partita.planner.search import SearchSpace, TrainConfig
    from partita.planner.enumerate.candidates import enumerate_candidates
    graph = capture(resolve_model(model), dtype="bf16")
    *_, cands = enumerate_candidates(graph, parse_cluster(cluster), TrainConfig(global_batch=global_batch),
                                     SearchSpace())
    cands.sort(key=lambda c: (c.lower_bound, c.pp, c.tp, c.zero, c.virtual_stages, -c.micro_batch))
    return cands


def _percentiles(xs: list[float]) -> dict:
    a = np.array(xs)
    return {"n": len(xs), "median_s": float(np.median(a)), "p90_s": float(np.percentile(a, 90)),
            "max_s": float(a.max()), "total_s": float(a.sum())}


def solve_times(name: str, cands) -> tuple[dict, list[dict]]:
    rows = []
    for c in cands:
        sol = solve_stages(c.problem)  # no cutoff: the full program
        rows.append({"key": list(c.key), "options": len(c.options), "status": sol.status,
                     "objective": sol.objective if sol.feasible else None, "seconds": sol.wall_time_s,
                     "mip_gap": sol.mip_gap})
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    return {"name": name, **_percentiles([r["seconds"] for r in rows]), "statuses": statuses}, rows


def cbc_available() -> bool:
    import cvxpy as cp
    return cp.CBC in cp.installed_solvers()


def against_cbc(name: str, cands, highs_rows: list[dict], stride: int) -> dict:
    import cvxpy as cp
    pairs = []
    for i in range(0, len(cands), stride):
        c, h = cands[i], highs_rows[i]
        sol = solve_stages(c.problem, solver=cp.CBC)
        pairs.append({"key": h["key"], "highs_status": h["status"], "cbc_status": sol.status,
                      "highs_s": h["seconds"], "cbc_s": sol.wall_time_s, "highs_objective": h["objective"],
                      "cbc_objective": sol.objective if sol.feasible else None})
    both = [p for p in pairs if p["highs_objective"] is not None and p["cbc_objective"] is not None]
    for p in both:
        p["rel_diff"] = (p["cbc_objective"] - p["highs_objective"]) / p["highs_objective"]
    diffs = [p["rel_diff"] for p in both]
    optimal = [p["rel_diff"] for p in both if p["highs_status"] == p["cbc_status"] == "optimal"]
    ratios = [p["cbc_s"] / p["highs_s"] for p in pairs]
    return {"name": name, "programs": len(pairs), "stride": stride, "both_feasible": len(both),
            "feasibility_disagreements": sum((p["highs_objective"] is None) != (p["cbc_objective"] is None)
                                             for p in pairs),
            "max_abs_rel_diff": max(map(abs, diffs), default=0.0),
            "both_optimal": len(optimal), "max_abs_rel_diff_both_optimal": max(map(abs, optimal), default=0.0),
            "median_abs_rel_diff": statistics.median(map(abs, diffs)) if diffs else 0.0,
            "cbc_better": sum(d < -1e-9 for d in diffs), "highs_better": sum(d > 1e-9 for d in diffs),
            "median_time_ratio_cbc_over_highs": statistics.median(ratios),
            "total_time_ratio_cbc_over_highs": sum(p["cbc_s"] for p in pairs) / sum(p["highs_s"] for p in pairs),
            "highs_time_limit_hits": sum(p["highs_status"] == "time_limit" for p in pairs),
            "cbc_time_limit_hits": sum(p["cbc_status"] == "time_limit" for p in pairs),
            "highs": _percentiles([p["highs_s"] for p in pairs]), "cbc": _percentiles([p["cbc_s"] for p in pairs]),
            "largest_differences": sorted(both, key=lambda p: -abs(p["rel_diff"]))[:5],
            "highs_s": [round(p["highs_s"], 5) for p in pairs], "cbc_s": [round(p["cbc_s"], 5) for p in pairs]}


def run(instances: int = INSTANCES, large=LARGE, stride: int = CBC_STRIDE, cbc: bool = True) -> dict:
    t0 = time.perf_counter()
    exact = exactness(instances)
    print(f"(a) {instances} random programs: max |MILP - brute force| / brute force = {exact['max_rel_gap']:.1e}, "
          f"{exact['feasibility_mismatches']} feasibility mismatches ({exact['feasible']} feasible) "
          f"[{time.perf_counter() - t0:.1f} s]", flush=True)
    times, cbc_rows = [], []
    use_cbc = cbc and cbc_available()
    for name, model, cluster, batch in large:
        t1 = time.perf_counter()
        cands = real_candidates(model, cluster, batch)
        summary, rows = solve_times(name, cands)
        slowest = sorted(rows, key=lambda r: -r["seconds"])[:5]
        times.append({**summary, "slowest": slowest, "seconds": [round(r["seconds"], 5) for r in rows]})
        print(f"(b) {name}: {summary['n']} programs, median {summary['median_s'] * 1e3:.0f} ms, p90 "
              f"{summary['p90_s'] * 1e3:.0f} ms, max {summary['max_s']:.2f} s, {summary['statuses']} "
              f"[{time.perf_counter() - t1:.1f} s]", flush=True)
        if use_cbc:
            t1 = time.perf_counter()
            cmp = against_cbc(name, cands, rows, stride if model == "gpt3-175b" else 1)
            cbc_rows.append(cmp)
            print(f"(c) {name}: {cmp['programs']} programs, max |CBC - HiGHS| / HiGHS objective "
                  f"{cmp['max_abs_rel_diff']:.1e} (median {cmp['median_abs_rel_diff']:.1e}; "
                  f"{cmp['max_abs_rel_diff_both_optimal']:.1e} where both proved their gap), CBC/HiGHS time: median "
                  f"{cmp['median_time_ratio_cbc_over_highs']:.2f}, total {cmp['total_time_ratio_cbc_over_highs']:.2f} "
                  f"[{time.perf_counter() - t1:.1f} s]", flush=True)
    out = {"exactness": exact, "solve_times": times,
           "settings": {"mip_rel_gap": StageProblem.mip_rel_gap, "time_limit_s": StageProblem.time_limit_s,
                        "cutoff": None}}
    if use_cbc:
        import cylp
        out["cbc"] = {"available": True, "interface": f"cvxpy CBC via cylp {getattr(cylp, '__version__', '?')}",
                      "note": "same time limit (CBC maximumSeconds) and relative gap (allowableFractionGap); "
                              "CBC overruns its time limit by up to a few seconds, which its wall times include. "
                              "rel_diff = (CBC - HiGHS) / HiGHS objective: positive where HiGHS found the faster "
                              "plan. Differences beyond the 0.5% gap come from programs where a solver stopped at "
                              "the time limit with its incumbent; max_abs_rel_diff_both_optimal counts only "
                              "programs both solved to the gap",
                      "comparisons": cbc_rows}
    else:
        out["cbc"] = {"available": False,
                      "note": "CBC is not among cvxpy's installed solvers (pip install cylp provides it): (c) skipped"}
    out["benchmark_wall_s"] = time.perf_counter() - t0
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.solver", description=__doc__.split("\n")[0])
    ap.add_argument("--instances", type=int, default=INSTANCES)
    ap.add_argument("--no-cbc", action="store_true", help="skip (c)")
    args = ap.parse_args(argv)
    payload = run(args.instances, cbc=not args.no_cbc)
    path = write("solver", payload)
    print(f"wrote {path}")
    try_plot(_plot, payload)
    return 0


def _plot(payload: dict) -> None:
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for t in payload["solve_times"]:
        xs = np.sort(t["seconds"])
        ax1.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", label=f"{t['name']} ({len(xs)})")
    ax1.set_xscale("log")
    ax1.set_xlabel("wall time per candidate program, s (HiGHS, gap 0.5%, limit 3 s, no cutoff)")
    ax1.set_ylabel("fraction of candidates")
    ax1.set_title("stage-program solve times")
    ax1.legend(fontsize=8)
    if payload["cbc"]["available"]:
        lo, hi = 1e-3, 30
        for cmp in payload["cbc"]["comparisons"]:
            ax2.scatter(cmp["highs_s"], cmp["cbc_s"], s=10, label=cmp["name"])
            lo = min([lo] + cmp["highs_s"] + cmp["cbc_s"])
        ax2.plot([lo, hi], [lo, hi], color="grey", lw=0.8)
        ax2.set_xscale("log")
        ax2.set_yscale("log")
        ax2.set_xlabel("HiGHS, s")
        ax2.set_ylabel("CBC, s")
        ax2.set_title("same programs: CBC against HiGHS")
        ax2.legend(fontsize=8)
    else:
        ax2.text(0.5, 0.5, "CBC not installed", ha="center", va="center")
        ax2.set_axis_off()
    save_figure(fig, "solver")


if __name__ == "__main__":
    sys.exit(main())

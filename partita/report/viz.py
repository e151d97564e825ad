"""Pictures of a search and its plan, for notebooks: candidates, pipeline schedule, memory, baselines.

Data first (plain functions, tested in tests/notebooks/test_viz.py), plots after. matplotlib is imported
only when something is drawn, so `import partita.report.viz` needs nothing beyond the planner itself.

    result, plan = planner.plan_search("gpt3-175b", cluster="8x8xA100-80GB", train=...)
    points = candidate_points(result)               # (step time, peak memory) of every solved mesh
    plot_candidates(points, chosen=plan)            # scatter, Pareto front marked
    plot_timeline(plan_timeline(plan, result))      # the plan's pipeline schedule as a Gantt chart
    plot_memory(plan)                               # memory per pipeline rank by category vs capacity
    replan(result, plan, cluster="16x8xA100-80GB")  # the same captured model on another cluster

The schedule simulator replays each pipeline rank's order of forward (F) and backward (B) passes under
their data dependencies: F of micro-batch i on virtual stage k needs F of i on stage k - 1; B of i on k
needs B of i on k + 1 (and, on the last stage, F of i). A pass starts when its rank is free and its
input has arrived (point-to-point time is already inside the planner's per-stage time). Each schedule's
order is its record's (planner.plan.schedules):

    GPipe       all forwards, then all backwards
    1F1B        rank r runs min(p - r - 1, m) forwards, then alternates one forward and one backward,
                then drains the remaining backwards (Narayanan et al. SC'21, PipeDream-Flush)
    Interleaved rank r holds v chunks (virtual stages r, r + p, ...); micro-batches go through the chunks
                in groups of p, with (p - r - 1) * 2 + (v - 1) * p warm-up forwards (Megatron-LM's
                order, also torch.distributed.pipelining's Interleaved1F1B); needs m divisible by p

With p stages, m micro-batches and equal passes f and b, 1F1B and GPipe take (m + p - 1)(f + b) and
interleaving takes m (f + b) + (p - 1)(f + b) / v: the planner's objective (planner.solve.milp) for equal stages.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Sequence

import numpy as np

from partita.costmodel.hardware import Cluster, GiB, parse_cluster
from partita.planner.estimate.build import build_plan, predicted
from partita.planner.solve.bounds import stage_bound
from partita.planner.solve.milp import solve_stages
from partita.planner.solve.milp_blocks import solve_blocks, stage_p2p
from partita.planner.plan import Plan
from partita.planner.plan.schedules import SCHEDULES
from partita.planner.enumerate.candidates import Candidate, plan_key
from partita.planner.search import SearchResult, TrainConfig, search

CATEGORY_COLORS = {"model_states": "#4C72B0", "activations": "#DD8452", "workspace": "#8C8C8C"}
PASS_COLORS = {"F": "#4C72B0", "B": "#DD8452", "flush": "#B0B0B0"}


# ---- candidates --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Point:
    """One solved candidate: its step time and the peak memory of its fullest device."""

    candidate: Candidate
    step_time_s: float
    peak_memory_bytes: float
    tflops_per_device: float
    searched: bool
    """True if the search itself solved it; False if solved here, for the picture, after the search pruned it."""

    @property
    def label(self) -> str:
        c = self.candidate
        sched = f"{c.schedule} v={c.virtual_stages}" if c.virtual_stages > 1 else c.schedule
        return f"pp={c.pp} dp={c.dp} tp={c.tp} ZeRO-{c.zero} b={c.micro_batch} {sched}"


def candidate_points(result: SearchResult, *, solve_pruned: bool = True, time_limit_s: float = 0.2,
                     mip_rel_gap: float = 0.02, tries: int = 3) -> list[Point]:
    """Every feasible solved candidate, plus (solve_pruned) one per mesh and schedule the search never solved.

    The search prunes most candidates by a lower bound, which is right for finding the optimum but leaves a
    sparse picture. For each (pp, dp, tp, ZeRO, schedule) without a feasible solution this solves up to
    `tries` of its candidates, lowest bound first, with a short time limit and a looser gap (a picture
    needs less precision than a plan). The plan is unchanged; the search's candidates are not modified
    (the ones solved here are copies).
    """
    groups: dict[tuple, list[Candidate]] = {}
    for c in result.every_candidate():
        groups.setdefault((c.pp, c.dp, c.tp, c.zero, c.schedule, c.virtual_stages), []).append(c)
    points = []
    for cands in groups.values():
        done = [c for c in cands if c.solution is not None and c.solution.feasible]
        points += [_point(result, c, searched=True) for c in done]
        if done or not solve_pruned:
            continue
        for c in [c for c in sorted(cands, key=lambda c: c.lower_bound) if _may_fit(c)][:tries]:
            solved = _solve_copy(c, time_limit_s, mip_rel_gap)
            if solved is not None:
                points.append(_point(result, solved, searched=False))
                break
    points.sort(key=lambda p: (p.step_time_s, p.peak_memory_bytes))
    return points


def _may_fit(c: Candidate) -> bool:
    """False where the stage bound (planner.solve.bounds) already proves the program infeasible: no solve."""
    return c.formulation != "counts" or stage_bound(c.problem) < float("inf")


def _solve_copy(c: Candidate, time_limit_s: float, mip_rel_gap: float) -> Candidate | None:
    """A solved copy of `c` (either stage program, as the search would solve it), or None if infeasible."""
    problem = replace(c.problem, time_limit_s=time_limit_s, mip_rel_gap=mip_rel_gap)
    if c.formulation == "blocks":
        sol = solve_blocks(problem)
        parts = {**c.parts, "e_p2p": stage_p2p(problem, sol.counts)} if sol.feasible else c.parts
    else:
        sol, parts = solve_stages(problem), c.parts
    return replace(c, solution=sol, parts=parts, pruned=False) if sol.feasible else None


def _point(result: SearchResult, c: Candidate, searched: bool) -> Point:
    pred = predicted(result, c)
    return Point(candidate=c, step_time_s=pred["step_time_s"], peak_memory_bytes=pred["peak_memory_bytes"],
                 tflops_per_device=pred["tflops_per_device"], searched=searched)


def pareto_front(memory: Sequence[float], time: Sequence[float]) -> list[int]:
    """Indices of the points with the lowest time for their memory: no other point has at most their memory
    and less time. Ordered by memory (ties: the faster point only)."""
    order = sorted(range(len(memory)), key=lambda i: (memory[i], time[i]))
    front, best = [], float("inf")
    for i in order:
        if time[i] < best:
            front.append(i)
            best = time[i]
    return front


# ---- pipeline schedule -------------------------------------------------------------------------

@dataclass(frozen=True)
class Pass:
    rank: int
    kind: str          # "F" or "B"
    microbatch: int
    chunk: int         # model chunk on this rank (virtual stage chunk * p + rank)
    start: float
    end: float


@dataclass
class Timeline:
    schedule: str
    num_stages: int
    num_microbatches: int
    virtual_stages: int
    passes: list[Pass]
    flush_s: np.ndarray | None = None
    """Seconds each rank spends after the pipeline drains (gradient all-reduce, optimizer step)."""
    predicted_step_s: float | None = None
    """The planner's step time for the same candidate, for comparison."""

    @property
    def pipeline_s(self) -> float:
        return max((p.end for p in self.passes), default=0.0)

    @property
    def step_s(self) -> float:
        flush = 0.0 if self.flush_s is None else float(np.max(self.flush_s, initial=0.0))
        return self.pipeline_s + flush

    def busy(self) -> np.ndarray:
        """Seconds of work per rank during the pipeline (the rest of pipeline_s is its bubble)."""
        out = np.zeros(self.num_stages)
        for p in self.passes:
            out[p.rank] += p.end - p.start
        return out


def schedule_order(schedule: str, num_stages: int, num_microbatches: int, rank: int,
                   virtual_stages: int = 1) -> list[tuple[str, int, int]]:
    """The (kind, micro-batch, chunk) passes pipeline rank `rank` runs, in order: the schedule's own
    (planner.plan.schedules, `order`)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; accepted: {', '.join(SCHEDULES)}")
    return SCHEDULES[schedule].order(num_stages, num_microbatches, rank, virtual_stages)


def simulate_pipeline(schedule: str, num_microbatches: int, fwd: Sequence[float], bwd: Sequence[float],
                      virtual_stages: int = 1) -> Timeline:
    """Replay the schedule with per-rank forward and backward seconds per micro-batch (all chunks of the
    rank together; each chunk takes 1/v of it). Returns every pass with its start and end."""
    fwd, bwd = np.asarray(fwd, dtype=float), np.asarray(bwd, dtype=float)
    p, m, v = len(fwd), num_microbatches, virtual_stages
    if len(bwd) != p or p < 1 or m < 1 or v < 1:
        raise ValueError("need one forward and one backward time per stage, m >= 1 and v >= 1")
    orders = [schedule_order(schedule, p, m, r, v) for r in range(p)]
    last = p * v - 1
    done: dict[tuple[str, int, int], float] = {}   # (kind, micro-batch, virtual stage) -> end time

    def ready(kind: str, i: int, stage: int) -> float | None:
        if kind == "F":
            dep = ("F", i, stage - 1) if stage > 0 else None
        else:
            dep = ("F", i, last) if stage == last else ("B", i, stage + 1)
        return 0.0 if dep is None else done.get(dep)

    nxt, free, passes = [0] * p, [0.0] * p, []
    while any(nxt[r] < len(orders[r]) for r in range(p)):
        progressed = False
        for r in range(p):
            while nxt[r] < len(orders[r]):
                kind, i, chunk = orders[r][nxt[r]]
                stage = chunk * p + r
                t = ready(kind, i, stage)
                if t is None:
                    break
                start = max(free[r], t)
                end = start + (fwd[r] if kind == "F" else bwd[r]) / v
                done[(kind, i, stage)] = end
                passes.append(Pass(rank=r, kind=kind, microbatch=i, chunk=chunk, start=start, end=end))
                free[r], nxt[r], progressed = end, nxt[r] + 1, True
        if not progressed:  # pragma: no cover - the orders above never deadlock
            raise RuntimeError(f"{schedule} order deadlocks")
    return Timeline(schedule=schedule, num_stages=p, num_microbatches=m, virtual_stages=v, passes=passes)


def stage_times(c: Candidate) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds per micro-batch of each pipeline rank of a solved candidate.

    The planner's per-rank time (solution.stage_time: compute, tensor-parallel and exposed ZeRO
    communication, point-to-point) is split in the ratio of the rank's layers' forward compute to their
    whole compute (backward and any recompute re-run go to the backward pass); ranks without layers
    take 1/3 (the backward is about twice the forward)."""
    if c.solution is None or not c.solution.feasible:
        raise ValueError("candidate has no feasible solution")
    tau = np.asarray(c.solution.stage_time, dtype=float)
    share = np.full(c.pp, 1 / 3)
    stage_options = c.parts.get("stage_options") or [c.options] * c.pp  # per stage on heterogeneous clusters
    for s, opts in enumerate(stage_options):
        if opts:
            counts = c.solution.counts[s]
            fwd = counts @ np.array([o.base.fwd_s * c.micro_batch for o in opts])
            whole = counts @ np.array([o.compute for o in opts])
            share[s] = fwd / whole if whole > 0 else share[s]
    f = tau * share
    return f, tau - f


def candidate_timeline(c: Candidate) -> Timeline:
    """The simulated schedule of a solved candidate, with its flush and the planner's step time."""
    f, b = stage_times(c)
    tl = simulate_pipeline(c.schedule, c.num_microbatches, f, b, c.virtual_stages)
    tl.flush_s = np.asarray(c.solution.stage_flush, dtype=float)
    tl.predicted_step_s = c.step_time
    return tl


def find_candidate(plan: Plan, result: SearchResult) -> Candidate:
    """The solved candidate of `result` the plan was built from."""
    key = plan_key(plan)
    for c in ([result.best] if result.best is not None else []) + result.candidates:
        if c.key == key and c.solution is not None and c.solution.feasible:
            return c
    raise ValueError(f"no solved candidate {key} in this search: was the plan made by it?")


def plan_timeline(plan: Plan, result: SearchResult) -> Timeline:
    """The plan's schedule (stages, micro-batches, chunks) with the per-stage times the planner predicted."""
    return candidate_timeline(find_candidate(plan, result))


# ---- what-if -----------------------------------------------------------------------------------

def replan(result: SearchResult, plan: Plan, *, cluster: str | Cluster | None = None,
           train: TrainConfig | None = None) -> tuple[SearchResult, Plan]:
    """The same captured model searched again for another cluster or global batch, without capturing it
    again (capture is most of a plan's time for large models). Returns what planner.plan_search would
    (without baselines). The sequence length and dtype are the capture's, so they cannot change here."""
    cl = result.cluster if cluster is None else parse_cluster(cluster) if isinstance(cluster, str) else cluster
    train = train or result.train
    if train.seq_len not in (None, result.graph.seq_len) or train.dtype != result.train.dtype:
        raise ValueError(f"replan reuses the graph captured at seq {result.graph.seq_len} in {result.train.dtype}; "
                         "for another sequence length or dtype call planner.plan_search")
    new = search(result.graph, cl, train)
    return new, build_plan(new, plan.model["name"], plan.model.get("fingerprint", ""), plan.model.get("config", {}))


# ---- tables ------------------------------------------------------------------------------------

def plan_summary(plan: Plan) -> dict:
    """One row about a plan: devices, mesh, schedule, predicted step, TFLOP/s, MFU, peak memory."""
    s, pred = plan.schedule, plan.predicted
    sched = s.name + (f" v={s.virtual_stages}" if s.virtual_stages > 1 else "")
    return {"devices": plan.mesh.world_size, "global_batch": plan.train["global_batch"],
            "mesh": f"{plan.mesh.pp}x{plan.mesh.dp}x{plan.mesh.tp}", "zero": plan.zero_stage,
            "schedule": sched, "microbatches": f"{s.num_microbatches}x{s.micro_batch_size}",
            "step_s": pred["step_time_s"], "tflops": pred["tflops_per_device"], "mfu": pred["mfu"],
            "peak_gib": pred["peak_memory_bytes"] / GiB}


def format_table(rows: Iterable[dict]) -> str:
    """Rows of equal keys as an aligned text table (floats to 4 significant digits)."""
    rows = list(rows)
    if not rows:
        return ""
    cols = list(rows[0])
    cell = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)
    width = {k: max(len(k), *(len(cell(r[k])) for r in rows)) for k in cols}
    lines = ["  ".join(k.rjust(width[k]) for k in cols)]
    lines += ["  ".join(cell(r[k]).rjust(width[k]) for k in cols) for r in rows]
    return "\n".join(lines)


# ---- plots (matplotlib imported lazily) --------------------------------------------------------

def _axes(ax, figsize=(7, 4)):
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=figsize)
    return ax


def plot_candidates(points: Sequence[Point], *, chosen: Plan | None = None, capacity: float | None = None,
                    ax=None, title: str | None = None, max_ratio: float = 2.0):
    """Step time against peak memory per device, coloured by pipeline depth; the Pareto front as a line,
    candidates solved only for the picture hollow, the chosen plan a star. Points slower than `max_ratio`
    times the fastest are left above the axes (their count is noted)."""
    import matplotlib.pyplot as plt
    ax = _axes(ax)
    mem = np.array([p.peak_memory_bytes / GiB for p in points])
    time = np.array([p.step_time_s for p in points])
    pps = sorted({p.candidate.pp for p in points})
    cmap = plt.get_cmap("viridis", max(len(pps), 2))
    for k, pp in enumerate(pps):
        for searched in (True, False):
            idx = [i for i, p in enumerate(points) if p.candidate.pp == pp and p.searched == searched]
            if idx:
                color = cmap(k)
                ax.scatter(mem[idx], time[idx], s=28, label=f"pp={pp}" if searched or not any(
                    p.candidate.pp == pp and p.searched for p in points) else None,
                    facecolors=color if searched else "none", edgecolors=color)
    front = pareto_front(mem, time)
    ax.step(mem[front], time[front], where="post", color="crimson", lw=1.2, label="Pareto front")
    ax.scatter(mem[front], time[front], s=60, facecolors="none", edgecolors="crimson")
    if chosen is not None:
        ax.scatter([chosen.predicted["peak_memory_bytes"] / GiB], [chosen.predicted["step_time_s"]], marker="*",
                   s=250, color="gold", edgecolors="black", zorder=5, label="chosen plan")
        capacity = capacity or chosen.predicted.get("memory_capacity_bytes")
    if capacity:
        ax.axvline(capacity / GiB, color="gray", ls="--", lw=1, label="usable memory")
    if len(time) and time.max() > max_ratio * time.min():  # keep the interesting part legible
        hidden = int((time > max_ratio * time.min()).sum())
        ax.set_ylim(top=max_ratio * time.min())
        ax.text(0.01, 0.98, f"{hidden} slower point(s) above {max_ratio:g}x the fastest not shown",
                transform=ax.transAxes, fontsize=8, va="top")
    ax.set_xlabel("predicted peak memory per device (GiB)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title(title or "solved candidates")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0),
              title="filled: solved by the search\nhollow: solved for this plot", title_fontsize=7)
    return ax


def plot_timeline(tl: Timeline, *, ax=None, title: str | None = None, label_microbatches: bool | None = None):
    """Gantt chart: pipeline ranks down, time across; forward blue, backward orange, chunks shaded,
    the flush (gradient all-reduce and optimizer step) grey."""
    from matplotlib.patches import Patch
    ax = _axes(ax, figsize=(10, max(2.2, 1.2 + 0.45 * tl.num_stages)))
    v = tl.virtual_stages
    alpha = lambda chunk: 1.0 - 0.5 * chunk / max(v - 1, 1)
    groups: dict[tuple, list] = {}
    for p in tl.passes:
        groups.setdefault((p.rank, p.kind, p.chunk), []).append((p.start, p.end - p.start))
    edge = {"edgecolor": "white", "linewidth": 0.5} if len(tl.passes) <= 40 * tl.num_stages else {}
    for (rank, kind, chunk), spans in groups.items():
        ax.broken_barh(spans, (rank - 0.4, 0.8), facecolors=PASS_COLORS[kind], alpha=alpha(chunk), **edge)
    if label_microbatches is None:
        label_microbatches = tl.num_microbatches * v <= 24
    if label_microbatches:
        for p in tl.passes:
            ax.text((p.start + p.end) / 2, p.rank, str(p.microbatch), ha="center", va="center", fontsize=7)
    if tl.flush_s is not None:
        start = tl.pipeline_s
        for r, f in enumerate(tl.flush_s):
            ax.broken_barh([(start, float(f))], (r - 0.4, 0.8), facecolors=PASS_COLORS["flush"], hatch="//")
    ax.set_yticks(range(tl.num_stages), [f"pp rank {r}" for r in range(tl.num_stages)])
    ax.invert_yaxis()
    ax.set_xlabel("seconds into the step")
    chunks = f", {v} chunks per rank" if v > 1 else ""
    ax.set_title(title or f"{tl.schedule}: {tl.num_stages} stages, {tl.num_microbatches} micro-batches{chunks}; "
                          f"simulated step {tl.step_s:.3g} s")
    handles = [Patch(color=PASS_COLORS["F"], label="forward"), Patch(color=PASS_COLORS["B"], label="backward")]
    if v > 1:
        handles.append(Patch(color=PASS_COLORS["F"], alpha=alpha(v - 1), label="lighter: later chunk"))
    if tl.flush_s is not None:
        handles.append(Patch(facecolor=PASS_COLORS["flush"], hatch="//", label="grad sync + optimizer"))
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax


def _memory_of(x) -> tuple[list[dict], list[float | None]]:
    """Memory rows per pipeline rank and each rank's usable capacity (per stage on heterogeneous clusters)."""
    pred = x.predicted if isinstance(x, Plan) else x
    rows = pred["memory_per_stage"]
    caps = pred.get("memory_capacity_per_stage") or [pred.get("memory_capacity_bytes")] * len(rows)
    return rows, caps


def plot_memory(plans, *, ax=None, title: str | None = None):
    """Memory per device of each pipeline rank, stacked by category, against the usable capacity.

    `plans` is a Plan, a predicted dict (planner.estimate.build.predicted), or {label: either} to set side by side."""
    ax = _axes(ax)
    items = plans.items() if isinstance(plans, dict) and "memory_per_stage" not in plans else [("", plans)]
    ticks, labels, x = [], [], 0
    seen: set[str] = set()
    for name, item in items:
        rows, caps = _memory_of(item)
        for r, (row, cap) in enumerate(zip(rows, caps)):
            if cap:
                ax.hlines(cap / GiB, x - 0.45, x + 0.45, color="crimson", ls="--", lw=1.2,
                          label="usable memory" if "capacity" not in seen else None)
                seen.add("capacity")
            bottom = 0.0
            for cat, value in row.items():
                if cat in ("total", "phase"):
                    continue
                ax.bar(x, value / GiB, bottom=bottom, color=CATEGORY_COLORS.get(cat),
                       label=cat.replace("_", " ") if cat not in seen else None)
                seen.add(cat)
                bottom += value / GiB
            ticks.append(x)
            labels.append(f"{name}\nrank {r}" if name else f"pp rank {r}")
            x += 1
        x += 0.5
    ax.set_xticks(ticks, labels, fontsize=8)
    ax.set_ylabel("predicted memory per device (GiB)")
    ax.set_title(title or "memory per device, by category")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax


def plot_baselines(plan: Plan, *, metric: str = "step_time_s", ax=None, title: str | None = None):
    """The plan beside its baselines (planner.plan(..., baselines=True)) on one predicted metric."""
    ax = _axes(ax)
    if not plan.baselines:
        raise ValueError("the plan has no baselines: plan with baselines=True (CLI: --baselines)")
    names = ["partita"] + [b["name"] for b in plan.baselines]
    values = [plan.predicted[metric]] + [(b["predicted"] or {}).get(metric, 0.0) for b in plan.baselines]
    colors = ["#55A868"] + ["#8C8C8C"] * len(plan.baselines)
    bars = ax.bar(range(len(names)), values, color=colors)
    for bar, b in zip(bars[1:], plan.baselines):
        if not b["fits"]:
            why = b.get("why") or "does not fit"
            ax.text(bar.get_x() + bar.get_width() / 2, 0, f" {why}"[:40], rotation=90, ha="center",
                    va="bottom", fontsize=8)
    for bar, val in zip(bars, values):
        if val:
            ax.text(bar.get_x() + bar.get_width() / 2, val, f"{val:.3g}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel({"step_time_s": "predicted step time (s)", "tflops_per_device": "predicted TFLOP/s per device",
                   "mfu": "predicted MFU"}.get(metric, metric))
    ax.set_title(title or "plan vs baselines (same cost model and solver)")
    return ax


def plot_scaling(plans: Sequence[Plan], *, ax=None, title: str | None = None):
    """Predicted TFLOP/s per device against the number of devices, each point labelled with its mesh."""
    ax = _axes(ax)
    rows = [plan_summary(p) for p in plans]
    x = [r["devices"] for r in rows]
    y = [r["tflops"] for r in rows]
    ax.plot(x, y, "o-", color="#4C72B0")
    for xi, yi, r in zip(x, y, rows):
        ax.annotate(f"{r['mesh']} Z{r['zero']}\n{r['schedule']}", (xi, yi), textcoords="offset points",
                    xytext=(0, 8), ha="center", fontsize=7)
    ax.set_xscale("log", base=2)
    ax.set_xticks(x, [str(n) for n in x])
    ax.minorticks_off()
    ax.margins(x=0.15)
    ax.set_xlabel("devices")
    ax.set_ylabel("predicted TFLOP/s per device (model FLOPs)")
    ax.set_ylim(0, max(y) * 1.3 if y else 1)
    ax.set_title(title or "how the plan changes with the cluster (mesh pp x dp x tp, ZeRO stage)")
    return ax

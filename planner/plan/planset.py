"""A plan set: one plan per cluster size, computed ahead for an elastic job (`partita plan --nnodes MIN:MAX --out DIR`).

On disk it is a directory:

    nodes-N.json    an ordinary plan file (partita.plan/1) for N nodes, for each size from MIN to MAX a plan fits
    plan-set.json   the summary an operator reads before the job starts (SCHEMA): each size's mesh, predicted step
                    and throughput relative to the full size, why a size has no plan, and with --mtbf the
                    checkpoint interval and the expected time lost to failures (planner.estimate.resilience)

Whatever reads a set to run it reads only the plan files, each through Plan.load's validation (`load`): the summary
is for people and scripts, and nothing in it is needed, or trusted, to run. A set is one model on one kind of node:
`load` refuses files of different models or node shapes.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from partita.planner.plan import Plan, one_line
from partita.planner.plan.errors import PlanError

SCHEMA = "partita.planset/1"
SUMMARY = "plan-set.json"
FILE = "nodes-{}.json"
_FILE_RE = re.compile(r"^nodes-([1-9][0-9]{0,5})\.json$")


@dataclass
class Size:
    """One size of the set: its plan, or why none fits."""

    nodes: int
    plan: Plan | None
    why: str = ""
    resilience: object = None
    """planner.estimate.resilience.Resilience, with --mtbf."""


@dataclass
class PlanSet:
    sizes: list[Size]
    """Smallest first; the last is the full cluster."""

    @property
    def full(self) -> Size:
        return self.sizes[-1]

    def runs(self, size: Size) -> Size | None:
        """The size whose plan runs when `size.nodes` nodes are up: the fastest plan of at most that many nodes --
        its own, or a smaller size's, the nodes beyond it waiting as spares. A global batch that no mesh of N nodes
        divides well makes losing one node cost more than its share (Llama 3's batch on 2,047 of 2,048 nodes:
        benchmarks.resilience), and then fewer nodes can be faster."""
        fitting = [s for s in self.sizes if s.plan is not None and s.nodes <= size.nodes]
        return min(fitting, key=lambda s: (s.plan.predicted["step_time_s"], -s.nodes)) if fitting else None

    def relative(self, size: Size) -> float | None:
        """Throughput of `size` over the full size's (the same global batch: step time ratio)."""
        used, full = self.runs(size), self.runs(self.full)
        if used is None or full is None:
            return None
        return full.plan.predicted["step_time_s"] / used.plan.predicted["step_time_s"]

    def rows(self) -> list[dict]:
        out = []
        for s in self.sizes:
            used = self.runs(s)
            row: dict = {"nodes": s.nodes, "file": FILE.format(s.nodes) if s.plan else None,
                         "runs": used and used.nodes, "relative_throughput": self.relative(s)}
            if s.plan is None:
                row["why"] = s.why
            else:
                m, sch, pred = s.plan.mesh, s.plan.schedule, s.plan.predicted
                row.update(devices=m.world_size, mesh={"pp": m.pp, "dp": m.dp, "tp": m.tp, "cp": m.cp},
                           zero_stage=s.plan.zero_stage, micro_batches=sch.num_microbatches,
                           micro_batch_size=sch.micro_batch_size, step_time_s=pred["step_time_s"],
                           tokens_per_s=pred.get("tokens_per_s"))
            if s.resilience is not None:
                row["resilience"] = s.resilience.to_dict()
            out.append(row)
        return out

    def summary(self) -> dict:
        p = self.full.plan
        return {"schema": SCHEMA, "model": {k: p.model.get(k) for k in ("name", "fingerprint")},
                "cluster": p.cluster.get("spec"), "global_batch": p.train.get("global_batch"),
                "nnodes": [self.sizes[0].nodes, self.full.nodes], "sizes": self.rows()}

    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        if d.exists() and not d.is_dir():
            raise PlanError(f"--out {str(d)!r} names a file; a plan set is written to a directory")
        d.mkdir(parents=True, exist_ok=True)
        stale = [f for f in d.iterdir() if _FILE_RE.match(f.name)]
        for f in stale:  # a set written before for other sizes must not mix into this one
            f.unlink()
        for s in self.sizes:
            if s.plan is not None:
                s.plan.save(d / FILE.format(s.nodes))
        (d / SUMMARY).write_text(json.dumps(self.summary(), indent=2) + "\n")

    def table(self) -> str:
        """The summary as text: one line per size."""
        lines = [f"{'nodes':>5}  {'devices':>7}  {'pp x dp x tp':<14} {'micro-batches':<14} {'step':>10}  "
                 f"{'throughput':>10}"]
        for s in self.sizes:
            used = self.runs(s)
            if used is not None and used is not s:
                own = f"no plan of its own: {one_line(s.why, 120)}" if s.plan is None else \
                    f"its own plan is slower ({s.plan.predicted['step_time_s']:.4g} s)"
                lines.append(f"{s.nodes:>5}  runs the {used.nodes}-node plan, {s.nodes - used.nodes} idle: "
                             f"{self.relative(s):.2f}x; {own}")
                continue
            if s.plan is None:
                lines.append(f"{s.nodes:>5}  no plan fits: {one_line(s.why, 140)}")
                continue
            m, sch = s.plan.mesh, s.plan.schedule
            lines.append(f"{s.nodes:>5}  {m.world_size:>7}  {f'{m.pp} x {m.dp} x {m.tp}':<14} "
                         f"{f'{sch.num_microbatches} x {sch.micro_batch_size}':<14} "
                         f"{s.plan.predicted['step_time_s']:>9.4g}s  {self.relative(s):>9.2f}x")
        with_mtbf = [s for s in self.sizes if s.resilience is not None]
        if with_mtbf:
            lines.append("")
            lines += [f"{s.nodes:>5} node{'s' * (s.nodes != 1)}: {s.resilience.line()}" for s in with_mtbf]
            lines += [f"assumed: {a}" for a in with_mtbf[-1].resilience.assumptions]
        return "\n".join(lines)


def is_plan_set(path: str | Path) -> bool:
    return Path(path).is_dir()


def from_directory(directory: str | Path) -> PlanSet:
    """The set in `directory` as `partita plan --nnodes` made it, from its plan files alone (`load`); the sizes no
    plan fitted are not in it."""
    from partita.planner.plan.resilience import Resilience
    plans = load(directory)
    sizes = [Size(n, p) for n, p in sorted(plans.items())]
    for s in sizes:
        r = s.plan.predicted.get("resilience")
        s.resilience = Resilience.from_dict(r) if isinstance(r, dict) else None
    return PlanSet(sizes)


def load(directory: str | Path) -> dict[int, Plan]:
    """The plans of the set in `directory`, by node count, each validated by Plan.load; PlanError when the
    directory holds none, or plans of different models or node shapes."""
    d = Path(directory)
    try:
        names = sorted(f.name for f in d.iterdir())
    except OSError as e:
        raise PlanError(f"cannot read plan set {str(d)!r}: {e.strerror}") from None
    plans = {int(m.group(1)): Plan.load(d / m.group(0)) for m in map(_FILE_RE.match, names) if m}
    if not plans:
        raise PlanError(f"{str(d)!r} holds no plan file nodes-N.json: give the directory `partita plan --nnodes "
                        "MIN:MAX --out DIR` wrote, or one plan file")
    first = plans[min(plans)]
    for n, p in plans.items():
        if p.model.get("fingerprint") != first.model.get("fingerprint"):
            raise PlanError(f"plan set {str(d)!r}: {FILE.format(n)} is a plan of model {p.model.get('name')!r}, "
                            f"{FILE.format(min(plans))} of {first.model.get('name')!r}: a set holds one model's plans")
        if p.cluster.get("devices_per_node") != first.cluster.get("devices_per_node"):
            raise PlanError(f"plan set {str(d)!r}: {FILE.format(n)} has {p.cluster.get('devices_per_node')} devices "
                            f"per node, {FILE.format(min(plans))} {first.cluster.get('devices_per_node')}: a set holds "
                            "plans for one kind of node")
    return plans


def for_nodes(directory: str | Path, nodes: int) -> tuple[int, Plan]:
    """The plan to run with `nodes` nodes up and its size: the fastest of the set's plans for at most that many
    nodes (PlanSet.runs); PlanError naming the sizes the set has when none is that small."""
    plans = load(directory)
    used = PlanSet([Size(n, p) for n, p in sorted(plans.items())]).runs(Size(nodes, None))
    if used is None:
        raise PlanError(f"plan set {str(directory)!r} has no plan for {nodes} node(s) or fewer (it has "
                        f"{', '.join(map(str, sorted(plans)))}): plan that size with `partita plan --nnodes`")
    return used.nodes, used.plan

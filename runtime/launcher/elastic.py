"""Elastic runs: `partita run PLAN_SET_DIR --nnodes MIN:MAX` goes on at whatever size the nodes up allow.

The membership is torchrun's: its elastic agent and c10d rendezvous (runtime.launcher.rendezvous), `--nnodes
MIN:MAX`. What partita adds is the plan for each size and the resume into it:

- A node lost (its agent and workers gone): the surviving workers' next collective fails, their agents count a
  restart (--max-restarts) and meet again; the round closes with the nodes that came, after LAST_CALL seconds
  when fewer than MAX are there. A node that joins (the same command started again) waits at the rendezvous; the
  running agents see it and stop their workers (SIGTERM: the workers stop at a step boundary and checkpoint,
  runtime.failure.stop), at most once per --rescale-every seconds (`Rescale`), and the next round includes it.
- Each attempt's workers take the set's plan for the nodes of this round (`choose`): the size's own plan. Where
  the set says a smaller size would be faster (PlanSet.runs: the nodes beyond it idle), the elastic run still
  uses every node: keeping spares out of the process groups is not built, and `partita run` says so before the
  job starts (`refusal`) when a size in MIN..MAX has no plan of its own.
- Every later attempt continues the checkpoint directory: torchrun counts a restart after a failure, not after a
  membership change, so the agent numbers its rendezvous rounds (ROUND_ENV) and the workers take the larger
  (runtime.launcher.mesh.agree_on_attempt). The newest intact checkpoint is resumed under the new plan (DCP
  reshards it: runtime.checkpoint.resume); the global batch is the set's, the same at every size, so every step
  reads the same samples (sample position = step x global batch + row, runtime.data) whatever the size.
- Rank 0 says it in one line (`replanned_line`): `partita: 1 node(s) lost before step 1201: re-planned for 3
  nodes (pp=1 dp=24 tp=1, predicted 0.81x the 4-node throughput); resumed from step 1200`.
"""
from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path

ROUND_ENV = "PARTITA_RDZV_ROUND"
"""Set by an elastic agent before it starts each round's workers: the rendezvous round it joined (1, 2, ...)."""
LAST_CALL = 15.0
"""Seconds a rendezvous with MIN or more (but fewer than MAX) nodes waits for more before it closes: a job that
lost a node stands still this long (torch's default is 30 s). Shorter left out survivors still stopping their
workers on a loaded machine (5 s did here), which then cost another round to take back in."""
KEEP_ALIVE = 1
"""Seconds between an elastic node's rendezvous keep-alives (torch's default, 5 s, kept a shrinking job waiting
15 s for a node already dead)."""
KEEP_ALIVE_MISSES = 8
"""Keep-alives an elastic node may miss before torch drops it from the round (torch's default is 3). With 3 x 1 s,
a live agent starved of CPU for 3 s on a loaded machine was dropped from a round another node had just closed:
that node then waited for it in torchrun's rank assignment and the dropped node waited for a next round that never
came, both until the 300 s rendezvous timeout (tests/e2e/test_elastic.py, once under the suite at load 6). 8 s
still drops a dead node well inside the round's LAST_CALL."""
DEFAULT_RESCALE_EVERY = 60.0
DEFAULT_RESTARTS = 10
"""--max-restarts of an elastic run when not given: failures a job survives (membership changes are free)."""


class NodeCount(int):
    """--nnodes' value for `partita run`: N, or MIN:MAX (an elastic job; the int is MAX). str() gives the
    command-line form back, so the value survives the launcher's argv (runtime.launcher.flags.to_argv)."""

    least: int

    def __new__(cls, least: int, most: int | None = None):
        obj = super().__new__(cls, least if most is None else most)
        obj.least = least
        return obj

    @property
    def elastic(self) -> bool:
        return self.least != int(self)

    def __str__(self) -> str:
        return f"{self.least}:{int(self)}" if self.elastic else str(int(self))

    __repr__ = __str__

    def __format__(self, spec: str) -> str:
        return str(self) if not spec else format(int(self), spec)


def node_count(text: str) -> NodeCount:
    """argparse type of `partita run --nnodes`: N or MIN:MAX (1 <= MIN <= MAX)."""
    lo, sep, hi = text.partition(":")
    try:
        least, most = int(lo), int(hi) if sep else None
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a node count N or an elastic range MIN:MAX "
                                         "(e.g. 2 or 3:4)") from None
    if most is not None and not 1 <= least <= most:  # a plain N < 1 is refused with the other counts (partita.cli)
        raise argparse.ArgumentTypeError(f"--nnodes {text}: " + ("MIN must be at least 1" if least < 1 else
                                         f"MIN ({least}) is more than MAX ({most})"))
    return NodeCount(least, most)


def is_elastic(nnodes) -> bool:
    return isinstance(nnodes, NodeCount) and nnodes.elastic


@dataclass
class Choice:
    """The plan an attempt's workers run."""

    directory: str
    nodes: int
    """Nodes in this round."""
    plan_path: str
    plan: object


def choose(directory: str, world: int, per_node: int) -> Choice:
    """The set's own plan for the nodes of `world` ranks, `per_node` on each; PlanError when it has none for that
    size, or its plans are for another number of processes per node."""
    from partita.planner.plan import planset
    from partita.planner.plan.errors import PlanError
    if world % per_node:
        raise PlanError(f"{world} ranks are not whole nodes of {per_node} processes")
    nodes, plans = world // per_node, planset.load(directory)
    plan = plans.get(nodes)
    if plan is None:
        raise PlanError(f"plan set {directory!r} has no plan for {nodes} node(s) (it has "
                        f"{', '.join(map(str, sorted(plans)))}): an elastic run needs one for every size it may run at")
    if plan.mesh.world_size != world:
        raise PlanError(f"plan set {directory!r}: {planset.FILE.format(nodes)} is for {plan.mesh.world_size} ranks "
                        f"on {nodes} node(s), this job runs {per_node} per node: start it with --nproc-per-node "
                        f"{plan.mesh.world_size // nodes}")
    return Choice(directory, nodes, str(Path(directory) / planset.FILE.format(nodes)), plan)


def refusal(directory: str, nnodes: NodeCount) -> str | None:
    """Why the plan set cannot run elastically on MIN..MAX nodes (one line), before anything starts; None when
    it can. Every size needs its own plan; a size whose plan is slower than a smaller one's still runs it (and
    is named in the note `slower_sizes` gives)."""
    from partita.planner.plan import planset
    plans = planset.load(directory)
    missing = [n for n in range(nnodes.least, int(nnodes) + 1) if n not in plans]
    if not missing:
        return None
    have = sorted(plans)
    runs = [n for n in have if nnodes.least <= n <= int(nnodes)]
    hint = (f"; with this set, --nnodes {runs[0]}:{runs[-1]}" if runs and runs == list(range(runs[0], runs[-1] + 1))
            and runs[0] < runs[-1] else "")
    return (f"plan set {directory!r} has no plan for {', '.join(map(str, missing))} node(s) (it has "
            f"{', '.join(map(str, have))}): an elastic run --nnodes {nnodes} needs one for every size from "
            f"{nnodes.least} to {int(nnodes)}: plan them with `partita plan --nnodes {nnodes} --out DIR`{hint}")


def launch_refusal(plan: str, nnodes: NodeCount, checkpoint_dir: str | None, checkpoint_every: int | None) -> str | None:
    """Why `plan` cannot run as an elastic job on `nnodes` (one line), before anything starts; None when it can."""
    from partita.planner.plan import planset
    if not planset.is_plan_set(plan):
        return (f"--nnodes {nnodes} (an elastic job) runs a plan set, one plan per size: give the directory "
                f"`partita plan --nnodes {nnodes} --out DIR` wrote, not {str(plan)!r}")
    if why := refusal(str(plan), nnodes):
        return why
    if not (checkpoint_dir and checkpoint_every):
        return (f"--nnodes {nnodes}: an elastic job carries its state across sizes in checkpoints: give "
                "--checkpoint-dir DIR and --checkpoint-every N (a size change resumes from the newest)")
    return None


def procs_per_node(directory: str, nnodes: NodeCount) -> int:
    """Processes per node of an elastic job: the full size's plan's world size over MAX."""
    from partita.planner.plan import planset
    return planset.load(directory)[int(nnodes)].mesh.world_size // int(nnodes)


def slower_sizes(directory: str, nnodes: NodeCount) -> list[str]:
    """Notes for the sizes whose own plan is predicted slower than a smaller size's: the elastic run uses every
    node it has, unless started at most at the faster size, the other nodes waiting as spares (the note says how;
    runtime.launcher.rendezvous.is_spare)."""
    from partita.planner.plan import planset
    s = planset.from_directory(directory)
    out = []
    for size in s.sizes:
        used = s.runs(size)
        if nnodes.least <= size.nodes <= int(nnodes) and size.plan is not None and used is not None \
                and used is not size:
            out.append(f"note: plan set {directory}: on {size.nodes} nodes the {used.nodes}-node plan is predicted "
                       f"faster ({used.plan.predicted['step_time_s']:.4g} s against "
                       f"{size.plan.predicted['step_time_s']:.4g} s a step); an elastic run uses all {size.nodes} "
                       f"(to keep the faster plan, start it with --nnodes {min(nnodes.least, used.nodes)}:{used.nodes} and the other "
                       "nodes as spares: they wait and take the place of a lost node)")
    return out


def replanned_line(choice: Choice, before_world: int | None, step: int, per_node: int,
                   memory: bool = False) -> str | None:
    """The one line rank 0 prints when an attempt resumes at another size than the checkpoint (or, `memory`, the
    snapshot in the nodes' memory: runtime.checkpoint.recovery) was written at; None when the size is unchanged."""
    from partita.planner.plan import planset
    if not before_world or before_world == choice.nodes * per_node:
        return None
    before = before_world // per_node
    m = choice.plan.mesh
    ratio = ""
    earlier = planset.load(choice.directory).get(before)
    if earlier is not None:
        ratio = (f", predicted {earlier.predicted['step_time_s'] / choice.plan.predicted['step_time_s']:.2f}x "
                 f"the {before}-node throughput")
    went = "lost" if choice.nodes < before else "joined"
    return (f"partita: {abs(before - choice.nodes)} node(s) {went} before step {step + 1}: re-planned for "
            f"{choice.nodes} node{'s' * (choice.nodes != 1)} (pp={m.pp} dp={m.dp} tp={m.tp}{ratio}); "
            f"resumed from step {step}" + (" from the nodes' memory" if memory else ""))


def attempt_from_round() -> int:
    """Later rounds of an elastic job continue its checkpoints: round R counts as attempt R - 1."""
    try:
        return max(0, int(os.environ.get(ROUND_ENV, "1")) - 1)
    except ValueError:
        return 0


class Rescale:
    """At most one membership change for a joining node per `every` seconds: a waiting node is reported to
    torchrun's agent (which then restarts its workers into a new round) only that long after the last round
    closed. A lost node is not delayed: the job cannot go on without it."""

    def __init__(self, every: float, clock=time.monotonic):
        self.every, self.clock, self.closed_at = every, clock, None
        self.leave = None
        """This node's runtime.launcher.leave.Leave: other nodes waiting for a node that hung, this one."""

    def round_closed(self, nodes: int | None = None) -> None:
        self.closed_at = self.clock()
        if self.leave is not None:
            self.leave.nodes = nodes

    def waiting(self, count: int) -> int:
        if count and self.leave is not None and self.leave.others_wait():
            return 0  # this node may have hung: it waits to know, then leaves rather than meet the others again
        if count and self.closed_at is not None and self.clock() - self.closed_at < self.every:
            return 0
        return count


def rescale_for(nnodes, every: float | None) -> Rescale | None:
    """An elastic job's Rescale (`every` seconds, default DEFAULT_RESCALE_EVERY); None for a fixed node count."""
    return Rescale(DEFAULT_RESCALE_EVERY if every is None else every) if is_elastic(nnodes) else None

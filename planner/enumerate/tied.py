"""Tied weights split over pipeline stages (Megatron's embedding group: an input embedding on the first stage,
the LM head that shares its weight on the last): which ties cross stages, and what each costs a candidate --
the second copy's state and gradient, and the per-step all-reduce of its gradient between the two stages."""
from __future__ import annotations

from dataclasses import dataclass

from partita.costmodel.capture.graph import OpGraph
from partita.costmodel.hardware import Cluster
from partita.costmodel.price import comm
from partita.planner.enumerate.options import zero_state_bytes
from partita.planner.solve.milp_blocks import BlockProblem


@dataclass(frozen=True)
class TiedWeight:
    """A parameter held under two names whose owners are groups of the graph (a tied embedding and head)."""

    first: str
    """The name the capture counts it under (costmodel.capture.trace: the first name), and its group."""
    second: str
    first_group: str
    second_group: str
    numel: int


def tied_weights(graph: OpGraph) -> list[TiedWeight]:
    """Every tied parameter of the graph (node attribute `tied`: {second name: first name})."""
    numel, group_of = {}, {}
    for _, d in graph.g.nodes(data=True):
        for name, n in d.get("params", {}).items():
            numel.setdefault(name, n)
            group_of.setdefault(name, d["group"])
    out = {}
    for _, d in graph.g.nodes(data=True):
        for second, first in d.get("tied", {}).items():
            if first in numel and second not in out:
                out[second] = TiedWeight(first, second, group_of[first], d["group"], numel[first])
    return list(out.values())


def tied_across_stages(graph: OpGraph, first_stage: list[str], last_stage: list[str]) -> list[TiedWeight]:
    """The tied weights with one owner among the groups a pipeline puts on its first stage and the other
    among those on its last (Megatron's embedding group: input embedding and LM head). Ties within a stage
    cost nothing; ties into the repeated layers (whose stage the solver picks) are not charged."""
    first, last = set(first_stage), set(last_stage)
    return [t for t in tied_weights(graph)
            if (t.first_group in first and t.second_group in last) or (t.first_group in last and t.second_group in first)]


def _tied_terms(t: TiedWeight, cluster: Cluster, sb, zero: int, dp: int, tp: int, pp: int) -> dict:
    """The second copy's model state and grad bytes and the per-step all-reduce of its gradient (summing the
    two stages' gradients before the optimizer step, runtime/parallel/pp/) between pipeline ranks 0 and pp - 1 of
    the same (dp, tp) coordinate: pp - 1 pipeline ranks apart, each dp x tp ranks wide. Under ZeRO 2/3
    the gradient is each dp rank's shard. Tied weights are replicated over tp (runtime/launcher/checks.py)."""
    grad_bytes = t.numel * sb.grad_comm / (dp if zero >= 2 else 1)
    seconds = comm.all_reduce(cluster, comm.group_for(cluster, 2, (pp - 1) * dp * tp), grad_bytes)
    return {"params": [t.first, t.second], "numel": t.numel, "pp_ranks": [0, pp - 1], "grad_bytes": grad_bytes,
            "allreduce_s": seconds, "state_bytes": zero_state_bytes(t.numel, sb, zero, dp)}


def _charge_tied(e: dict, tied: list[TiedWeight], last_stage: list[str], cluster: Cluster, sb, zero: int, dp: int,
                 tp: int, pp: int) -> list[dict]:
    """Charge each tied weight split over the first and last stage (pp > 1) to the per-stage arrays `e`:
    the second copy's state and gradient on the stage that holds no copy in the capture's count (the one
    of its second owner), the gradient all-reduce once per step in the last stage's flush (and its
    data-parallel-comm share of the breakdown). Returns what was charged (Candidate.parts["tied"])."""
    if pp <= 1:
        return []
    out = []
    for t in tied:
        terms = _tied_terms(t, cluster, sb, zero, dp, tp, pp)
        copy_stage = pp - 1 if t.second_group in last_stage else 0
        e["state"][copy_stage] += terms["state_bytes"]
        e["grad"][copy_stage] += terms["grad_bytes"]
        e["flush"][pp - 1] += terms["allreduce_s"]
        e["dp"][pp - 1] += terms["allreduce_s"]
        out.append(terms)
    return out


def _charge_tied_blocks(problem: BlockProblem, tied: list[TiedWeight], groups: list[str], cluster: Cluster, sb,
                        zero: int, dp: int, tp: int, pp: int) -> list[dict]:
    """`_charge_tied` for the general program: a tied weight whose owners are the first and the last group
    (on the first and last stage whatever the solver decides; `tied_across_stages` of those two groups)
    charges its copy's state to the options of the owner the capture did not count it at, and the
    gradient all-reduce to the last group's flush (the last stage's)."""
    if pp <= 1:
        return []
    out = []
    last = problem.block_of == len(groups) - 1
    for t in tied:
        terms = _tied_terms(t, cluster, sb, zero, dp, tp, pp)
        copy = problem.block_of == (0 if t.first_group == groups[-1] else len(groups) - 1)
        problem.state[copy] += terms["state_bytes"]
        problem.flush[last] += terms["allreduce_s"]
        out.append(terms)
    return out

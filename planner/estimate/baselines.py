"""Baselines: the plans people configure by hand, under partita's own cost model and solver.

Each baseline is `search(graph, cluster, train, space=...)` over a restricted SearchSpace, the same
signature and the same costs as the full search (Checkmate's practice: every solver and baseline has
one signature), so "the plan beats the baselines" is like for like. Every baseline space is contained
in the full space, so the plan is never predicted slower than a baseline that fits (up to the solver's
relative gap, 0.5%).

- DDP: data parallelism only, replicated model states, no recompute.
- FSDP: data parallelism only with ZeRO-3 (FSDP2), recompute allowed (the usual FSDP + activation
  checkpointing recipe).
- Megatron TP x PP: tensor parallelism over a whole node (up to 8), the fewest pipeline stages that fit,
  data parallelism across the rest, full recompute, no ZeRO (Narayanan et al. SC'21, Table 1 practice).
- recompute everything: the full search with every layer fully recomputed (Chen et al. 2016).
"""
from __future__ import annotations

from partita.costmodel.capture.graph import OpGraph
from partita.costmodel.hardware.stacks import DEFAULT_STACK
from partita.costmodel.hardware import Cluster
from partita.planner.estimate.build import predicted
from partita.planner.search import SearchSpace, TrainConfig, search


def baseline_spaces(cluster: Cluster, kernels: str = "eager", stack: str = DEFAULT_STACK) -> list[SearchSpace]:
    """The baselines' spaces, their operators run as the plan's (`kernels`) on the plan's software stack
    (`stack`: its overlaps searched as the plan's are, planner.enumerate.space.overlap_choices): like for like."""
    node_tp = max(t for t in (1, 2, 4, 8) if cluster.devices_per_node % t == 0)
    run = {"kernels": kernels, "stack": stack}
    return [
        SearchSpace(name="DDP", tp=(1,), pp=(1,), zero=(0,), recompute=("none",), offload=False, **run),
        SearchSpace(name="FSDP (ZeRO-3)", tp=(1,), pp=(1,), zero=(3,), recompute=("none", "full"), offload=False,
                    **run),
        SearchSpace(name=f"Megatron TP{node_tp} x PP", tp=(node_tp,), zero=(0,), recompute=("full",),
                    offload=False, min_pp=True, **run),
        SearchSpace(name="recompute everything", recompute=("full",), **run),
    ]


def run_baselines(graph: OpGraph, cluster: Cluster, train: TrainConfig, kernels: str = "eager",
                  stack: str = DEFAULT_STACK) -> list[dict]:
    """Each baseline's best plan as {"name", "fits", "mesh", "predicted"} (predicted None if nothing fits),
    priced with the plan's `kernels` and `stack` (SearchSpace.kernels, SearchSpace.stack)."""
    out = []
    for space in baseline_spaces(cluster, kernels, stack):
        result = search(graph, cluster, train, space=space, raise_infeasible=False)
        c = result.best
        if c is None:
            why = ("does not fit in memory" if result.candidates else
                   "no mesh: the global batch does not divide over its data-parallel ranks")
            out.append({"name": space.name, "fits": False, "mesh": None, "predicted": None, "why": why})
            continue
        out.append({"name": space.name, "fits": True,
                    "mesh": {"pp": c.pp, "dp": c.dp, "tp": c.tp, "zero_stage": c.zero,
                             "micro_batch_size": c.micro_batch, "num_microbatches": c.num_microbatches},
                    "predicted": {k: v for k, v in predicted(result, c).items() if k != "memory_per_stage"}})
    return out

"""Pipeline parallelism: split the user's module at the plan's FQNs and run a 1F1B, GPipe or interleaved
1F1B schedule.

`torch.distributed.pipelining.pipeline()` traces the module (torch.export) with one example
microbatch and splits it with `SplitPoint.BEGINNING` at each stage's `split_at`; stage modules keep
the original parameter FQNs, so tensor parallelism can still be applied by name. With interleaved 1F1B
the plan has pp x virtual_stages stages in model order and pipeline rank r holds stages r, r + pp, ...
(`local_stages`): one PipelineStage each, all driven by one ScheduleInterleaved1F1B.
"""
from __future__ import annotations

import warnings
from typing import Callable

import torch
import torch.nn as nn
from torch.distributed.pipelining import (Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B, SplitPoint,
                                          pipeline)

from planner.plan import Plan, PlanError
from runtime.blocks import blocks_in

SCHEDULES = {"1F1B": Schedule1F1B, "GPipe": ScheduleGPipe, "Interleaved1F1B": ScheduleInterleaved1F1B}


def local_stages(plan: Plan, pp_rank: int) -> list[int]:
    """Indices of the stages pipeline rank `pp_rank` runs: pp_rank, pp_rank + pp, ... (plan.py)."""
    return list(range(pp_rank, len(plan.stages), plan.mesh.pp))


def check_schedule(plan: Plan) -> None:
    """PlanError if torch's schedule cannot run the plan's microbatches and stages."""
    s, pp = plan.schedule, plan.mesh.pp
    if s.name == "1F1B" and s.num_microbatches < pp:
        raise PlanError(f"1F1B needs at least as many microbatches as stages ({s.num_microbatches} < pp={pp})")
    if s.name == "Interleaved1F1B":
        if pp < 2:
            raise PlanError(f"Interleaved1F1B (virtual_stages {s.virtual_stages}) needs pp >= 2; "
                            "with pp=1 use a plain 1F1B plan")
        rounds = max(1, s.num_microbatches // pp)  # torch's ScheduleInterleaved1F1B
        if s.num_microbatches % rounds:
            raise PlanError(f"Interleaved1F1B runs microbatches in rounds of pp={pp}: num_microbatches "
                            f"{s.num_microbatches} must be a multiple of {rounds} (e.g. a multiple of pp)")


def split(model: nn.Module, plan: Plan, example_microbatch: torch.Tensor):
    """Trace and split `model` into the plan's stages; returns the Pipe."""
    spec = {s.split_at: SplitPoint.BEGINNING for s in plan.stages[1:]}
    with warnings.catch_warnings():  # torch-internal pytree deprecation noise from export, once per rank
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        pipe = pipeline(model, mb_args=(example_microbatch,), split_spec=spec)
    if pipe.num_stages != len(plan.stages):
        raise PlanError(f"splitting at {list(spec)} gave {pipe.num_stages} stages, the plan has {len(plan.stages)}")
    check_ownership(pipe, plan, model)
    for i in range(pipe.num_stages):  # on every rank, so that all of them stop if one stage would
        blocks_in(pipe.get_stage_module(i), plan, i)
    return pipe


def check_ownership(pipe, plan: Plan, model: nn.Module) -> None:
    """Every parameter of a module the plan lists for stage i must live in stage i after the split."""
    owned = {i: {n for n, _ in pipe.get_stage_module(i).named_parameters()} for i in range(pipe.num_stages)}
    for stage in plan.stages:
        for fqn in stage.modules:
            for name, _ in model.get_submodule(fqn).named_parameters(prefix=fqn):
                if name not in owned[stage.index]:
                    where = [i for i, names in owned.items() if name in names]
                    raise PlanError(f"plan puts {fqn!r} on stage {stage.index}, but splitting at the plan's "
                                    f"split_at points puts {name!r} on stage {where[0] if where else '?'}")


def build_schedule(pipe, plan: Plan, stage_indices: list[int], device: torch.device, group,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    """This rank's PipelineStages (one per index) and the plan's schedule over them.

    Gradients are scaled by 1/num_microbatches (scale_grads), so with a per-microbatch mean loss they
    equal those of the mean loss over the whole (data-parallel rank's) batch.
    """
    stages = [pipe.build_stage(i, device, group=group) for i in stage_indices]
    cls, n = SCHEDULES[plan.schedule.name], plan.schedule.num_microbatches
    if cls is ScheduleInterleaved1F1B:
        return stages, cls(stages, n_microbatches=n, loss_fn=loss_fn, scale_grads=True)
    assert len(stages) == 1, stage_indices
    return stages, cls(stages[0], n_microbatches=n, loss_fn=loss_fn, scale_grads=True)

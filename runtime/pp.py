"""Pipeline parallelism: split the user's module at the plan's FQNs and run a 1F1B or GPipe schedule.

`torch.distributed.pipelining.pipeline()` traces the module (torch.export) with one example
microbatch and splits it with `SplitPoint.BEGINNING` at each stage's `split_at`; stage modules keep
the original parameter FQNs, so tensor parallelism can still be applied by name.
"""
from __future__ import annotations

import warnings
from typing import Callable

import torch
import torch.nn as nn
from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, SplitPoint, pipeline

from planner.plan import Plan, PlanError
from runtime.blocks import blocks_in

SCHEDULES = {"1F1B": Schedule1F1B, "GPipe": ScheduleGPipe}


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


def build_schedule(pipe, plan: Plan, stage_index: int, device: torch.device, group,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    """This rank's PipelineStage and the plan's schedule over it.

    Gradients are scaled by 1/num_microbatches (scale_grads), so with a per-microbatch mean loss they
    equal those of the mean loss over the whole (data-parallel rank's) batch.
    """
    stage = pipe.build_stage(stage_index, device, group=group)
    cls = SCHEDULES[plan.schedule.name]
    return stage, cls(stage, n_microbatches=plan.schedule.num_microbatches, loss_fn=loss_fn, scale_grads=True)

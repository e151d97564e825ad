"""The runtime side of a plan's sync mode (planner.plan.sync): a hook of the trainer loop (runtime.loop.trainer)
around the backward and the optimizer step.

A mode's hook class is built with the executor and the topology (`make_hook`) and may:
- `during_backward(step)`: return a context the step's forward and backward run in (e.g. DDP's `no_sync`, for a
  mode that does not average gradients every step);
- `before_optimizer(step)` / `after_optimizer(step)`: run around the optimizer step (e.g. average the parameters
  across the data-parallel replicas every H steps: local SGD; an outer optimizer step: DiLoCo).

A new mode is one entry in HOOKS under the name of its registry entry (planner.plan.sync.SYNC_MODES), beside its
price function (planner.estimate.sync.PRICES).
"""
from __future__ import annotations

import contextlib

from partita.costmodel import PartitaError
from partita.planner.plan.sync import SYNC_MODES, SYNCHRONOUS, Sync, accepted
from partita.runtime.loop.trainer import StepHook


class SyncHook(StepHook):
    """A sync mode's hook: built from the executor (its `params`, `ddp`, `replicas` group), the topology and the
    plan's options for the mode."""

    def __init__(self, executor, topo, options: dict):
        self.executor, self.topo, self.options = executor, topo, options

    def during_backward(self, step: int):
        return contextlib.nullcontext()


class Synchronous(SyncHook):
    """Synchronous data parallelism: nothing to do around the optimizer step. DDP averages the gradients in
    its buckets during the backward, FSDP reduce-scatters them there, and an executor without either averages
    them at the end of its step (runtime.parallel.apply.LocalExecutor.step); pipeline stages do the same per
    stage. By the optimizer step every replica holds the same averaged gradients."""


HOOKS: dict[str, type[SyncHook]] = {SYNCHRONOUS: Synchronous}
"""A hook class per registered sync mode (the same names as planner.plan.sync.SYNC_MODES)."""


def make_hook(sync: Sync, executor, topo) -> SyncHook:
    """The hook of the plan's sync mode, for the trainer loop."""
    if sync.mode not in SYNC_MODES or sync.mode not in HOOKS:
        raise PartitaError(f"sync mode {sync.mode!r} has no runtime hook; accepted: {accepted()}")
    return HOOKS[sync.mode](executor, topo, dict(sync.options))

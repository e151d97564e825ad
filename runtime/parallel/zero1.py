"""ZeRO-1 (zero_stage 1): optimizer state sharded over the data-parallel ranks, gradients and parameters
whole (Rajbhandari et al. SC'20, stage P_os), as torch's `ZeroRedundancyOptimizer` runs it.

The gradients are averaged over the data-parallel ranks as in a ZeRO-0 plan (DDP's buckets during the
backward, or runtime.parallel.apply's hand average); then each rank steps only the parameters it owns -- whole
tensors, assigned largest first to the rank holding the fewest elements so far -- with the optimizer
state of those alone, and broadcasts them to the other ranks (ZeroRedundancyOptimizer._sync_params, one
broadcast per parameter). planner.enumerate.options prices that: the all-reduce, the optimizer step over a 1/d
share, and after it the parameters' broadcast (the bytes of an all-gather of the parameters).

`make_zero1` aliases the wrapper's `state` to its local optimizer's, so what reads `optimizer.state`
(checkpoints, memory accounting, the traced step's snapshot) sees the state this rank holds, keyed by
the parameters it owns. Which plans this runs for: planner.plan.executable.zero_refusal.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Iterable

import torch

if TYPE_CHECKING:
    from torch.distributed.optim import ZeroRedundancyOptimizer

from partita.runtime.loop.recipe import optimizer_class, param_groups


def make_zero1(params: Iterable[torch.Tensor], lr: float, name: str, group,
               weight_decay: float = 0.0) -> ZeroRedundancyOptimizer:
    """The optimizer `name` (runtime.loop.recipe) sharded over the ranks of `group` (module docstring), decaying
    the matrices by `weight_decay` (runtime.loop.recipe.param_groups)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer  # a third of a second: imported when used
    cls, kwargs = optimizer_class(name)
    opt = ZeroRedundancyOptimizer(param_groups(params, weight_decay), optimizer_class=cls, process_group=group,
                                  lr=lr, **kwargs)
    opt.state = opt.optim.state  # this rank's state, keyed by the parameters it owns
    return opt


def owned(optimizer: torch.optim.Optimizer, params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """Those of `params` whose optimizer state this rank holds: all of them, or under ZeRO-1 the ones it
    owns (a checkpoint restores state for those alone, so no rank keeps a stale copy of another's)."""
    zero = sys.modules.get("torch.distributed.optim")  # not imported: no ZeroRedundancyOptimizer exists
    if zero is None or not isinstance(optimizer, zero.ZeroRedundancyOptimizer):
        return list(params)
    mine = {id(p) for g in optimizer.optim.param_groups for p in g["params"]}
    return [p for p in params if id(p) in mine]

"""The plan's per-block choices on a module: which blocks it holds, and their recompute and activation offload.

Blocks are found by module FQN in the module being run -- the user's model, or the pipeline stage a rank
runs (whose outlined submodules keep the user's FQNs) -- and their forwards are wrapped in place
(runtime.wrap), so the user's forward code runs unchanged.
"""
from __future__ import annotations

import torch.nn as nn

from partita.planner.plan import BlockChoice, Plan, PlanError
from partita.runtime.offload import offload_activations
from partita.runtime.recompute import recompute
from partita.runtime.wrap import wrap_forward


def blocks_in(module: nn.Module, plan: Plan, stage: int | None = None) -> dict[str, BlockChoice]:
    """{fqn: choice} of the plan's blocks `module` runs: all of them, or those of pipeline stage `stage`."""
    have = dict(module.named_modules())
    mine = [b for b in plan.blocks if stage is None or b.stage == stage]
    missing = [b.fqn for b in mine if b.fqn not in have]
    if missing:
        where = "the model" if stage is None else f"pipeline stage {stage} after the split"
        raise PlanError(f"plan blocks {missing} are not modules of {where}")
    return {b.fqn: b for b in mine}


def apply_block_choices(module: nn.Module, blocks: dict[str, BlockChoice]) -> None:
    """Wrap each block's forward for its recompute and activation offload."""
    for fqn, b in blocks.items():
        if b.offload_activations:
            wrap_forward(module.get_submodule(fqn), offload_activations(b.recompute))
        elif b.recompute != "none":
            wrap_forward(module.get_submodule(fqn), recompute(b.recompute))

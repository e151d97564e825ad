"""The plan's per-block choices on a module: which blocks it holds, their recompute and activation offload,
and for a plan priced with compiled kernels (Plan.kernels), torch.compile of each layer.

Blocks are found by module FQN in the module being run -- the user's model, or the pipeline stage a rank
runs (whose outlined submodules keep the user's FQNs) -- and their forwards are wrapped in place
(runtime.parallel.wrap), so the user's forward code runs unchanged. A compiled layer's `forward` becomes
torch.compile of the wrapped forward (FQNs unchanged, unlike wrapping the module in an OptimizedModule):
FSDP2's gathers and tensor parallelism's layouts stay outside, in nn.Module.__call__'s hooks, and the
checkpoint inside, traced by AOTAutograd. Measured on gloo/CPU (tests/e2e/test_plan_elements.py): with
FSDP2 and full or selective recompute, with activation offload's saved-tensor hooks (a graph break), with
DTensor tensor and sequence parallelism and in a pipeline stage, a compiled run trains like the eager
single-process reference. Not run: offload under selective recompute (planner.plan.executable.offload_refusal:
the search leaves it out of compiled plans and runtime.launcher.checks refuses a hand-written one).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from partita.costmodel.price.fusion import is_layer
from partita.planner.plan import BlockChoice, Plan, PlanError
from partita.runtime.parallel.offload import offload_activations
from partita.runtime.parallel.recompute import recompute
from partita.runtime.parallel.wrap import wrap_forward


def blocks_in(module: nn.Module, plan: Plan, stage: int | None = None) -> dict[str, BlockChoice]:
    """{fqn: choice} of the plan's blocks `module` runs: all of them, or those of pipeline stage `stage`."""
    have = dict(module.named_modules())
    mine = [b for b in plan.blocks if stage is None or b.stage == stage]
    missing = [b.fqn for b in mine if b.fqn not in have]
    if missing:
        where = "the model" if stage is None else f"pipeline stage {stage} after the split"
        raise PlanError(f"plan blocks {missing} are not modules of {where}")
    return {b.fqn: b for b in mine}


def apply_block_choices(module: nn.Module, blocks: dict[str, BlockChoice], compiled: bool = False) -> list[str]:
    """Wrap each block's forward for its recompute and activation offload; with `compiled`, then compile
    each layer's wrapped forward (torch.compile; AOTAutograd traces the checkpoint with it, and FSDP2's and
    tensor parallelism's hooks stay outside, in nn.Module.__call__). Returns the compiled blocks' FQNs."""
    done = []
    for fqn, b in blocks.items():
        block = module.get_submodule(fqn)
        if b.offload_activations:
            wrap_forward(block, offload_activations(b.recompute))
        elif b.recompute != "none":
            wrap_forward(block, recompute(b.recompute))
        if compiled and is_layer(fqn):
            block.forward = torch.compile(block.forward)
            done.append(fqn)
    return done

"""ZeRO stages 2 and 3 as FSDP2 `fully_shard` over the plan's "dp" mesh axis.

Each block of the plan present in the module (the whole model, or one pipeline stage) is its own unit,
innermost first, then the module itself is the root unit holding what no block holds -- as torchtitan
applies FSDP per transformer block and per pipeline stage. zero_stage 3 reshards parameters after the
forward (gathered again for the backward); zero_stage 2 keeps them gathered from forward to backward
(`reshard_after_forward=False`), per block where the block has its own zero_stage; both reduce-scatter gradients, so each rank keeps its shard of gradients
and optimizer state. Tensor-parallel parameters (DTensors on the "tp" axis of the same mesh) become 2-D
(dp, tp) shards. A block with `offload_states` gets CPUOffloadPolicy (runtime.parallel.offload); bf16 plans get
MixedPrecisionPolicy (runtime.parallel.precision). zero_stage 1 is runtime.parallel.zero1's.
"""
from __future__ import annotations

import torch
import torch.nn as nn
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

from partita.planner.plan import BlockChoice, Plan
from partita.runtime.parallel.offload import state_policy
from partita.runtime.parallel.precision import fsdp_policy


def sharded(plan: Plan) -> bool:
    """Whether the plan runs FSDP (zero_stage 2 or 3; stage 1 shards the optimizer alone, runtime.parallel.zero1)."""
    return plan.zero_stage in (2, 3)


def apply_fsdp(module: nn.Module, blocks: dict[str, BlockChoice], zero_stage: int, dp_mesh: DeviceMesh,
               dtype: torch.dtype, stage_root: bool = False, pure: bool = False) -> int:
    """Shard `module` in place; `blocks` maps FQNs within it to their choices; `pure`: a pure-bf16 model
    (runtime.parallel.precision). Returns the number of units."""
    from torch.distributed.fsdp import fully_shard  # imports DTensor: only plans that shard load it
    assert zero_stage in (2, 3), zero_stage
    reshard = zero_stage == 3
    order = sorted((fqn for fqn in blocks if fqn), key=lambda f: -f.count("."))  # children before parents
    for fqn in order:
        own = blocks[fqn].zero_stage  # a block's own stage: 2 keeps its parameters gathered after forward
        fully_shard(module.get_submodule(fqn), mesh=dp_mesh,
                    reshard_after_forward=reshard if own is None else own == 3,
                    mp_policy=fsdp_policy(dtype, pure=pure), offload_policy=state_policy(blocks[fqn].offload_states))
    root = blocks.get("")
    fully_shard(module, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=fsdp_policy(dtype, stage_root, pure),
                offload_policy=state_policy(root is not None and root.offload_states))
    return len(order) + 1

"""Tensor parallelism: the plan's "colwise"/"rowwise" Linear layers become DTensor-sharded on the tp mesh.

A column-parallel layer whose parent module also holds a row-parallel layer (q/k/v -> proj, fc1 -> fc2)
hands its local shard on, Megatron style; a lone column-parallel layer (e.g. an LM head) gathers its
output, and a lone row-parallel layer takes a replicated input, so the user's forward runs unchanged.
Everything else stays replicated (plain tensors, identical on every tp rank).

Works on the user's nn.Linear modules and on the outlined copies that `pipeline()` makes of them
(`InterpreterModule`s holding the same `weight`/`bias` and calling `aten.linear`).
"""
from __future__ import annotations

from functools import partial

import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class _LinearLike:
    """Mixin: apply the nn.Linear sharding to any module that holds Linear's weight/bias."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if isinstance(module, nn.Linear):
            return super()._apply(module, device_mesh)
        if isinstance(self, RowwiseParallel):
            self.desired_input_layouts = (Shard(-1),)
        return distribute_module(
            module, device_mesh, self._partition_linear_fn,
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))


class Colwise(_LinearLike, ColwiseParallel):
    pass


class Rowwise(_LinearLike, RowwiseParallel):
    pass


def styles(placements: dict[str, str]) -> dict[str, ColwiseParallel | RowwiseParallel]:
    """ParallelStyle per module FQN, with the input/output layouts the pairing rule above gives."""
    parents = {style: {fqn.rpartition(".")[0] for fqn, s in placements.items() if s == style}
               for style in ("colwise", "rowwise")}
    out = {}
    for fqn, style in placements.items():
        parent = fqn.rpartition(".")[0]
        if style == "colwise":
            paired = parent in parents["rowwise"]
            out[fqn] = Colwise() if paired else Colwise(output_layouts=Replicate())
        else:
            paired = parent in parents["colwise"]
            out[fqn] = Rowwise() if paired else Rowwise(input_layouts=Replicate())
    return out


def apply_tp(module: nn.Module, placements: dict[str, str], tp_mesh: DeviceMesh) -> int:
    """Shard the placed layers that `module` holds (all, or one pipeline stage's); returns how many."""
    have = dict(module.named_modules())
    plan = {fqn: style for fqn, style in styles(placements).items() if fqn in have}
    if plan:
        parallelize_module(module, tp_mesh, plan)
    return len(plan)

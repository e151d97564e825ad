"""Gradient clipping by the global norm of the whole model's gradients, under any plan.

By the optimizer step every data-parallel replica holds the same averaged gradients (runtime.loop.sync), so the
norm is that of one replica, which may itself be spread over ranks:

- a DTensor gradient (FSDP2's dp shards, tensor-parallel shards, replicated DTensors): torch's own
  `torch.nn.utils.get_total_norm` over DTensors of one mesh and placement gives a DTensor norm, whose
  `full_tensor()` reduces the shards' parts over their mesh (a replicated one is already whole);
- an expert shard (runtime.parallel.ep): each ep rank holds its experts' gradients as plain tensors, so their
  squared norms are summed over the ep group;
- a pipeline stage (pp > 1): each rank holds its stages' parameters only, so the squared norms of the stages
  are summed over the pp group (torchtitan's `clip_grad_norm_(..., pp_mesh)` does the same; pytorch/torchtitan
  issue 596); a tied parameter (an embedding and a head on different stages) has a copy on each stage holding the
  same summed gradient, and counts once (measured: counted twice, a tied GPT-2's norm was 14% off);
- any other gradient (DDP, a replicated tensor beside tensor-parallel ones, cp replicas) is whole on this rank.

Then `torch.nn.utils.clip_grads_with_norm_` scales every gradient by min(1, max_norm / (norm + 1e-6)) -- the
scaling `torch.nn.utils.clip_grad_norm_` applies, which is what the single-process reference calls
(runtime.verify.checks), so the two clip alike.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from partita.runtime.loop.recipe import is_dtensor
from partita.runtime.parallel.ep import EP_ATTR


def _sum_squares(grads: list[torch.Tensor]) -> torch.Tensor:
    """The squared L2 norm of `grads` together, as a plain float64 tensor on this rank."""
    total = torch.nn.utils.get_total_norm(grads, 2.0, foreach=False)
    if is_dtensor(total):
        total = total.full_tensor()
    return total.double().square()


@torch.no_grad()
def global_grad_norm(params: list[torch.Tensor], pp_group=None) -> torch.Tensor:
    """Collective over the ranks holding the model's pieces: the L2 norm of the whole model's gradients (module
    docstring), the same float64 scalar on every rank. `pp_group`: the pipeline's group when pp > 1."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is None:
            continue
        if is_dtensor(p.grad):
            key = ("dtensor", id(p.grad.device_mesh), tuple(p.grad.placements))
        else:
            ep = getattr(p, EP_ATTR, None)
            key = ("ep", id(ep.group)) if ep is not None else ("plain",)
        groups.setdefault(key, []).append(p)
    total = torch.zeros((), dtype=torch.float64, device=params[0].device if params else None)
    for key, members in groups.items():
        part = _sum_squares([p.grad for p in members]).to(total.device)
        if key[0] == "ep":
            dist.all_reduce(part, group=getattr(members[0], EP_ATTR).group)
        total += part
    if pp_group is not None:
        dist.all_reduce(total, group=pp_group)
    return total.sqrt()


def _unique(params: list[torch.Tensor]) -> list[torch.Tensor]:
    return list({id(p): p for p in params}.values())


@torch.no_grad()
def clip_grad_norm(params: list[torch.Tensor], max_norm: float, pp_group=None,
                   counted: list[torch.Tensor] | None = None) -> float:
    """Scale the gradients of `params` so that their global norm is at most `max_norm`; returns the norm before
    clipping. `counted`: the parameters the norm counts on this rank (default `params`): a pipeline's copies of a
    tied parameter on several stages are one parameter, whose gradient counts once (runtime.parallel.pp.TiedSync)."""
    norm = global_grad_norm(_unique(params if counted is None else counted), pp_group)
    grads = [p for p in _unique(params) if p.grad is not None]
    torch.nn.utils.clip_grads_with_norm_(grads, max_norm, norm.float(), foreach=False)
    return float(norm)

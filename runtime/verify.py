"""The single-process reference: the unpartitioned model trained on the same batches, and the comparisons.

Beside the losses, the final parameters are compared: `param_stats` gives every run a checksum (the sum
of all parameter elements in float64, each element counted once however the plan shards or replicates
it) and, under --verify, the largest elementwise difference from the reference model's parameters.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor, Shard

from costmodel.models import ModelSpec
from runtime.recipe import build_model, loss_for, make_optimizer

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-3}


def reference_run(spec: ModelSpec, data, steps: int, seed: int, lr: float, device: torch.device,
                  optimizer: str = "adam") -> tuple[list[float], nn.Module]:
    """Full-batch training in one process: same init, batches, loss and optimizer as the distributed run.
    Returns the losses of steps 1..`steps` and the trained model."""
    model = build_model(spec, seed).to(device)
    opt = make_optimizer(model.parameters(), lr, optimizer)
    loss_fn = loss_for(spec)
    losses = []
    for k in range(steps):
        batch = tuple(t.to(device) for t in data.batch(k))
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model, batch)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


def reference_losses(spec: ModelSpec, data, steps: int, seed: int, lr: float, device: torch.device,
                     optimizer: str = "adam") -> list[float]:
    return reference_run(spec, data, steps, seed, lr, device, optimizer)[0]


def compare(losses: list[float], reference: list[float], tol: float) -> tuple[float, bool]:
    """(largest absolute difference, within tolerance). NaN/inf or unequal lengths never pass."""
    if len(losses) != len(reference) or not losses:
        return math.inf, False
    diffs = [abs(a - b) for a, b in zip(losses, reference)]
    if not all(math.isfinite(d) for d in diffs):  # max() would silently skip a NaN
        return math.inf, False
    diff = max(diffs)
    return diff, diff <= tol


def checksum(model: nn.Module) -> float:
    """Sum of every parameter element of an unsharded model, in float64."""
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def _counted_here(p: torch.Tensor, coords: dict[str, int]) -> bool:
    """Whether this rank's copy of `p` counts towards the checksum: along each of the dp and tp axes,
    either `p` is sharded over it or this rank is its first coordinate."""
    names, placements = (), ()
    if isinstance(p, DTensor):
        names, placements = p.device_mesh.mesh_dim_names or (), p.placements
    for axis, coord in coords.items():
        sharded = axis in names and isinstance(placements[names.index(axis)], Shard)
        if not sharded and coord != 0:
            return False
    return True


def param_stats(modules: list[nn.Module], coords: dict[str, int], names: list[tuple[str, torch.Size]],
                reference: nn.Module | None, device: torch.device, compare_params: bool) -> tuple[float, float | None]:
    """Collective over all ranks: (checksum of the trained parameters, largest |parameter - reference|
    or None). `names` lists every parameter of the whole model (name, shape) in one order on all ranks;
    `reference` is the trained reference model on rank 0 (None elsewhere)."""
    local = {n: p for m in modules for n, p in m.named_parameters()}
    total = torch.zeros((), dtype=torch.float64, device=device)
    for p in local.values():
        if _counted_here(p, coords):
            t = p.to_local() if isinstance(p, DTensor) else p
            total += t.detach().double().sum()
    dist.all_reduce(total)
    if not compare_params:
        return float(total), None
    ref = dict(reference.named_parameters()) if reference is not None else {}
    worst = torch.zeros((), dtype=torch.float64, device=device)
    for name, shape in names:
        buf = ref[name].detach().float().clone() if name in ref else torch.empty(shape, device=device)
        dist.broadcast(buf, src=0)
        if name in local:
            p = local[name]
            full = p.full_tensor() if isinstance(p, DTensor) else p
            worst = torch.maximum(worst, (full.detach().double() - buf.double()).abs().max())
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return float(total), float(worst)

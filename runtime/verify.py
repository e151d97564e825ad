"""The single-process reference: the unpartitioned model trained on the same batches, and the comparison."""
from __future__ import annotations

import math

import torch

from costmodel.models import ModelSpec
from runtime.data import SyntheticTokens
from runtime.recipe import build_model, lm_loss, make_optimizer

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-3}


def reference_losses(spec: ModelSpec, data: SyntheticTokens, steps: int, seed: int, lr: float,
                     device: torch.device, optimizer: str = "adam") -> list[float]:
    """Full-batch training in one process: same init, batches and optimizer as the distributed run."""
    model = build_model(spec, seed).to(device)
    opt = make_optimizer(model.parameters(), lr, optimizer)
    losses = []
    for k in range(steps):
        inputs, targets = (t.to(device) for t in data.batch(k))
        opt.zero_grad(set_to_none=True)
        loss = lm_loss(model(inputs), targets)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def compare(losses: list[float], reference: list[float], tol: float) -> tuple[float, bool]:
    """(largest absolute difference, within tolerance). NaN/inf or unequal lengths never pass."""
    if len(losses) != len(reference) or not losses:
        return math.inf, False
    diffs = [abs(a - b) for a, b in zip(losses, reference)]
    if not all(math.isfinite(d) for d in diffs):  # max() would silently skip a NaN
        return math.inf, False
    diff = max(diffs)
    return diff, diff <= tol

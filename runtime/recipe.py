"""What is trained, shared by the distributed run and the single-process reference: init, loss, optimizer."""
from __future__ import annotations

from typing import Iterable

import torch
import torch.nn as nn
import torch.nn.functional as F

from costmodel.models import ModelSpec


def build_model(spec: ModelSpec, seed: int) -> nn.Module:
    """The model in fp32 on CPU, initialised identically on every rank (same seed, same RNG draws)."""
    torch.manual_seed(seed)
    return spec.build().float()


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every token of the batch."""
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())


OPTIMIZERS = ("adam", "sgd")
"""The plan's `train["optimizer"]` values, as costmodel.memory costs them."""


def make_optimizer(params: Iterable[torch.Tensor], lr: float, name: str = "adam") -> torch.optim.Optimizer:
    """"adam": AdamW without weight decay; "sgd": SGD without momentum (no optimizer state, as the planner
    costs it). foreach=False: DTensor and plain parameters may be mixed (TORCH-NOTES)."""
    if name == "adam":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0, foreach=False)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.0, foreach=False)
    raise ValueError(f"optimizer {name!r}; accepted: {list(OPTIMIZERS)}")

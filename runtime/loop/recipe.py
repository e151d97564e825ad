"""What is trained, shared by the distributed run and the single-process reference: init, loss, optimizer."""
from __future__ import annotations

import sys
from typing import Callable, Iterable

import torch
import torch.nn as nn
import torch.nn.functional as F

from partita.costmodel.models.losses import cross_entropy as fused_cross_entropy
from partita.costmodel.models import ModelSpec


def is_dtensor(t) -> bool:
    """Whether `t` is a DTensor, without importing DTensor (~1.5 s of a worker's start): none exists unless a
    plan's tensor or ZeRO-3 parallelism loaded it."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def build_model(spec: ModelSpec, seed: int) -> nn.Module:
    """The model in fp32 on CPU, initialised identically on every rank (same seed, same RNG draws)."""
    torch.manual_seed(seed)
    return spec.build().float()


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, fused: bool = False) -> torch.Tensor:
    """Mean cross-entropy over every token of the batch, as a plain tensor.

    `fused`: the model's `loss="fused"` (costmodel.models.losses): the same loss and gradient computed as a fused
    kernel would, keeping the logits rather than fp32 copies of them. The logits of a vocab-parallel head
    (runtime.parallel.tp) are a DTensor sharded on the vocabulary: inside `loss_parallel()`, which the executor
    enters around forward and backward, the cross-entropy is then computed on the shards (Megatron's
    vocab-parallel cross-entropy, whichever `fused` says) and the loss is a replicated DTensor, returned
    here as the plain tensor it equals on every tp rank."""
    if fused and not is_dtensor(logits):
        return fused_cross_entropy(logits.flatten(0, -2), targets.flatten())
    loss = F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())
    return loss.full_tensor() if is_dtensor(loss) else loss


def hf_causal_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """HuggingFace's causal-LM loss from the logits (its `ForCausalLMLoss` on unpadded labels): position t
    predicts token t + 1; the mean cross-entropy over the batch's (seq - 1) x batch predictions. A
    pipeline's last stage computes it (runtime.parallel.pp), as the model would with labels."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten())


LossFn = Callable[[nn.Module, tuple], torch.Tensor]


def loss_for(spec: ModelSpec) -> LossFn:
    """loss(module, batch) of a model (runtime.data says how its batches look): the spec's own
    `loss_fn(module, *batch)` (e.g. a HuggingFace model's loss), else `lm_loss(module(inputs), targets)`.
    Either is the mean over the batch's samples, so microbatch losses average to the batch's."""
    if spec.loss_fn is not None:
        fn = spec.loss_fn
        return lambda module, batch: fn(module, *batch)
    fused = spec.config.get("loss") == "fused"
    return lambda module, batch: lm_loss(module(batch[0]), batch[1], fused)


OPTIMIZERS = ("adam", "sgd")
"""The plan's `train["optimizer"]` values, as costmodel.price.memory costs them."""


def optimizer_class(name: str) -> tuple[type[torch.optim.Optimizer], dict]:
    """(class, keyword arguments but lr) of an optimizer: "adam": AdamW without weight decay; "sgd": SGD
    without momentum (no optimizer state, as the planner costs it). foreach=False: DTensor and plain
    parameters may be mixed (TORCH-NOTES)."""
    if name == "adam":
        return torch.optim.AdamW, {"weight_decay": 0.0, "foreach": False}
    if name == "sgd":
        return torch.optim.SGD, {"momentum": 0.0, "foreach": False}
    raise ValueError(f"optimizer {name!r}; accepted: {list(OPTIMIZERS)}")


def make_optimizer(params: Iterable[torch.Tensor], lr: float, name: str = "adam") -> torch.optim.Optimizer:
    """The optimizer `name` (`optimizer_class`) over `params`."""
    cls, kwargs = optimizer_class(name)
    return cls(params, lr=lr, **kwargs)

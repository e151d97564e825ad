"""What is trained, shared by the distributed run and the single-process reference: init, loss, optimizer, and the
training recipe around the optimizer step (`Recipe`: weight decay, learning-rate schedule, gradient clipping).

The schedule is torch's LambdaLR over one multiplier of the learning rate, `Recipe.lr_factor(i)` for the optimizer
step after i steps: a linear warm-up from lr / (warmup + 1) to lr over `warmup_steps` steps (nanoGPT's and
torchtitan's form), then `lr_decay` from lr at the first step after the warm-up to `min_lr_ratio` x lr at the last
step (cosine: half a cosine period; linear: a straight line; none: lr throughout). LambdaLR computes each step's lr
from the step number alone (lr x factor(step), never from the previous lr), so a run resumed at step k gets the lr
an uninterrupted run had there, to the bit (`make_schedule(opt, recipe, start=k)`); the checkpoint holds no
scheduler state, as it holds no lr (runtime.checkpoint).
"""
from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable

import torch
import torch.nn as nn
import torch.nn.functional as F

from partita.costmodel.models.losses import cross_entropy as fused_cross_entropy
from partita.costmodel.models import ModelSpec
from partita.runtime.loop import options


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


def param_groups(params: Iterable[torch.Tensor], weight_decay: float) -> list[torch.Tensor] | list[dict]:
    """`params` as the optimizer takes them: with weight decay, two groups -- matrices (ndim >= 2: linear and
    embedding weights) decayed, the rest (biases, norms' scales) not, as nanoGPT and torchtitan do; without,
    the plain list (one group, as ever). A DTensor's ndim is its global one, so every plan groups alike."""
    params = list(params)
    if not weight_decay:
        return params
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


def make_optimizer(params: Iterable[torch.Tensor], lr: float, name: str = "adam",
                   weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """The optimizer `name` (`optimizer_class`) over `params`, decaying the matrices by `weight_decay`
    (`param_groups`; AdamW's decoupled decay, SGD's L2 term -- the same update without momentum)."""
    cls, kwargs = optimizer_class(name)
    return cls(param_groups(params, weight_decay), lr=lr, **kwargs)


LR_DECAYS = options.LR_DECAYS
"""--lr-decay's values (module docstring)."""


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """How the optimizer steps, beside its kind (the plan's `train["optimizer"]`): the run's flags of the same names."""

    lr: float = 1e-3
    """The peak learning rate (after the warm-up)."""
    steps: int = 10
    """The run's last step: the decay reaches `min_lr_ratio` x lr there."""
    weight_decay: float = 0.0
    """Decoupled weight decay of the matrices (`param_groups`); 0: none."""
    warmup_steps: int = 0
    """Steps of linear warm-up; 0: none."""
    lr_decay: str = "none"
    """"none", "cosine" or "linear" (LR_DECAYS)."""
    min_lr_ratio: float = 0.1
    """The learning rate at the last step, as a fraction of `lr` (nanoGPT's min_lr = lr / 10)."""
    clip_grad_norm: float | None = None
    """Largest global L2 norm of the gradients (the whole model's, over every rank's shards and stages); None: no
    clipping."""

    def lr_factor(self, i: int) -> float:
        """The multiplier of lr for the optimizer step after `i` steps (LambdaLR's lambda)."""
        if i < self.warmup_steps:
            return (i + 1) / (self.warmup_steps + 1)
        if self.lr_decay == "none":
            return 1.0
        span = self.steps - 1 - self.warmup_steps
        progress = min(1.0, (i - self.warmup_steps) / span) if span > 0 else 1.0
        shape = 0.5 * (1.0 + math.cos(math.pi * progress)) if self.lr_decay == "cosine" else 1.0 - progress
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * shape

    @property
    def plain(self) -> bool:
        """One learning rate throughout: no decay of the weights or of the lr, no warm-up, no clipping."""
        return (not self.weight_decay and not self.warmup_steps and self.lr_decay == "none"
                and self.clip_grad_norm is None)

    def notes(self) -> list[str]:
        """What the run says before training about a recipe that may not be what was meant."""
        if self.warmup_steps < self.steps:
            return []
        decay = f"; --lr-decay {self.lr_decay} never starts" if self.lr_decay != "none" else ""
        return [f"note: --warmup-steps {self.warmup_steps} >= --steps {self.steps}: the learning rate rises over the "
                f"whole run{decay}"]

    def record(self) -> dict:
        """The recipe as a checkpoint's manifest keeps it (`changes_since` reads it back)."""
        return asdict(self)

    def changes_since(self, was: dict | None) -> list[str]:
        """What differs from the recipe a checkpoint recorded (`record`), as "lr 0.001 -> 0.0003"; --steps only
        where it moves the schedule (a decay ends at the last step). Empty for a checkpoint that recorded none."""
        if not isinstance(was, dict):
            return []
        now = self.record()
        decays = self.lr_decay != "none" or was.get("lr_decay", "none") != "none"
        keys = [k for k in now if k in was and (k != "steps" or decays) and was[k] != now[k]]
        return [f"{k.replace('_', '-')} {was[k]} -> {now[k]}" for k in keys]

    def describe(self, optimizer: str = "adam") -> str:
        """The recipe in one line, for the run's header."""
        parts = [f"{'AdamW' if optimizer == 'adam' else 'SGD'} lr {self.lr:g}"]
        if self.weight_decay:
            parts.append(f"weight decay {self.weight_decay:g} (matrices only)")
        if self.warmup_steps:
            parts.append(f"warm-up {self.warmup_steps} steps")
        if self.lr_decay != "none":
            parts.append(f"{self.lr_decay} decay to {self.min_lr_ratio:g} x lr at step {self.steps}")
        if self.clip_grad_norm is not None:
            parts.append(f"grad norm clipped at {self.clip_grad_norm:g}")
        return "recipe: " + ", ".join(parts)


def make_schedule(opt: torch.optim.Optimizer, recipe: Recipe, start: int = 0) -> torch.optim.lr_scheduler.LambdaLR:
    """The learning-rate schedule over `opt`, positioned for the step after `start` steps (a resumed run's): the
    param groups' lr is then recipe.lr x lr_factor(start). Call its `step()` after each optimizer step."""
    for group in opt.param_groups:
        group["lr"] = recipe.lr
        group.setdefault("initial_lr", recipe.lr)
    return torch.optim.lr_scheduler.LambdaLR(opt, recipe.lr_factor, last_epoch=start - 1)


@dataclass
class RecipeTrace:
    """What the recipe did at each step: the learning rate, and with clipping the gradients' norm before it."""

    learning_rates: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)


def current_lr(opt: torch.optim.Optimizer) -> float:
    """The learning rate the next optimizer step takes (every group has the same)."""
    return float(opt.param_groups[0]["lr"])


def recipe_of(opts: "options.RunOptions") -> Recipe:
    """The run's training recipe, from its options (runtime.loop.options)."""
    return Recipe(lr=opts.lr, steps=opts.steps, weight_decay=opts.weight_decay, warmup_steps=opts.warmup_steps,
                  lr_decay=opts.lr_decay, min_lr_ratio=opts.min_lr_ratio, clip_grad_norm=opts.clip_grad_norm)

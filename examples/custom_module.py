"""Your own nn.Module, planned by import path: `build()` returns (module, example inputs).

    # from the repository root: partita imports `package.module:factory` from the working directory,
    # as `python -m` would: nothing to set
    partita plan --model examples.custom_module:build --cluster 8xA100-80GB --global-batch 256
    python examples/custom_module.py                   # the same from the Python API

The contract (costmodel/models/__init__.py, `package.module:factory`; README "Train your own model on your
own data"): `build()` takes no arguments and returns `(module, example_inputs)` -- or `(module, example_inputs,
loss_fn)` to train with your loss, as examples/image_classifier.py does --, `example_inputs` a tuple of tensors
with a batch dimension of 1 first;
the planner expands that dimension to each micro-batch size it considers. `build()` is called more than
once and under fake tensors, so keep it cheap and free of side effects. The planner finds the repeated
layers by module path (here `blocks.0` ... `blocks.11`) and splits them over pipeline stages and tensor
parallel ranks; the module's own forward is costed as is, so what it returns is what is differentiated.
"""
from __future__ import annotations

import torch
import torch.nn as nn


class MixerBlock(nn.Module):
    """Pre-norm residual MLP over the features of each token."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class TokenMLP(nn.Module):
    """Embed features, run a stack of identical blocks, classify each token."""

    def __init__(self, features: int = 64, dim: int = 1024, hidden: int = 4096, depth: int = 12, classes: int = 10):
        super().__init__()
        self.embed = nn.Linear(features, dim)
        self.blocks = nn.ModuleList(MixerBlock(dim, hidden) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)).logsumexp(-1).mean()  # a scalar to differentiate


TOKENS, FEATURES = 256, 64


def build() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The factory `partita plan --model examples.custom_module:build` calls."""
    return TokenMLP(features=FEATURES), (torch.randn(1, TOKENS, FEATURES),)


def main() -> int:
    import partita

    module, inputs = build()
    plan = partita.plan(module, inputs, cluster="8xA100-80GB", train=partita.TrainConfig(global_batch=256))
    print(plan.explain())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

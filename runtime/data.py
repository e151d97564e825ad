"""Synthetic token batches whose order depends only on (seed, step, global batch size).

The global batch of step k is `spec.tokens(global_batch, Generator().manual_seed(seed * 1_000_003 + k))`
(k counts from 0); inputs are tokens[:, :-1], targets tokens[:, 1:]. A data-parallel rank takes its
contiguous slice of the global batch and microbatches are contiguous slices of that, so neither the
world size nor the plan changes which sample is trained on at which step.
"""
from __future__ import annotations

import torch

from costmodel.models import ModelSpec


class SyntheticTokens:
    def __init__(self, spec: ModelSpec, global_batch: int, seed: int = 0):
        if spec.vocab is None or spec.seq_len is None:
            raise ValueError(f"model {spec.name!r} has no vocab/seq_len, so synthetic tokens cannot be made")
        self.spec, self.global_batch, self.seed = spec, global_batch, seed

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of the whole global batch at `step`, each [global_batch, seq_len]."""
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        tokens = self.spec.tokens(self.global_batch, gen)
        return tokens[:, :-1], tokens[:, 1:]

    def shard(self, step: int, dp_rank: int, dp: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The contiguous slice of the global batch that data-parallel rank `dp_rank` of `dp` trains on."""
        if self.global_batch % dp:
            raise ValueError(f"global batch {self.global_batch} is not divisible by dp={dp}")
        n = self.global_batch // dp
        inputs, targets = self.batch(step)
        return inputs[dp_rank * n:(dp_rank + 1) * n], targets[dp_rank * n:(dp_rank + 1) * n]


def microbatches(t: torch.Tensor, n: int) -> list[torch.Tensor]:
    """`n` contiguous, equal slices along dim 0 (the same split torch.distributed.pipelining makes)."""
    if t.size(0) % n:
        raise ValueError(f"batch of {t.size(0)} is not divisible into {n} microbatches")
    return list(t.tensor_split(n))


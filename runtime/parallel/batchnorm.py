"""BatchNorm under data parallelism: said up front, and synchronised on request (`--sync-batchnorm`).

In training, BatchNorm normalises by the mean and variance of the samples it sees. A data-parallel rank sees
its slice of the batch (and a micro-batch of that under gradient accumulation), so a data-parallel run does
not train as one process on the whole batch: its losses differ by more than rounding, and --verify fails a
correct plan. `note` says so before training, as runtime.loop.session does for dropout.

`--sync-batchnorm` replaces every BatchNorm{1,2,3}d by `SyncedBatchNorm`: the per-channel sum, sum of squares
and count are summed over the data-parallel group (an autograd-aware all-reduce), so each rank normalises by
the statistics of the whole data-parallel batch -- torch.nn.SyncBatchNorm's computation (Ioffe & Szegedy
2015, algorithm 1, over the union of the ranks' samples). torch's own SyncBatchNorm runs on GPUs only; this
one runs on gloo and NCCL alike. The gradient flows through the all-reduce (its backward sums the
statistics' gradients over the group), so with DDP's averaging every rank's parameter gradient equals the
one-process gradient. Running statistics are updated with the unbiased variance, as BatchNorm does. Module
and parameter names are unchanged (checkpoints, the plan's FQNs).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm


def batchnorm_layers(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, _BatchNorm)]


def note(model: nn.Module, dp: int, num_microbatches: int, synced: bool) -> str | None:
    """One line when BatchNorm makes this layout train differently from one process; None otherwise."""
    layers = batchnorm_layers(model)
    if not layers or (dp == 1 and num_microbatches == 1) or (synced and num_microbatches == 1):
        return None
    where = []
    if dp > 1 and not synced:
        where.append(f"each of the {dp} data-parallel ranks over its own samples")
    if num_microbatches > 1:
        where.append(f"each of {num_microbatches} micro-batches over its own samples")
    fix = ("; --sync-batchnorm normalises over the whole data-parallel batch (SyncBatchNorm)" if dp > 1 and not synced
           else "")
    if num_microbatches > 1:
        fix += "; a plan with one micro-batch per rank (partita plan --micro-batch = global batch / dp) avoids it"
    return (f"note: the model has BatchNorm ({len(layers)} layers), which normalises {' and '.join(where)}, not over "
            f"the whole batch as one process does: the run differs from one process and --verify can fail on a "
            f"correct plan{fix}")


class _SumOverGroup(torch.autograd.Function):
    """all_reduce(SUM) with a gradient: the gradient of a sum over the group's ranks is the sum over them of
    the gradients (what torch.distributed.nn.functional.all_reduce does, which torch deprecates)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _SumOverGroup.apply(grad.contiguous(), ctx.group), None


class SyncedBatchNorm(_BatchNorm):
    """BatchNorm whose training statistics are those of the whole group's batch (module docstring)."""

    group = None

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2-D input, got {input.dim()}-D")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.group is None or dist.get_world_size(self.group) == 1:
            return super().forward(x)
        dims, c = [0] + list(range(2, x.dim())), x.size(1)
        shape = [1, c] + [1] * (x.dim() - 2)
        count = torch.full((1,), x.numel() / c, dtype=x.dtype, device=x.device)
        sums = _SumOverGroup.apply(torch.cat([x.sum(dims), count]), self.group)
        n = sums[-1]
        mean = sums[:c] / n
        centred = x - mean.view(shape)  # two passes, as BatchNorm computes the variance (no E[x^2] - E[x]^2)
        var = _SumOverGroup.apply(centred.square().sum(dims), self.group) / n
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                m = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
                self.running_mean.mul_(1 - m).add_(m * mean.detach())
                self.running_var.mul_(1 - m).add_(m * var.detach() * n / (n - 1))
        # one per-channel scale, so the backward keeps one activation-sized tensor (centred), as BatchNorm keeps its
        # input: (centred * invstd) * weight saved the normalised activation besides (measured: +1 activation per
        # layer, the example CNN's peak 9.25 MiB against 6.75 MiB unsynchronised at 32 samples per rank)
        scale = torch.rsqrt(var + self.eps)
        if self.affine:
            scale = scale * self.weight
        y = centred * scale.view(shape)
        return y + self.bias.view(shape) if self.affine else y


def synchronise(model: nn.Module, group) -> int:
    """Every BatchNorm of `model` becomes a SyncedBatchNorm over `group`, in place (the same parameters and
    buffers); returns how many."""
    done = 0
    for m in model.modules():
        if isinstance(m, _BatchNorm) and not isinstance(m, SyncedBatchNorm):
            m.__class__ = SyncedBatchNorm
            m.group = group
            done += 1
    return done

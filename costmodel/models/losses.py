"""Token cross-entropy as a fused kernel: what autograd keeps is the logits, not fp32 copies of them.

A model's loss is part of its cost (costmodel.capture.trace captures it), and for a language model its memory is
often the largest single activation: batch x seq x vocab logits.

- `loss="plain"` (the default; eager PyTorch, torchtitan): `F.cross_entropy(logits.float(), targets)`.
  The forward makes an fp32 copy of the logits and an fp32 log-softmax, which autograd keeps (4 bytes per
  logit); the backward makes two more fp32 tensors of that size before casting the gradient back.
- `loss="fused"` (llm-foundry's MPT default `loss_fn: fused_crossentropy`, flash-attn's xentropy kernel;
  Liger's fused cross-entropy): one kernel computes a log-sum-exp per row and the loss, keeps the logits
  themselves (2 bytes per bf16 logit) and the per-row log-sum-exp, and writes the logits' gradient
  directly in the backward.

`cross_entropy` here is that fused computation, written in PyTorch over chunks of rows so that no fp32
copy of more than `CHUNK_ELEMENTS` logits exists at a time: numerically the same loss and gradient as
`F.cross_entropy` (tests/costmodel/test_losses.py), with the fused kernel's memory. Capture records it as
one node (costmodel.capture.trace wraps it for torch.fx), priced as a memory-bound pass over the logits. The
runtime trains with it too (runtime.loop.recipe.lm_loss), except for vocabulary-parallel logits (a DTensor),
whose loss is PyTorch's `loss_parallel` cross-entropy.
"""
from __future__ import annotations

import torch

LOSSES = ("plain", "fused")
CHUNK_ELEMENTS = 1 << 26
"""Logits converted to fp32 at a time (256 MiB): the fused kernel's working set, not the whole tensor."""


class _FusedCrossEntropy(torch.autograd.Function):
    """mean over rows of logsumexp(x_i) - x_i[t_i]; grad = (softmax(x_i) - onehot(t_i)) / rows."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        rows, vocab = logits.shape
        step = max(1, CHUNK_ELEMENTS // max(vocab, 1))
        lse = torch.empty(rows, dtype=torch.float32, device=logits.device)
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        for i in range(0, rows, step):
            x = logits[i:i + step].float()
            lse[i:i + step] = torch.logsumexp(x, dim=-1)
            picked = x.gather(1, targets[i:i + step, None]).squeeze(1)
            total = total + (lse[i:i + step] - picked).sum()
        ctx.save_for_backward(logits, targets, lse)
        return total / rows

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, targets, lse = ctx.saved_tensors
        rows, vocab = logits.shape
        step = max(1, CHUNK_ELEMENTS // max(vocab, 1))
        out = torch.empty_like(logits)
        scale = grad.float() / rows
        for i in range(0, rows, step):
            p = torch.exp(logits[i:i + step].float() - lse[i:i + step, None])
            p.scatter_add_(1, targets[i:i + step, None], torch.full_like(p[:, :1], -1.0))
            out[i:i + step] = (p * scale).to(out.dtype)
        return out, None


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy of `logits` (rows x vocab, any float dtype) against `targets` (rows),
    computed as a fused kernel would (module docstring)."""
    return _FusedCrossEntropy.apply(logits, targets)

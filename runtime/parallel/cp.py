"""Context parallelism (cp): every sequence of a rank's micro-batches split over the cp ranks of its dp group.

The all-gather-K/V form Llama 3 trained with (Dubey et al. 2024, arXiv 2407.21783 §3.3.2), for partita's
own GPT / Llama models (costmodel/models/gpt.py):

- Sequence split with causal load balancing (runtime.data.context_positions): the inputs and the already
  shifted targets are cut into 2 x cp chunks along the sequence; cp rank r keeps chunks r and 2cp-1-r, so
  every rank holds as many early (cheap) as late (expensive) queries. The model is told the global positions
  of those tokens (`GPT.positions`: rotary angles or learned position embeddings at the right places).
- Attention (`ContextParallel.attend`, installed as `Attention.context`): each rank computes q, k, v for its
  own tokens, all-gathers k and v over the cp group (`gather_sequence`: its backward reduce-scatters the
  k/v gradients, summed over the ranks whose queries used them), puts them in global order, and attends
  with the causal mask of the global positions (query position >= key position). sdpa and math attention,
  grouped-query attention (k, v gathered with their kv heads, expanded as the model does).
- Gradients: parameters are replicated over cp. Each rank's loss is the mean over its own tokens (all ranks
  hold equally many), so the mean over dp x cp of the ranks' gradients is the gradient of the global mean
  loss: DDP, the hand average and FSDP2 (zero_stage 2/3) all run over the flattened dp x cp mesh
  (`replica_mesh`), and the loss reported is the mean over dp x cp of the ranks' losses.

What it composes with: dp, tp (colwise/rowwise heads: each tp rank gathers the k/v of its own heads over
cp; sequence parallelism and vocab-parallel embedding/head run on the rank's cp share of the sequence),
zero_stage 0/2/3 (FSDP2 over dp x cp, 2-D with tp), gradient accumulation, recompute, offload. Pipeline
and expert parallelism with cp > 1 are refused by the pre-flight check (`check_plan`), as are models other
than partita's GPT / Llama (their attention is not ours to replace). A pipeline traces its stages
(runtime.parallel.pp) from the model's default path, where neither the gathered attention nor the positions are.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh

from partita.costmodel.models import ModelSpec
from partita.costmodel.models.gpt import GPT, Attention, scaled_masked_softmax
from partita.planner.plan.executable import composition_refusal
from partita.planner.plan import Plan, PlanError
from partita.runtime.data import context_positions, context_shard
from partita.runtime.launcher.mesh import Topology


class _GatherSequence(torch.autograd.Function):
    """All-gather along dim 0 over `group`; backward: reduce-scatter (sum) of the gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group, size: int) -> torch.Tensor:
        ctx.group, ctx.size = group, size
        x = x.contiguous()
        out = x.new_empty((size * x.size(0), *x.shape[1:]))
        dist.all_gather_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        out = grad.new_empty((grad.size(0) // ctx.size, *grad.shape[1:]))
        dist.reduce_scatter_single(out, grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return out, None, None


def gather_sequence(x: torch.Tensor, group, size: int, dim: int) -> torch.Tensor:
    """The `size` ranks' `x` concatenated along `dim`, in rank order (autograd-aware)."""
    return _GatherSequence.apply(x.movedim(dim, 0), group, size).movedim(0, dim)


class ContextParallel:
    """This rank's share of context parallelism: its token positions, the k/v gather and the causal mask."""

    def __init__(self, seq: int, cp: int, cp_rank: int, group, device: torch.device, model: GPT | None = None):
        self.cp, self.cp_rank, self.group, self.device, self.model = cp, cp_rank, group, device, model
        self.configure(seq)

    def configure(self, seq: int) -> None:
        """Positions, key order and mask for sequences of `seq` tokens; the model is given the positions."""
        self.seq, device = seq, self.device
        self.positions = context_positions(seq, self.cp, self.cp_rank).to(device)
        gathered = torch.cat([context_positions(seq, self.cp, r) for r in range(self.cp)])
        self.order = torch.argsort(gathered).to(device)
        """Indices putting the gathered keys (rank order) into global sequence order."""
        self.allowed = self.positions[:, None] >= torch.arange(seq, device=device)[None, :]
        """[local queries, seq keys]: True where a query may attend to a key (causal, global positions)."""
        if self.model is not None:
            self.model.positions = self.positions

    def shard(self, batch: tuple) -> tuple:
        """This rank's tokens of every sequence of a [batch, seq] token batch (runtime.data.context_shard);
        sequences of another length than the last ones reconfigure the positions and the mask."""
        if batch[0].size(1) != self.seq:
            self.configure(batch[0].size(1))
        return context_shard(batch, self.cp, self.cp_rank)

    def gather_kv(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v [b, heads, local s, d] of every cp rank, in global order along the sequence: [b, heads, seq, d]."""
        kv = gather_sequence(torch.stack((k, v)), self.group, self.cp, dim=3)
        kv = kv.index_select(3, self.order)
        return kv[0], kv[1]

    def attend(self, attn: Attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of this rank's queries over the whole sequence: [b, heads, local s, d]."""
        k, v = self.gather_kv(k, v)
        p = attn.p if attn.training else 0.0
        if not attn.math:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self.allowed, dropout_p=p, enable_gqa=attn.gqa)
        if attn.gqa:
            rep = q.size(1) // k.size(1)
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = torch.matmul(q, k.transpose(-2, -1))
        probs = scaled_masked_softmax(scores, ~self.allowed, 1.0 / math.sqrt(attn.head_dim))
        return torch.matmul(F.dropout(probs, p, attn.training), v)


def install(model: nn.Module, topo: Topology) -> ContextParallel | None:
    """Set up context parallelism on `model` (a GPT, which check_plan has made sure of) for this rank: its
    token positions and its attention modules' context. None when cp == 1."""
    if topo.cp == 1:
        return None
    ctx = ContextParallel(model.cfg.seq, topo.cp, topo.cp_rank, topo.group("cp"), topo.device, model)
    for m in model.modules():
        if isinstance(m, Attention):
            m.context = ctx
    return ctx


def replica_mesh(topo: Topology) -> DeviceMesh:
    """The ranks holding the same parameters, over which gradients are averaged: the dp axis, or with
    cp > 1 the dp x cp axes flattened ("dp_cp", created once per mesh)."""
    if topo.cp == 1:
        return topo.mesh["dp"]
    return topo.mesh["dp", "cp"]._flatten("dp_cp")


def check_plan(plan: Plan, spec: ModelSpec, model: nn.Module) -> None:
    """Pre-flight: PlanError (one line) for a cp > 1 plan this runtime does not execute."""
    m = plan.mesh
    if m.cp == 1:
        return
    if not isinstance(model, GPT) or spec.loss_fn is not None:
        raise PlanError(f"context parallelism (cp={m.cp}) runs for partita's GPT and Llama models (presets such as "
                        f"tiny-gpt and tiny-llama, gpt:... and llama:... families); --model {spec.name} is not one")
    why = composition_refusal(m.pp, m.tp, m.cp, m.ep)
    if why or len(plan.stages) > 1:
        raise PlanError(why or f"context parallelism (cp={m.cp}) with pipeline stages is not run by partita's runtime")
    seq = spec.seq_len or plan.train.get("seq_len") or 0
    if seq % (2 * m.cp):
        raise PlanError(f"context parallelism cuts each sequence into 2 x cp = {2 * m.cp} chunks, which do not "
                        f"divide the {seq} tokens of --model {spec.name}")

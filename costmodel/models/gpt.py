"""A GPT / Llama decoder written to be traced and parallelised without changes.

One class covers both families: GPT (LayerNorm, GELU MLP, learned positions, biases) and Llama
(RMSNorm, SwiGLU MLP, rotary positions, grouped-query attention, no biases). Choices that matter for
parallelism:

- q, k, v are separate Linear layers, so a column-parallel split of each keeps whole heads on a rank;
  head counts are read from tensor shapes (`view(b, s, -1, head_dim)`), so the same forward runs on a
  tensor-parallel shard that holds only its rank's heads.
- Input and output embeddings are not tied (a pipeline puts them on different stages). Megatron ties
  them; the difference is V*h parameters and changes no FLOP count.
- No dropout by default, so distributed and single-process runs are numerically comparable.
- `attention="sdpa"` (fused, flash-style: the s x s scores are never stored) or `"math"`, the explicit
  softmax(q k^T / sqrt(d)) v with its scores, softmax and dropout materialised, the scale, mask and
  softmax in one fused kernel (`scaled_masked_softmax`) -- what Megatron-LM ran
  in 2021 (Narayanan et al. SC'21; Korthikanti et al.'s 5 a s / h activation term), used by the
  megatron-* presets so that predictions of the published runs model the published implementation.
- Sizes are read with `x.size(i)`, which torch.fx symbolic_trace can record.
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from partita.costmodel.models.configs import GPTConfig

_RANDOM_INITS = ("kaiming_uniform_", "uniform_", "normal_")
"""The torch.nn.init functions nn.Linear and nn.Embedding draw their default weights and biases with."""


def _untouched(tensor, *args, **kwargs):
    return tensor


@contextlib.contextmanager
def _drawn_once():
    """Within: torch.nn.init's random initialisers (_RANDOM_INITS) leave their tensor as it is, so the Linear and
    Embedding layers GPT builds do not draw weights that GPT.reset_parameters draws again right after (it draws
    every weight and zeroes every bias; LayerNorm's ones and zeros are not random and stay). The first draw was a
    quarter to half of building a model on the host (a 1.5B model: 9.1 s -> 6.7 s on 2 cores)."""
    kept = {name: getattr(nn.init, name) for name in _RANDOM_INITS}
    for name in _RANDOM_INITS:
        setattr(nn.init, name, _untouched)
    try:
        yield
    finally:
        for name, fn in kept.items():
            setattr(nn.init, name, fn)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    context = None
    """None: causal attention over the tokens forward receives. Under context parallelism the runtime sets
    an object whose `attend(attn, q, k, v)` attends over the whole sequence (runtime/parallel/cp.py)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        bias = cfg.family == "gpt"
        self.head_dim = cfg.head_dim
        self.gqa = cfg.kv_heads != cfg.heads
        kv_dim = cfg.kv_heads * cfg.head_dim
        self.q = nn.Linear(cfg.hidden, cfg.hidden, bias=bias)
        self.k = nn.Linear(cfg.hidden, kv_dim, bias=bias)
        self.v = nn.Linear(cfg.hidden, kv_dim, bias=bias)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden, bias=bias)
        self.math = cfg.attention == "math"
        self.p = cfg.dropout
        if self.math:
            future = torch.ones(cfg.seq, cfg.seq, dtype=torch.bool).triu(1)  # True where masked out
            self.register_buffer("future", future, persistent=False)

    def forward(self, x, cos=None, sin=None):
        b, s = x.size(0), x.size(1)
        q = self.q(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        if cos is not None:
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
        if self.context is not None:
            y = self.context.attend(self, q, k, v)
        elif self.math:
            y = self._math_attention(q, k, v, s)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.gqa,
                                               dropout_p=self.p if self.training else 0.0)
        return F.dropout(self.proj(y.transpose(1, 2).reshape(b, s, -1)), self.p, self.training)

    def _math_attention(self, q, k, v, s):
        if self.gqa:
            rep = q.size(1) // k.size(1)
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = torch.matmul(q, k.transpose(-2, -1))
        probs = scaled_masked_softmax(scores, self.future.narrow(0, 0, s).narrow(1, 0, s), 1.0 / math.sqrt(self.head_dim))
        return torch.matmul(F.dropout(probs, self.p, self.training), v)


def scaled_masked_softmax(scores, mask, scale: float):
    """softmax(scores * scale) with the positions where `mask` is True set to -inf, along the last dim.

    Megatron-LM runs this as one kernel (FusedScaleMaskSoftmax: read the scores, write the
    probabilities); wrapped as one fx node (torch.fx.wrap below), so the cost model prices its memory
    traffic once, as that kernel moves it. Eager PyTorch runs the three operators, same numbers."""
    return F.softmax(scores.mul(scale).masked_fill(mask, float("-inf")), dim=-1)


torch.fx.wrap("scaled_masked_softmax")


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.swiglu = cfg.family == "llama"
        self.p = cfg.dropout
        bias = not self.swiglu
        self.fc1 = nn.Linear(cfg.hidden, cfg.ffn, bias=bias)
        if self.swiglu:
            self.gate = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.fc2 = nn.Linear(cfg.ffn, cfg.hidden, bias=bias)

    def forward(self, x):
        if self.swiglu:
            return F.dropout(self.fc2(F.silu(self.gate(x)) * self.fc1(x)), self.p, self.training)
        return F.dropout(self.fc2(F.gelu(self.fc1(x), approximate="tanh")), self.p, self.training)


@torch.library.custom_op("partita::grouped_mm", mutates_args=())
def _grouped_mm(rows: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    out = rows.new_zeros(rows.size(0), weight.size(2))
    start = 0
    for g, end in enumerate(offs.tolist()):  # one product per group: exact in any dtype, on any device
        if end > start:
            torch.mm(rows[start:end], weight[g], out=out[start:end])
        start = end
    return out


@_grouped_mm.register_fake
def _(rows, weight, offs):
    return rows.new_empty(rows.size(0), weight.size(2))


@torch.library.custom_op("partita::grouped_mm_backward", mutates_args=())
def _grouped_mm_backward(rows: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor,
                         grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    grad_rows, grad_weight = torch.zeros_like(rows), torch.zeros_like(weight)
    start = 0
    for g, end in enumerate(offs.tolist()):
        if end > start:
            torch.mm(grad[start:end], weight[g].T, out=grad_rows[start:end])
            torch.mm(rows[start:end].T, grad[start:end], out=grad_weight[g])
        start = end
    return grad_rows, grad_weight


@_grouped_mm_backward.register_fake
def _(rows, weight, offs, grad):
    return torch.empty_like(rows), torch.empty_like(weight)


def _grouped_mm_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.offs = inputs[2]


def _grouped_mm_grad(ctx, grad):
    rows, weight = ctx.saved_tensors
    grad_rows, grad_weight = torch.ops.partita.grouped_mm_backward(rows, weight, ctx.offs, grad.contiguous())
    return grad_rows, grad_weight, None


_grouped_mm.register_autograd(_grouped_mm_grad, setup_context=_grouped_mm_setup)


def grouped_mm(rows, weight, offs):
    """rows [S, K] sorted by group, weight [G, K, N], offs [G] (cumulative row ends, int32) -> [S, N]: group g
    multiplies its rows by weight[g] (as torch._grouped_mm, whose CPU and fake kernels want bf16 or aligned
    shapes). One fx node (torch.fx.wrap below) of kind "grouped_mm" running one custom op,
    `partita::grouped_mm`, which the cost model prices as the routed rows (tokens x k) through one expert
    each (costmodel.price.flops), its backward as two such products."""
    return torch.ops.partita.grouped_mm(rows.to(weight.dtype), weight, offs)


grouped_mm.custom_op = torch.ops.partita.grouped_mm.default
"""The one operator this function runs: costmodel.capture.trace reads which of its operands need gradients there."""
torch.fx.wrap("grouped_mm")


class MoEExperts(nn.Module):
    """`num_experts` SwiGLU experts stored as HuggingFace's MixtralExperts stores them -- gate_up_proj
    [E, 2 ffn, hidden] (gate rows first), down_proj [E, hidden, ffn] -- with its forward signature
    (hidden_states [T, h], top_k_index [T, k], top_k_weights [T, k]) -> [T, h], so expert parallelism
    (runtime/parallel/ep.py) treats both alike. The routed rows are sorted by expert and run as two grouped GEMMs:
    static shapes, which symbolic_trace and fake tensors follow."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.num_experts = cfg.experts
        self.gate_up_proj = nn.Parameter(torch.empty(cfg.experts, 2 * cfg.ffn, cfg.hidden))
        self.down_proj = nn.Parameter(torch.empty(cfg.experts, cfg.hidden, cfg.ffn))

    def forward(self, hidden_states, top_k_index, top_k_weights):
        k = top_k_index.size(-1)
        ids, perm = torch.sort(top_k_index.reshape(-1))
        token = perm // k
        counts = torch.histc(ids.float(), bins=self.num_experts, min=0, max=self.num_experts - 1)
        offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
        gate, up = grouped_mm(hidden_states[token], self.gate_up_proj.transpose(1, 2), offs).chunk(2, dim=-1)
        out = grouped_mm(F.silu(gate) * up, self.down_proj.transpose(1, 2), offs)
        out = out * top_k_weights.reshape(-1)[perm].unsqueeze(-1)
        return torch.zeros_like(hidden_states).index_add(0, token, out)


class MoE(nn.Module):
    """Mixture-of-experts MLP, as Mixtral's: a router Linear(h, E), softmax over the experts, each token through
    its top k experts weighted by their renormalised probabilities."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.top_k, self.p = cfg.top_k, cfg.dropout
        self.router = nn.Linear(cfg.hidden, cfg.experts, bias=False)
        self.experts = MoEExperts(cfg)

    def forward(self, x):
        flat = x.reshape(-1, x.size(-1))
        probs = F.softmax(self.router(flat).float(), dim=-1)
        weights, index = torch.topk(probs, self.top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        return F.dropout(self.experts(flat, index, weights).view_as(x), self.p, self.training)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        norm = (lambda: RMSNorm(cfg.hidden)) if cfg.family == "llama" else (lambda: nn.LayerNorm(cfg.hidden))
        self.ln1 = norm()
        self.attn = Attention(cfg)
        self.ln2 = norm()
        self.mlp = MoE(cfg) if cfg.experts else MLP(cfg)

    def forward(self, x, cos=None, sin=None):
        x = x + self.attn(self.ln1(x), cos, sin)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Decoder-only transformer. forward(tokens[b, s]) -> logits[b, s, vocab]."""

    positions = None
    """None: the tokens forward receives are at positions 0..s-1. Under context parallelism the runtime sets
    the global positions of this rank's tokens (a LongTensor of s; runtime/parallel/cp.py)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.rope = cfg.family == "llama"
        with _drawn_once():  # reset_parameters draws every weight: the layers need not draw them first
            self.tok_emb = nn.Embedding(cfg.vocab, cfg.hidden)
            if self.rope:
                inv = 1.0 / (10000 ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim))
                ang = torch.outer(torch.arange(cfg.seq, dtype=torch.float32), inv)
                ang = torch.cat((ang, ang), dim=-1)
                dtype = torch.get_default_dtype()  # the model's dtype, so q * cos does not promote
                self.register_buffer("rope_cos", ang.cos().to(dtype), persistent=False)
                self.register_buffer("rope_sin", ang.sin().to(dtype), persistent=False)
            else:
                self.pos_emb = nn.Embedding(cfg.seq, cfg.hidden)
            self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
            self.ln_f = RMSNorm(cfg.hidden) if self.rope else nn.LayerNorm(cfg.hidden)
            self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        self.reset_parameters()

    def reset_parameters(self):
        """GPT-2 style init: N(0, 0.02), output projections scaled by 1/sqrt(2 * layers)."""
        if self.tok_emb.weight.is_meta:
            return
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * self.cfg.layers) if name.endswith(("proj.weight", "fc2.weight", "down_proj")) else 0.02
                nn.init.normal_(p, mean=0.0, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens):
        s = tokens.size(1)
        x = self.tok_emb(tokens)
        if self.rope:
            if self.positions is None:
                cos, sin = self.rope_cos.narrow(0, 0, s), self.rope_sin.narrow(0, 0, s)
            else:
                cos, sin = self.rope_cos[self.positions], self.rope_sin[self.positions]
            for block in self.blocks:
                x = block(x, cos, sin)
        else:
            pos = torch.arange(s, device=tokens.device) if self.positions is None else self.positions
            x = x + self.pos_emb(pos)
            for block in self.blocks:
                x = block(x)
        return self.head(self.ln_f(x))

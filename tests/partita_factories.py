"""A user's own model as `package.module:factory` MODEL strings (DESIGN.md), for tests: plain PyTorch, no partita code.

    partita plan --model partita_factories:token_lm ...      # with tests/ on sys.path (or as the working directory)

Token models (ids [batch, seq] -> logits [batch, seq, vocab]): `token_lm` states its vocabulary in a `vocab_size`
attribute and has an LM head nn.Linear; `tied_lm` reuses the embedding's weight as its head (no LM head
nn.Linear to read the vocabulary from) and states it in `model.config.vocab_size`, as HuggingFace-style models
do; `tied_lm_without_vocab` is the same model stating it nowhere.
"""
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, SEQ, HIDDEN = 96, 16, 32


class Block(nn.Module):
    """A pre-norm residual MLP block."""

    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class TokenLM(nn.Module):
    def __init__(self, vocab_size: int = VOCAB, hidden: int = HIDDEN, layers: int = 2):
        super().__init__()
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, hidden)
        self.layers = nn.ModuleList(Block(hidden) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab_size, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def token_lm():
    return TokenLM(), (torch.zeros(2, SEQ, dtype=torch.long),)


class TiedLM(nn.Module):
    def __init__(self, vocab: int = VOCAB, hidden: int = HIDDEN):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.block = Block(hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.block(self.embed(ids)) @ self.embed.weight.t()


def tied_lm():
    model = TiedLM()
    model.config = SimpleNamespace(vocab_size=VOCAB)
    return model, (torch.zeros(2, SEQ, dtype=torch.long),)


def tied_lm_without_vocab():
    return TiedLM(), (torch.zeros(2, SEQ, dtype=torch.long),)


class ShiftedLM(TokenLM):
    """TokenLM plus one learned offset added to every logit. Cross-entropy is blind to a shift of all logits,
    so the offset's true gradient is exactly zero: what backward computes for it is rounding noise, which
    Adam scales into full-size steps of random sign (issue 30 item 5: --verify must not call that a bug)."""

    def __init__(self):
        super().__init__(hidden=64)
        self.shift = nn.Parameter(torch.zeros(1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(ids) * 8.0 + self.shift


def shifted_lm():
    return ShiftedLM(), (torch.zeros(2, SEQ, dtype=torch.long),)


def batchnorm_mlp():
    """A tabular MLP with BatchNorm1d after a Linear (#46 item 2): one value per channel per sample, which
    training refuses on one sample and the one-sample capture used to fail on."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 4))
    return model, (torch.randn(1, 16), torch.randint(0, 4, (1,))), lambda m, x, y: F.cross_entropy(m(x), y)

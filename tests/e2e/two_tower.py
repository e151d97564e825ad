"""A user's own token model for the pipeline tests (tests/e2e/test_pipeline_tied_and_own_loss.py): two towers
of blocks read the same token embeddings, their outputs are summed, and the LM head is tied to the token
embedding (`head.weight = tok_emb.weight`), as GPT-2 and Megatron do.

    partita plan --model two_tower:factory ...   (with tests/e2e on sys.path)
"""
import torch
import torch.nn as nn

VOCAB, SEQ, HIDDEN = 96, 16, 32


class Block(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 2 * hidden)
        self.fc2 = nn.Linear(2 * hidden, hidden)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class TwoTower(nn.Module):
    def __init__(self, vocab: int = VOCAB, hidden: int = HIDDEN, depth: int = 2):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, hidden)
        self.left = nn.Sequential(*(Block(hidden) for _ in range(depth)))
        self.right = nn.Sequential(*(Block(hidden) for _ in range(depth)))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)
        self.head.weight = self.tok_emb.weight  # tied

    def forward(self, tokens):
        x = self.tok_emb(tokens)
        return self.head(self.norm(self.left(x) + self.right(x)))


def factory():
    return TwoTower(), (torch.randint(0, VOCAB, (2, SEQ)),)

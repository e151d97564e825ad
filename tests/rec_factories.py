"""A user's own recommendation model as a `module:factory` MODEL string, for tests: plain PyTorch, no partita
code. Two nn.EmbeddingBag tables (users, items) whose pooled vectors join the dense features in an MLP.

    partita plan --model rec_factories:two_tables ...      # with tests/ on sys.path
"""
import torch
import torch.nn as nn

DENSE, DIM, POOLING = 4, 16, 3


class TwoTables(nn.Module):
    def __init__(self, users: int = 1000, items: int = 500):
        super().__init__()
        self.users = nn.EmbeddingBag(users, DIM, mode="sum")
        self.items = nn.EmbeddingBag(items, DIM, mode="sum")
        self.mlp = nn.Sequential(nn.Linear(DENSE + 2 * DIM, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        pooled = [self.users(ids[:, 0, :]), self.items(ids[:, 1, :])]
        return self.mlp(torch.cat([dense, *pooled], dim=1)).squeeze(1)


def two_tables():
    return TwoTables(), (torch.zeros(2, DENSE), torch.zeros(2, 2, POOLING, dtype=torch.long))


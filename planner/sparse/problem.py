"""The embedding block's problem and plan records (planner.sparse.embeddings): a user's fixed choices, a table's
assignment to an option and ranks, the block's solution, the problem the solvers share, and how many pieces an
option puts on ranks."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from partita.costmodel.sparse.costs import SHARDINGS, Option, PieceCost, SparseContext
from partita.costmodel.sparse.embeddings import Table


LOCAL = ("table_wise", "column_wise")
SPREAD = ("data_parallel", "row_wise")


@dataclass(frozen=True)
class Fixed:
    """A user's restriction of one table: its sharding, and optionally its pieces and placement."""

    sharding: str
    shards: int | None = None
    placement: str | None = None


@dataclass(kw_only=True)
class Assignment:
    table: Table
    option: Option
    cost: PieceCost
    ranks: tuple[int, ...]


@dataclass(kw_only=True)
class SparseSolution:
    assignments: list[Assignment]
    rank_time: np.ndarray
    """Per rank: its pieces' seconds (without the dense part and the collectives' latency)."""
    rank_hbm: np.ndarray
    rank_host: np.ndarray
    latency_s: float
    status: str
    lower_bound_s: float
    """A lower bound on the sparse part's step seconds (slowest rank plus latency), from the solver."""
    mip_gap: float
    """1 - (dense + lower bound) / (dense + sparse step): the gap of the whole step, the program's objective."""
    formulation: str
    wall_time_s: float
    options: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def step_s(self) -> float:
        return float(self.rank_time.max(initial=0.0)) + self.latency_s


@dataclass
class _Problem:
    tables: list[Table]
    costs: list[list[tuple[Option, PieceCost]]]
    ctx: SparseContext
    dense_s: float
    hbm_cap: float
    host_cap: float
    latency: dict[str, float]


def _kinds(p: _Problem) -> list[str]:
    return sorted({o.sharding for costs in p.costs for o, _ in costs}, key=SHARDINGS.index)


def _nodes(p: _Problem) -> tuple[int, int]:
    return _node_split(p.ctx)


def _node_split(ctx: SparseContext) -> tuple[int, int]:
    """(nodes, ranks per node) as table_row_wise groups them: one node of all ranks where they do not divide."""
    per_node = ctx.cluster.devices_per_node
    return (ctx.ranks // per_node, per_node) if ctx.ranks % per_node == 0 else (1, ctx.ranks)


def pieces(o: Option, ctx: SparseContext) -> int:
    """Pieces option `o` puts on ranks: one per rank (spread), its shards (local), or one per rank of a node."""
    return ctx.ranks if o.sharding in SPREAD else o.shards if o.sharding in LOCAL else _node_split(ctx)[1]


def _tally(p: _Problem, assignments: list[Assignment], status: str, formulation: str, wall: float) -> SparseSolution:
    R = p.ctx.ranks
    rt, rh, ru = np.zeros(R), np.zeros(R), np.zeros(R)
    for a in assignments:
        idx = list(a.ranks)
        rt[idx] += a.cost.time_s
        rh[idx] += a.cost.hbm_bytes
        ru[idx] += a.cost.host_bytes
    latency = sum(p.latency[k] for k in {a.option.sharding for a in assignments})
    return SparseSolution(assignments=assignments, rank_time=rt, rank_hbm=rh, rank_host=ru, latency_s=latency,
                          status=status, mip_gap=0.0, lower_bound_s=0.0, formulation=formulation, wall_time_s=wall,
                          options=sum(len(c) for c in p.costs))

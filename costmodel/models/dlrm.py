"""DLRM: embedding tables (the sparse part) beside two small MLPs (the dense part).

The model of Naumov et al., "Deep Learning Recommendation Model for Personalization and Recommendation
Systems" (arXiv:1906.00091, 2019): each sparse feature looks its IDs up in its own table and sum-pools
them into one vector of width `dim`; the dense features go through the bottom MLP to the same width; the
dot interaction takes the pairwise dot products of those vectors (the strictly lower triangle of
Z = T T^T, T = [bottom output; pooled vectors]) and concatenates them with the bottom output; the top MLP
maps that to one logit, trained with binary cross-entropy.

The MLPerf Training DLRM (Criteo Terabyte, `--max-ind-range=40000000`; facebookresearch/dlrm
bench/run_and_time.sh and the MLPerf reference) is the preset `dlrm-criteo-1tb`: 26 tables with the row
counts below, dim 128, 13 dense features, bottom MLP 512-256-128, top MLP 1024-1024-512-256-1 (its input
is 128 + 27 * 26 / 2 = 479 wide).

Tables are `nn.EmbeddingBag(rows, dim, mode="sum")` in a ModuleDict `embeddings`, one per feature, named
`cat_0` ... (TorchRec's DLRM example names its features the same way). The forward takes the dense
features (batch, dense) and the IDs (batch, tables, pooling): a fixed number of IDs per feature and
sample, the mean pooling factor the plan is priced at (costmodel.sparse.embeddings). The planner finds the tables
by their type (costmodel.sparse.embeddings.find_tables), so a user's own module with EmbeddingBag tables is
planned the same way.

`dlrm:` MODEL strings set every field: `dlrm:tables=500,rows=2000000,dim=128,bottom=512-256-128,
top=1024-1024-512-256-1,dense=13,pooling=1` (rows one number for every table, or one per table joined by
`-`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from partita.costmodel.errors import PartitaError

CRITEO_1TB_ROWS = (39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10, 2208,
                   11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36)
"""Rows of the 26 Criteo Terabyte tables with IDs hashed into 40M (MLPerf Training DLRM reference)."""


@dataclass(frozen=True, kw_only=True)
class DLRMConfig:
    rows: tuple[int, ...]
    dim: int = 128
    dense: int = 13
    bottom: tuple[int, ...] = (512, 256, 128)
    top: tuple[int, ...] = (1024, 1024, 512, 256, 1)
    pooling: int = 1
    """IDs per feature and sample in the example batch (Criteo: one per categorical feature)."""

    def __post_init__(self):
        if not self.rows or min(self.rows) < 1:
            raise ValueError("every table needs at least one row")
        if min(self.dim, self.dense, self.pooling, *self.bottom, *self.top) < 1:
            raise ValueError("dim, dense, pooling and every MLP width must be positive")
        if self.bottom[-1] != self.dim:
            raise ValueError(f"the bottom MLP must end at the embedding dim ({self.dim}), not {self.bottom[-1]}: "
                             "the dot interaction multiplies its output with the pooled embeddings")
        if self.top[-1] != 1:
            raise ValueError("the top MLP must end in one logit")

    @property
    def tables(self) -> int:
        return len(self.rows)

    def as_dict(self) -> dict:
        return {"family": "dlrm", **{k: list(v) if isinstance(v, tuple) else v
                                     for k, v in dataclasses.asdict(self).items()}}


PRESETS = {"dlrm-criteo-1tb": DLRMConfig(rows=CRITEO_1TB_ROWS)}


def _mlp(widths: list[int], last_relu: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(nn.Linear(a, b))
        if last_relu or i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def dot_interaction(x: torch.Tensor, pooled: list[torch.Tensor]) -> torch.Tensor:
    """[x, the strictly lower triangle of T T^T] with T = (batch, 1 + tables, dim) (Naumov et al. 2019)."""
    t = torch.stack([x, *pooled], dim=1)
    z = torch.bmm(t, t.transpose(1, 2))
    n = t.shape[1]
    rows, cols = torch.tril_indices(n, n, offset=-1, device=x.device)
    return torch.cat([x, z[:, rows, cols]], dim=1)


class DLRM(nn.Module):
    def __init__(self, cfg: DLRMConfig):
        super().__init__()
        self.cfg = cfg
        self.bottom = _mlp([cfg.dense, *cfg.bottom], last_relu=True)
        self.embeddings = nn.ModuleDict({f"cat_{i}": nn.EmbeddingBag(rows, cfg.dim, mode="sum")
                                         for i, rows in enumerate(cfg.rows)})
        n = cfg.tables + 1
        self.top = _mlp([cfg.dim + n * (n - 1) // 2, *cfg.top], last_relu=False)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        pooled = [table(ids[:, i, :]) for i, table in enumerate(self.embeddings.values())]
        return self.top(dot_interaction(x, pooled)).squeeze(1)


def click_loss(model: nn.Module, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of the logits against all-zero labels (values do not change costs)."""
    logits = model(dense, ids)
    return F.binary_cross_entropy_with_logits(logits, torch.zeros_like(logits))


def dlrm_spec(name: str, cfg: DLRMConfig):
    from partita.costmodel.models import ModelSpec  # late: models/__init__ imports this module's parser
    return ModelSpec(
        name=name,
        build=lambda: DLRM(cfg),
        example_inputs=lambda batch: (torch.zeros(batch, cfg.dense),
                                      torch.zeros(batch, cfg.tables, cfg.pooling, dtype=torch.long)),
        config=cfg.as_dict(),
        capture="fx",
        loss_fn=click_loss,
    )


_KEYS = ("tables", "rows", "dim", "dense", "bottom", "top", "pooling")
_LISTS = ("rows", "bottom", "top")


def _ints(spec: str, key: str, value: str) -> list[int]:
    try:
        out = [int(float(v)) if "e" in v.lower() else int(v) for v in value.strip().split("-")]
    except ValueError:
        raise PartitaError(f"model parameter {key}={value!r} in {spec!r} is not "
                           f"{'a list of integers joined by -' if key in _LISTS else 'an integer'}") from None
    if key not in _LISTS and len(out) != 1:
        raise PartitaError(f"model parameter {key}={value!r} in {spec!r} is one integer")
    return out


def parse_dlrm(spec: str):
    """`dlrm:tables=..,rows=..[,dim=..,dense=..,bottom=a-b-c,top=a-b-1,pooling=..]` -> ModelSpec."""
    kwargs: dict = {}
    for item in filter(None, spec.partition(":")[2].split(",")):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in _KEYS:
            raise PartitaError(f"bad model parameter {item!r} in {spec!r}: use key=value with keys {', '.join(_KEYS)}, "
                               "e.g. dlrm:tables=26,rows=1000000,dim=128,bottom=512-256-128,top=1024-1024-512-256-1")
        if key in kwargs:
            raise PartitaError(f"model parameter {key!r} is given twice in {spec!r}")
        kwargs[key] = _ints(spec, key, value)
    if "rows" not in kwargs:
        raise PartitaError(f"model {spec!r} needs rows=N (every table) or rows=N1-N2-... (one per table)")
    rows = kwargs.pop("rows")
    tables = kwargs.pop("tables", [len(rows)])[0]
    if len(rows) == 1:
        rows = rows * tables
    if len(rows) != tables:
        raise PartitaError(f"model {spec!r} gives {len(rows)} row counts for {tables} tables")
    fields = {k: (tuple(v) if k in _LISTS else v[0]) for k, v in kwargs.items()}
    if "dim" in fields and "bottom" not in fields:
        fields["bottom"] = (512, 256, fields["dim"])
    try:
        cfg = DLRMConfig(rows=tuple(rows), **fields)
    except ValueError as e:
        raise PartitaError(f"model {spec!r}: {e}") from None
    return dlrm_spec(spec, cfg)

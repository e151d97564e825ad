"""Embedding tables of a recommendation model, and how its data accesses them.

A model's sparse part is its `nn.EmbeddingBag` modules (`find_tables`), found on the meta device like
everything else: a 1T-parameter model is never allocated. The dense part -- everything else -- is
captured and priced as any other model (`dense_twin` swaps each table for a parameter-free stand-in that
returns zeros of the pooled shape).

What a table costs depends on the data: how many IDs each sample looks up in it (the pooling factor L)
and how those IDs are distributed over its rows. `Access` holds both, from one of two sources:

- a stated synthetic distribution: IDs Zipf-distributed with exponent alpha over the table's rows,
  p_i = i^-alpha / sum_j j^-alpha (alpha = 0: uniform);
- a sample of the user's sparse features (`--data`, `load_sample`): per feature its IDs in access order
  and, optionally, the IDs per sample.

From these come the two quantities the cost model needs (costmodel.sparse.costs):

- the miss ratio of an LRU cache of c rows, m(c) -- the miss-ratio curve. From a sample it is exact LRU
  simulation by stack distances (Mattson, Gecsei, Slutz & Traiger, "Evaluation techniques for storage
  hierarchies", IBM Systems Journal 9(2), 1970): an access hits a cache of c rows iff fewer than c
  distinct rows were touched since the previous access to its row; first accesses always miss. From a
  Zipf distribution it is Che's approximation (Che, Tung & Wang, IEEE JSAC 20(7), 2002; exact in the
  limit of many rows): the characteristic time T solves sum_i (1 - exp(-p_i T)) = c and
  m(c) = sum_i p_i exp(-p_i T). The caches of FBGEMM's UVM-caching kernels are LRU or LFU
  (fbgemm_gpu CacheAlgorithm); RecShard (Sethi et al., ASPLOS'22) and AutoShard (Zha et al., KDD'22)
  size them from such access statistics.
- the expected distinct rows among n lookups, U(n) = sum_i (1 - (1 - p_i)^n) ~ sum_i (1 - exp(-n p_i)):
  the rows a fused backward updates (each updated row is read and written once, with its optimizer state).

Zipf sums over millions of rows are taken over ~600 geometric buckets of ranks (p_i is monotone in the
rank; each bucket contributes its size times the term at its geometric middle rank).
"""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn

from partita.costmodel.errors import PartitaError

SAMPLE_ACCESSES = 200_000
"""Accesses per feature the LRU simulation of a sample reads (the first ones, in order)."""


@dataclass(frozen=True, kw_only=True)
class Table:
    """One embedding table: its rows and width, and where it lives in the module."""

    name: str
    """The table's module FQN in the user's model (e.g. "embeddings.cat_0"), also the name of its feature in
    a data sample."""
    rows: int
    dim: int
    mode: str = "sum"
    collection: str = ""
    """A TorchRec EmbeddingBagCollection's table: the collection's FQN (costmodel.sparse.kjt); "" for a plain
    nn.EmbeddingBag."""
    key: str = ""
    """The EmbeddingBagConfig's name of a collection's table."""
    features: tuple[str, ...] = ()
    """The KJT features a collection's table pools (each looks it up once per sample); () for a plain table."""
    weight_bytes: int = 4
    """Bytes per weight: 4 for fp32 tables, 2 for fp16 ones (TorchRec's DataType.FP16)."""

    @property
    def params(self) -> int:
        return self.rows * self.dim

    @property
    def lookups(self) -> int:
        """Features looking the table up per sample: one, or a collection table's shared features."""
        return max(1, len(self.features))


def by_config_name(tables: list[Table]) -> dict[str, str]:
    """{config name: table name} of the collections' tables whose config name no other table has: a TorchRec
    user may name those tables so (--embedding-sharding, --data)."""
    keys = [t.key for t in tables if t.key]
    return {t.key: t.name for t in tables if t.key and keys.count(t.key) == 1}


def table_modules(module: nn.Module) -> dict[str, nn.EmbeddingBag]:
    """The `nn.EmbeddingBag` tables of `module` by name (Table.name: their FQN in the user's model, without
    costmodel.sparse.kjt.KJTModel's prefix), in module order."""
    from partita.costmodel.sparse.kjt import KJT_PREFIX, KJTModel
    strip = len(KJT_PREFIX) if isinstance(module, KJTModel) else 0
    return {fqn[strip:]: m for fqn, m in module.named_modules() if isinstance(m, nn.EmbeddingBag)}


def find_tables(module: nn.Module) -> list[Table]:
    """The `nn.EmbeddingBag` tables of `module`, in module order (build it on the meta device); those of a
    TorchRec EmbeddingBagCollection with its name and features."""
    from partita.costmodel.sparse.kjt import collection_tables
    shared = collection_tables(module)
    return [Table(name=name, rows=m.num_embeddings, dim=m.embedding_dim, mode=m.mode,
                  weight_bytes=m.weight.element_size(), **shared.get(name, {}))
            for name, m in table_modules(module).items()]


class PooledStandIn(nn.Module):
    """What a table returns -- one pooled vector per bag -- without its parameters: zeros of shape
    (bags, dim), so the dense part is captured without the tables (their costs are costmodel.sparse.costs's)."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim
        self.dtype = torch.get_default_dtype()  # the training dtype where capture builds the model

    def forward(self, input, offsets=None, per_sample_weights=None):
        bags = input.shape[0] if offsets is None else offsets.shape[0]
        return input.new_zeros((bags, self.dim), dtype=self.dtype)


def dense_twin(module: nn.Module) -> nn.Module:
    """`module` with every EmbeddingBag replaced by a PooledStandIn, and every TorchRec EmbeddingBagCollection
    by a costmodel.sparse.kjt.PooledCollection (in place; returns it)."""
    from partita.costmodel.sparse.kjt import is_ebc, pooled_stand_in
    for kind, stand_in in ((is_ebc, pooled_stand_in),
                           (lambda m: isinstance(m, nn.EmbeddingBag), lambda m: PooledStandIn(m.embedding_dim))):
        for fqn, m in list(module.named_modules()):
            if kind(m) and fqn:
                parent_name, _, child = fqn.rpartition(".")
                setattr(module.get_submodule(parent_name), child, stand_in(m))
    return module


# ------------------------------------------------------------------------------------------------ access

@dataclass(frozen=True, kw_only=True)
class Access:
    """How a feature's IDs hit its table: pooling factor, and the miss-ratio curve and distinct rows."""

    pooling: float
    """Mean IDs per sample."""
    source: str
    _zipf: tuple | None = None
    """(rows, alpha) of a Zipf distribution."""
    _distances: np.ndarray | None = field(default=None, repr=False)
    """Sorted LRU stack distances of a sample's accesses (inf: first access)."""
    _probs: np.ndarray | None = field(default=None, repr=False)
    """Per-row access probabilities seen in a sample."""

    def miss_ratio(self, cache_rows: float) -> float:
        """m(c): the fraction of lookups an LRU cache of `cache_rows` rows misses."""
        if cache_rows <= 0:
            return 1.0
        if self._distances is not None:
            d = self._distances
            return float(len(d) - np.searchsorted(d, cache_rows, side="right")) / len(d) if len(d) else 0.0
        return _zipf_miss(*self._zipf, float(cache_rows))

    def distinct(self, lookups: float) -> float:
        """U(n): expected distinct rows among `lookups` lookups."""
        if lookups <= 0:
            return 0.0
        if self._probs is not None:
            return float(np.sum(-np.expm1(-lookups * self._probs)))
        return _zipf_distinct(*self._zipf, float(lookups))


@functools.lru_cache(maxsize=4096)
def _zipf_miss(rows: int, alpha: float, cache_rows: float) -> float:
    """Che's approximation of an LRU cache's miss ratio under Zipf(alpha) over `rows` rows (module docstring)."""
    sizes, p = _zipf_buckets(rows, alpha)
    if cache_rows >= rows:
        return 0.0
    t = _characteristic_time(sizes, p, cache_rows)
    return float(np.sum(sizes * p * np.exp(-p * t)))


@functools.lru_cache(maxsize=4096)
def _zipf_distinct(rows: int, alpha: float, lookups: float) -> float:
    sizes, p = _zipf_buckets(rows, alpha)
    return float(np.sum(sizes * -np.expm1(-lookups * p)))


@functools.lru_cache(maxsize=256)
def _zipf_buckets(rows: int, alpha: float, buckets: int = 600) -> tuple[np.ndarray, np.ndarray]:
    edges = np.unique(np.round(np.geomspace(1, rows + 1, buckets + 1)).astype(np.int64))
    lo, hi = edges[:-1], edges[1:]
    sizes = (hi - lo).astype(np.float64)
    mid = np.sqrt(lo * (hi - 1.0).clip(min=lo))
    weight = mid ** -alpha
    return sizes, weight / np.sum(sizes * weight)


def _characteristic_time(sizes: np.ndarray, p: np.ndarray, cache_rows: float) -> float:
    """Che's T: sum_i (1 - exp(-p_i T)) = cache_rows, by bisection on log T."""
    lo, hi = 0.0, 1.0
    while np.sum(sizes * -np.expm1(-p * hi)) < cache_rows:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        if np.sum(sizes * -np.expm1(-p * mid)) < cache_rows:
            lo = mid
        else:
            hi = mid
    return hi


def zipf_access(rows: int, alpha: float, pooling: float) -> Access:
    if alpha < 0 or not math.isfinite(alpha):
        raise PartitaError(f"--zipf alpha must be >= 0 (0: uniform), got {alpha}")
    if pooling <= 0:
        raise PartitaError(f"--pooling must be positive, got {pooling}")
    return Access(pooling=pooling, source=f"zipf alpha={alpha:g}, pooling {pooling:g}",
                  _zipf=(rows, float(alpha)))


def lru_stack_distances(ids: np.ndarray) -> np.ndarray:
    """Mattson's stack distance of every access: distinct rows touched since the previous access to the
    same row, plus one (inf for a first access). A Fenwick tree over access times marks each row's latest
    access, so each distance is a prefix-sum query: O(n log n)."""
    n = len(ids)
    tree = [0] * (n + 1)
    last: dict[int, int] = {}
    out = np.empty(n, dtype=np.float64)

    def add(i: int, v: int) -> None:
        i += 1
        while i <= n:
            tree[i] += v
            i += i & -i

    def prefix(i: int) -> int:  # marks at times [0, i)
        s = 0
        while i > 0:
            s += tree[i]
            i -= i & -i
        return s

    marked = 0
    for t, x in enumerate(ids.tolist()):
        prev = last.get(x)
        if prev is None:
            out[t] = math.inf
        else:
            out[t] = marked - prefix(prev + 1) + 1  # marks after prev, plus the row itself
            add(prev, -1)
            marked -= 1
        add(t, 1)
        marked += 1
        last[x] = t
    return out


def sample_access(ids: np.ndarray, lengths: np.ndarray | None, source: str) -> Access:
    ids = np.asarray(ids).reshape(-1)
    pooling = float(len(ids) / len(lengths)) if lengths is not None and len(lengths) else 1.0
    head = ids[:SAMPLE_ACCESSES]
    distances = np.sort(lru_stack_distances(head))
    _, counts = np.unique(ids, return_counts=True)
    return Access(pooling=pooling, source=source, _distances=distances, _probs=counts / counts.sum())


def load_sample(path: str, tables: list[Table]) -> dict[str, Access]:
    """Per table, its Access from a sample file: an .npz holding, per feature (named as its table, or a TorchRec
    collection's table by its config name), the IDs in access order (`<name>`) and optionally the IDs per sample
    (`<name>.lengths`, summing to the IDs).
    A file that does not hold exactly the model's features is one line naming the difference."""
    if not os.path.isfile(path):
        raise PartitaError(f"--data {path!r}: no such file (an .npz of per-feature IDs, see costmodel.sparse.embeddings)")
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError) as e:
        raise PartitaError(f"--data {path!r} is not an .npz of ID arrays: {e}") from None
    alias = by_config_name(tables)

    def canonical(k: str) -> str:
        base = k.removesuffix(".lengths")
        return alias.get(base, base) + k[len(base):]
    arrays = {canonical(k): v for k, v in arrays.items()}
    names = {t.name for t in tables}
    features = {k for k in arrays if not k.endswith(".lengths")}
    missing, extra = sorted(names - features), sorted(features - names)
    if missing or extra:
        raise PartitaError(f"--data {path!r} does not match the model's features: "
                           + "; ".join(filter(None, [missing and f"missing {', '.join(missing[:5])}"
                                                         + (" ..." if len(missing) > 5 else ""),
                                                         extra and f"not in the model {', '.join(extra[:5])}"]))
                           + f" (the model's tables: {', '.join(sorted(names)[:5])}{' ...' if len(names) > 5 else ''})")
    out = {}
    for t in tables:
        ids, lengths = arrays[t.name], arrays.get(t.name + ".lengths")
        if ids.ndim != 1 or ids.dtype.kind not in "iu" or len(ids) == 0:
            raise PartitaError(f"--data {path!r}: feature {t.name!r} must be a non-empty 1-D array of integer IDs")
        if ids.min() < 0 or ids.max() >= t.rows:
            raise PartitaError(f"--data {path!r}: feature {t.name!r} has IDs outside its table's {t.rows} rows")
        if lengths is not None and (lengths.ndim != 1 or int(lengths.sum()) != len(ids)):
            raise PartitaError(f"--data {path!r}: {t.name}.lengths must be 1-D and sum to the {len(ids)} IDs")
        n = len(lengths) if lengths is not None else len(ids)
        out[t.name] = sample_access(ids, lengths, f"sample {os.path.basename(path)} ({n} samples)")
    return out

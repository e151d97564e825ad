"""The options of each embedding table (planner.sparse.embeddings' docstring): a user's `--embedding-sharding`
restrictions, every sharding, piece count and placement a table offers, their piece costs (partita's byte
model or TorchRec's estimator) reduced to the Pareto front of time and memory, and the floor they put under
the tables' step."""
from __future__ import annotations

from partita.costmodel.errors import PartitaError
from partita.costmodel.sparse.costs import (PLACEMENTS, SHARDINGS, Option, PieceCost, SparseContext, collective_latency,
                                            piece_cost)
from partita.costmodel.sparse.embeddings import Access, Table, by_config_name
from partita.costmodel.sparse.torchrec_costs import torchrec_costs
from partita.planner.sparse.problem import Fixed, pieces

CACHE_FRACTIONS = (0.01, 0.05, 0.2)
"""HBM cache sizes the search offers, as fractions of a table's rows (a grid over the miss-ratio curve)."""
COLUMN_SHARDS = (2, 4, 8)
MIN_COLUMN_WIDTH = 4
"""FBGEMM's kernels need each piece's width to be a multiple of 4."""

def parse_fixed(text: str, tables: list[Table]) -> dict[str, Fixed]:
    """`NAME=SHARDING[:K][@PLACEMENT],...` (NAME a table, or * for every table) -> {table: Fixed}. A TorchRec
    collection's table may be named by its EmbeddingBagConfig name where no other table has that name."""
    by_name = {t.name: t for t in tables}
    names = {**{key: by_name[name] for key, name in by_config_name(tables).items()}, **by_name}
    out: dict[str, Fixed] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, eq, rest = item.partition("=")
        rest, _, place = rest.partition("@")
        kind, _, k = rest.partition(":")
        if not eq or kind not in SHARDINGS or (place and place not in PLACEMENTS):
            raise PartitaError(f"bad --embedding-sharding {item!r}: use TABLE=SHARDING[:K][@PLACEMENT] with sharding "
                               f"{'|'.join(SHARDINGS)} and placement {'|'.join(PLACEMENTS)} (TABLE * for all)")
        if name != "*" and name not in names:
            raise PartitaError(f"--embedding-sharding names {name!r}, which is no table of the model "
                               f"(tables: {', '.join(t.name for t in tables[:6])}{' ...' if len(tables) > 6 else ''})")
        if k and (not k.isdigit() or int(k) < 1 or kind != "column_wise"):
            raise PartitaError(f"bad --embedding-sharding {item!r}: only column_wise takes :K, a positive number of pieces")
        fix = Fixed(kind, int(k) if k else None, place or None)
        for t in (tables if name == "*" else [names[name]]):
            if fix.shards and (t.dim % fix.shards or t.dim // fix.shards % MIN_COLUMN_WIDTH):
                raise PartitaError(f"table {t.name} of dim {t.dim} does not split into {fix.shards} column pieces "
                                   f"(each must be a multiple of {MIN_COLUMN_WIDTH} wide): choose K dividing "
                                   f"{t.dim} into such pieces")
            out[t.name] = fix
    return out


def table_options(table: Table, ctx: SparseContext, fixed: Fixed | None = None) -> list[Option]:
    R, per_node = ctx.ranks, ctx.cluster.devices_per_node
    places = [("hbm", 0.0), ("host", 0.0)] + [("cache", f) for f in CACHE_FRACTIONS]
    if fixed and fixed.placement:
        places = [p for p in places if p[0] == fixed.placement]
    out = []
    for kind in SHARDINGS:
        if fixed and fixed.sharding != kind:
            continue
        if kind == "data_parallel":
            if not fixed or fixed.placement in (None, "hbm"):
                out.append(Option(sharding=kind))
            continue
        if kind == "row_wise" and R == 1 or kind == "table_row_wise" and not (1 < per_node < R):
            continue
        shards = [1]
        if kind == "column_wise":
            shards = [fixed.shards] if fixed and fixed.shards else [
                k for k in COLUMN_SHARDS if k <= R and table.dim % k == 0 and table.dim // k % MIN_COLUMN_WIDTH == 0]
            if fixed and fixed.shards and fixed.shards > R:
                raise PartitaError(f"table {table.name}: {fixed.shards} column pieces need as many ranks; the "
                                   f"cluster has {R}")
        out += [Option(sharding=kind, placement=p, shards=k, cache_fraction=f) for k in shards for p, f in places]
    return out


def _pareto(costs: list[tuple[Option, PieceCost]]) -> list[tuple[Option, PieceCost]]:
    """Drop an option another of the same sharding and pieces beats in time, HBM and host memory."""
    keep = []
    for i, (o, c) in enumerate(costs):
        dominated = any(j != i and p.sharding == o.sharding and p.shards == o.shards
                        and d.time_s <= c.time_s and d.hbm_bytes <= c.hbm_bytes and d.host_bytes <= c.host_bytes
                        and (d.time_s, d.hbm_bytes, d.host_bytes, j) < (c.time_s, c.hbm_bytes, c.host_bytes, i)
                        for j, (p, d) in enumerate(costs))
        if not dominated:
            keep.append((o, c))
    return keep


def option_costs(tables: list[Table], accesses: dict[str, Access], ctx: SparseContext,
                 fixed: dict[str, Fixed] | None = None) -> list[list[tuple[Option, PieceCost]]]:
    """Per table, its options with their piece costs (the Pareto front of time and memory), priced by
    partita's byte model or, with ctx.pricing "torchrec", by TorchRec's estimator (costmodel.sparse.torchrec_costs)."""
    fixed = fixed or {}
    options = [table_options(t, ctx, fixed.get(t.name)) for t in tables]
    if ctx.pricing == "torchrec":
        return [_pareto(priced) for priced in torchrec_costs(tables, accesses, ctx, options)]
    return [_pareto([(o, piece_cost(t, accesses[t.name], o, ctx)) for o in opts]) for t, opts in zip(tables, options)]


def floor_s(costs: list[list[tuple[Option, PieceCost]]], ctx: SparseContext) -> float:
    """A lower bound on the tables' step under any memory: the relaxation's average-load row with every table at
    its cheapest option, plus the latency of the cheapest sharding type (some type is used). A dense option whose
    step plus this floor exceeds a plan already found cannot win (planner.sparse.rec_plan)."""
    if not all(costs):
        return 0.0  # a table without options: solve_tables names it
    load = sum(min(c.time_s * pieces(o, ctx) / ctx.ranks for o, c in options) for options in costs)
    return load + min(collective_latency(ctx, o.sharding) for options in costs for o, _ in options)

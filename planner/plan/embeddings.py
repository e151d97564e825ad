"""The plan's `embeddings` section (planner.sparse.rec_plan writes it): its schema and its validation, part of the
plan contract that the runtime reads, so loading a plan never imports the tables' solver."""
from __future__ import annotations

from partita.planner.plan.sections import COUNT, NUMBER, TEXT, checked

SECTION_SCHEMA = "partita.embeddings/1"
DENSE_ZERO = (0, 3)
"""ZeRO stages the dense part of a model with tables runs at (replicated DDP, or FSDP2)."""


def validate_section(data, world_size: int) -> dict | None:
    """Check a plan's `embeddings` section (hand-written or solved); None where a plan has none."""
    from partita.costmodel.sparse.names import PLACEMENTS, PRICINGS, SHARDINGS, SPARSE_OPTIMIZERS
    from partita.planner.plan import PlanError
    if data is None:
        return None
    if not isinstance(data, dict) or data.get("schema") != SECTION_SCHEMA:
        raise PlanError(f"embeddings.schema must be {SECTION_SCHEMA!r}")
    tables = data.get("tables")
    if not isinstance(tables, list) or not tables:
        raise PlanError("embeddings.tables must be a non-empty list")
    if data.get("optimizer", "rowwise_adagrad") not in SPARSE_OPTIMIZERS:
        raise PlanError(f"embeddings.optimizer must be one of {', '.join(SPARSE_OPTIMIZERS)}")
    seen = set()
    for i, t in enumerate(tables):
        where = f"embeddings.tables[{i}]"
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or t["name"] in seen:
            raise PlanError(f"{where} needs a unique string name")
        seen.add(t["name"])
        if t.get("sharding") not in SHARDINGS or t.get("placement", "hbm") not in PLACEMENTS:
            raise PlanError(f"{where}: sharding must be one of {', '.join(SHARDINGS)} and placement one of "
                            f"{', '.join(PLACEMENTS)}")
        ranks = t.get("ranks")
        if (not isinstance(ranks, list) or not ranks or len(set(ranks)) != len(ranks)
                or not all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < world_size for r in ranks)):
            raise PlanError(f"{where}.ranks must be distinct ranks in [0, {world_size})")
        for key in ("rows", "dim"):
            if not isinstance(t.get(key), int) or t[key] < 1:
                raise PlanError(f"{where}.{key} must be a positive integer")
        if ("collection" in t or "key" in t) and not (
                isinstance(t.get("collection"), str) and isinstance(t.get("key"), str) and t["key"]
                and isinstance(t.get("features"), list) and all(isinstance(f, str) for f in t["features"])):
            raise PlanError(f"{where}: a collection's table needs the collection's path, its config name (key) and "
                            "its features (a list of names)")
        if t.get("placement") == "cache" and not (_number(t.get("cache_fraction")) and 0 < t["cache_fraction"] <= 1):
            raise PlanError(f"{where}.cache_fraction must be a number in (0, 1] for a cached table")
        shards = t.get("shards", 1)
        want = {"table_wise": 1, "column_wise": shards, "row_wise": world_size, "data_parallel": world_size}
        if t["sharding"] in want and len(ranks) != want[t["sharding"]]:
            raise PlanError(f"{where}: {t['sharding']} puts {want[t['sharding']]} piece(s) on ranks, the plan lists "
                            f"{len(ranks)}")
        if t["sharding"] == "column_wise" and (not isinstance(shards, int) or shards < 1 or t["dim"] % shards):
            raise PlanError(f"{where}: dim {t['dim']} does not split into {shards} column pieces")
    if data.get("pricing", "partita") not in PRICINGS:
        raise PlanError(f"embeddings.pricing must be one of {', '.join(PRICINGS)}")
    _validate_dense(data.get("dense"))
    if found := checked(data, _section_spec(world_size), "embeddings"):
        raise PlanError(found[0])
    return data


def _section_spec(world_size: int) -> dict:
    """The section's figures as `partita explain` reads them (renderables), a list per rank for each rank."""
    per_rank = [NUMBER, world_size]
    return {"tables": [{"pooling": NUMBER, "cache_fraction": NUMBER, "cache_miss_ratio": NUMBER, "shards": COUNT,
                        "predicted": {"*": NUMBER}}],
            "predicted!": {"step_time_s!": NUMBER, "latency_s!": NUMBER, "dense_step_s": NUMBER,
                           "per_rank!": {"time_s!": per_rank, "hbm_bytes!": per_rank, "host_bytes!": per_rank}},
            "solver!": {"status!": TEXT, "formulation!": TEXT, "mip_gap!": NUMBER, "lower_bound_s!": NUMBER,
                        "wall_time_s!": NUMBER, "options!": COUNT}}


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _validate_dense(dense) -> None:
    """The section's "dense" entry (absent in plans written before the dense choice)."""
    from partita.planner.plan import PlanError
    if dense is None:
        return
    options = dense.get("options") if isinstance(dense, dict) else None
    if not (isinstance(options, list) and dense.get("zero_stage") in DENSE_ZERO and all(
            isinstance(o, dict) and o.get("zero_stage") in DENSE_ZERO
            and all(_number(o[k]) for k in ("dense_step_s", "dense_hbm_bytes", "step_time_s") if k in o)
            and (("step_time_s" in o and "dense_step_s" in o and "dense_hbm_bytes" in o)
                 or isinstance(o.get("refused", o.get("pruned")), str)) for o in options)):
        raise PlanError(f"embeddings.dense must be {{\"zero_stage\": {' or '.join(map(str, DENSE_ZERO))}, \"options\": "
                        "[{\"zero_stage\", \"dense_step_s\", \"dense_hbm_bytes\", and \"step_time_s\" or \"refused\" "
                        "or \"pruned\"}]}")


def renderables(plan) -> list:
    """The embeddings part of `partita plan`'s report: tables by sharding and placement, the busiest rank, the
    solver's gap."""
    from collections import Counter

    from rich.table import Table as RichTable
    from rich.text import Text

    from partita.planner.plan.explain import human_bytes
    e = plan.embeddings
    tables = e["tables"]
    params = sum(t["rows"] * t["dim"] for t in tables)
    out = [Text(f"embedding tables  {len(tables)} tables, {params / 1e9:.3g}B parameters; IDs: {e.get('data')}; "
                f"optimizer {e.get('optimizer')}")]
    if e.get("pricing") == "torchrec":
        out.append(Text("table costs  TorchRec's EmbeddingPerfEstimator and EmbeddingStorageEstimator "
                        "(--embedding-costs torchrec), not partita's byte model; the dense part is partita's"))
    grid = RichTable(show_edge=False, pad_edge=False)
    for col in ("sharding", "placement", "tables", "ranks", "e.g."):
        grid.add_column(col)
    groups = Counter((t["sharding"] + (f" x{t['shards']}" if t["sharding"] == "column_wise" else ""),
                      t["placement"] + (f" {t['cache_fraction']:.0%}" if t["placement"] == "cache" else ""))
                     for t in tables)
    for (kind, place), n in sorted(groups.items(), key=lambda kv: -kv[1]):
        members = [t for t in tables if (t["sharding"] + (f" x{t['shards']}" if t["sharding"] == "column_wise" else ""),
                                         t["placement"] + (f" {t['cache_fraction']:.0%}" if t["placement"] == "cache"
                                                           else "")) == (kind, place)]
        ranks = sorted({r for t in members for r in t["ranks"]})
        grid.add_row(kind, place, str(n), _span(ranks), Text(", ".join(t["name"] for t in members[:3])  # not markup
                                                             + (" ..." if n > 3 else "")))
    out.append(grid)
    pr = e["predicted"]["per_rank"]
    slow = max(range(len(pr["time_s"])), key=lambda r: pr["time_s"][r])
    s = e["solver"]
    out.append(Text(_dense_line(e.get("dense"))))
    out.append(Text(f"busiest rank {slow}: {pr['time_s'][slow]:.4g} s of lookups, updates and all-to-alls + "
                    f"{e['predicted']['latency_s']:.3g} s collective latency; most HBM on a rank "
                    f"{human_bytes(max(pr['hbm_bytes']))}, host {human_bytes(max(pr['host_bytes']))}"))
    out.append(Text(f"embedding program  {s['status']} (gap {100 * s['mip_gap']:.2g}% of the step, lower bound "
                    f"{s['lower_bound_s']:.4g} s for the tables), {s['formulation']}, {s['options']} options, "
                    f"{s['wall_time_s']:.2f}s"))
    return out


def _dense_line(dense: dict | None) -> str:
    """Which dense option the program chose, and what the other would have given."""
    from partita.planner.plan.explain import human_bytes
    name = {0: "replicated (DDP)", 3: "sharded (FSDP, ZeRO-3)"}
    if not dense:
        return "dense part  replicated (DDP)"
    parts = []
    for o in dense["options"]:
        label = name.get(o["zero_stage"], f"ZeRO-{o['zero_stage']}")
        if "step_time_s" in o:
            parts.append(f"{label}: {o['dense_step_s']:.4g} s and {human_bytes(o['dense_hbm_bytes'])} a rank, "
                         f"step with the tables {o['step_time_s']:.4g} s")
        elif "pruned" in o:
            parts.append(f"{label}: not solved ({o['pruned']})")
        else:
            parts.append(f"{label}: refused ({o['refused'][:80]})")
    return f"dense part  {name[dense['zero_stage']]}, chosen with the tables; " + "; ".join(parts)


def _span(ranks: list[int]) -> str:
    if not ranks:
        return ""
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])
    return ",".join(map(str, ranks[:8])) + (" ..." if len(ranks) > 8 else "")

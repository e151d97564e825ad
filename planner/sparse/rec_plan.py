"""Plan a recommendation model: the dense part by the search, the tables by planner.sparse.embeddings, one Plan.

A model with `nn.EmbeddingBag` tables (costmodel.sparse.embeddings.find_tables) is planned in two parts that share
every rank: the dense part -- the model with its tables replaced by parameter-free stand-ins -- is captured
and searched as any model over every rank, replicated (DDP, as TorchRec's DistributedModelParallel runs it)
or sharded (FSDP2, ZeRO-3: DENSE_ZERO); its step time D and per-rank memory M_D enter the embedding program
(planner.sparse.embeddings) as constants, which places every table beside it and minimises the slowest rank's step.

The dense choice is made jointly with the tables. It adds D and M_D to every rank alike, so with one binary
per dense option d the program is min_d [D_d + S(HBM - M_D_d)], S the tables' optimum under the memory left:
it is solved once per option and the best kept, the joint optimum (within the solves' gaps). Sharding the
dense part trades gathers and reduce-scatters each step for memory the tables can use -- it wins where a
large dense part crowds tables out of HBM; a DLRM's small MLPs stay replicated. Each option's outcome is in
the section's "dense" entry.

The Plan gains a versioned `embeddings` section (SECTION_SCHEMA), which runtime.parallel.rec turns into TorchRec's
ParameterSharding plan:

    embeddings   {"schema": "partita.embeddings/1", "optimizer", "data",
                  "pricing" ("partita": costmodel.sparse.costs's byte model; "torchrec": TorchRec's own estimator,
                             costmodel.sparse.torchrec_costs -- absent in older plans: partita),
                  "tables": [{"name", "collection", "key", "features" (a TorchRec collection's table: the
                              collection's FQN, its EmbeddingBagConfig name and features), "rows", "dim",
                              "pooling", "sharding", "placement", "cache_fraction",
                              "cache_miss_ratio" (cached tables: the LRU miss ratio at that size),
                              "shards", "ranks": [int], "predicted": {"lookup_s", "update_s", "comm_s",
                              "hbm_bytes", "host_bytes"}}],
                  "dense": {"zero_stage" (the chosen), "options": [{"zero_stage", "dense_step_s",
                             "dense_hbm_bytes", "step_time_s" (with the tables), "refused" or "pruned"}]},
                  "predicted": {"step_time_s", "latency_s", "dense_step_s",
                                "per_rank": {"time_s": [...], "hbm_bytes": [...], "host_bytes": [...]}},
                  "solver": {"status", "formulation", "mip_gap", "lower_bound_s", "wall_time_s", "options"}}

`ranks` lists the ranks holding the table's pieces: one (table_wise), k in piece order (column_wise),
every rank (row_wise, data_parallel), the ranks of one node (table_row_wise).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from partita.costmodel import ModelSpec
from partita.costmodel.sparse.embeddings import Table, dense_twin, load_sample, zipf_access
from partita.costmodel.errors import InfeasibleError, PartitaError
from partita.costmodel.hardware import Cluster
from partita.costmodel.sparse.costs import PLACEMENTS, SHARDINGS, SPARSE_OPTIMIZERS, SparseContext
from partita.costmodel.sparse.torchrec_costs import PRICINGS
from partita.planner.sparse.embeddings import floor_s, option_costs, parse_fixed, solve_tables
from partita.planner.plan.sections import COUNT, NUMBER, TEXT, checked

SECTION_SCHEMA = "partita.embeddings/1"
DENSE_ZERO = (0, 3)
"""The dense part's choices: replicated over every rank (DDP, as TorchRec's DistributedModelParallel runs it)
or sharded over them (FSDP2, ZeRO-3: parameters, gradients and optimizer state split R ways, gathered per
step)."""


@dataclass(frozen=True, kw_only=True)
class SparseInputs:
    """The data and choices of the sparse part (`partita plan --data/--zipf/--pooling/...`)."""

    data: str | None = None
    """A sample of the sparse features (.npz, costmodel.sparse.embeddings.load_sample)."""
    zipf: float | None = None
    """IDs Zipf-distributed with this exponent over each table's rows; neither given: uniform (alpha 0)."""
    pooling: float | None = None
    """IDs per sample and feature under --zipf; default: the model's example batch's."""
    optimizer: str = "rowwise_adagrad"
    fixed: str | None = None
    """`TABLE=SHARDING[:K][@PLACEMENT],...` (planner.sparse.embeddings.parse_fixed)."""
    time_limit: float = 60.0
    pricing: str = "partita"
    """Who prices the table pieces: partita's byte model, or TorchRec's estimator (costmodel.sparse.torchrec_costs)."""

    def __post_init__(self):
        if self.pricing not in PRICINGS:
            raise PartitaError(f"--embedding-costs {self.pricing!r}; accepted: {', '.join(PRICINGS)}")
        if self.optimizer not in SPARSE_OPTIMIZERS:
            raise PartitaError(f"sparse optimizer {self.optimizer!r}; accepted: {', '.join(SPARSE_OPTIMIZERS)}")
        if self.data is not None and (self.zipf is not None or self.pooling is not None):
            raise PartitaError("--data gives the ID distribution and pooling; drop --zipf / --pooling")


def _example_pooling(spec: ModelSpec) -> float:
    """IDs per feature in the example batch: the last dimension of the integer input (DLRM's (batch,
    tables, pooling) IDs), or 1."""
    ints = [t for t in spec.example_inputs(1) if not t.is_floating_point() and t.dim() >= 2]
    return float(ints[0].shape[-1]) if ints else 1.0


def accesses_for(tables: list[Table], spec: ModelSpec, sparse: SparseInputs) -> tuple[dict, str]:
    if sparse.data is not None:
        acc = load_sample(sparse.data, tables)
        return acc, next(iter(acc.values())).source if acc else sparse.data
    alpha = sparse.zipf if sparse.zipf is not None else 0.0
    per_feature = spec.config.get("kjt_pooling")  # a TorchRec model's: IDs per sample of each KJT feature
    if sparse.pooling is not None or not per_feature:
        pooling = sparse.pooling if sparse.pooling is not None else _example_pooling(spec)
        acc = {t.name: zipf_access(t.rows, alpha, pooling * t.lookups) for t in tables}
        said = f"pooling {pooling:g}"
    else:
        acc = {t.name: zipf_access(t.rows, alpha, _kjt_pooling(t, per_feature)) for t in tables}
        said = "pooling per feature from the example KeyedJaggedTensor"
    stated = "" if sparse.zipf is not None else " (uniform: no --data or --zipf given)"
    return acc, f"zipf alpha={alpha:g}, {said}{stated}"


def _kjt_pooling(table: Table, per_feature: dict) -> float:
    """IDs per sample a collection's table looks up: the sum over the features it pools."""
    missing = [f for f in table.features if f not in per_feature]
    if missing or not table.features:
        raise PartitaError(f"table {table.name} pools feature(s) {', '.join(missing or ['(none)'])}, which the "
                           f"model's KeyedJaggedTensor input does not have (its keys: {', '.join(per_feature)})")
    return float(sum(per_feature[f] for f in table.features))


def plan_rec(spec: ModelSpec, tables: list[Table], cluster: Cluster, train, sparse: SparseInputs, fingerprint: str,
             progress=None, dense_zero: tuple[int, ...] = DENSE_ZERO):
    """The Plan of a model with embedding tables (module docstring)."""
    from partita.costmodel.capture.trace import capture
    from partita.planner.estimate.build import build_plan
    from partita.planner.search import search
    from partita.planner.enumerate.space import SearchSpace
    t0 = time.perf_counter()
    fixed = parse_fixed(sparse.fixed, tables) if sparse.fixed else {}
    accesses, source = accesses_for(tables, spec, sparse)
    R = cluster.num_devices
    if train.global_batch % R:
        raise PartitaError(f"the global batch {train.global_batch} does not divide over the {R} ranks (the dense part "
                           "is data-parallel over every rank)")
    twin = dataclasses.replace(spec, build=lambda: dense_twin(spec.build()))
    graph = capture(twin, dtype=train.dtype)
    # one micro-batch of the whole local batch: recommendation models train without accumulation
    local = train.global_batch // R
    train = dataclasses.replace(train, max_micro_batch=max(train.max_micro_batch, local))
    ctx = SparseContext(cluster=cluster, global_batch=train.global_batch, optimizer=sparse.optimizer,
                        pricing=sparse.pricing)
    costs = option_costs(tables, accesses, ctx, fixed)
    floor = floor_s(costs, ctx)
    solves_s, options = 0.0, []
    for zero in dense_zero if R > 1 else (0,):
        dense_space = SearchSpace(tp=(1,), pp=(1,), dp=(R,), cp=(1,), ep=(1,), zero=(zero,), offload=False,
                                  recompute=("none",), micro_batch=(local,))
        result = search(graph, cluster, train, progress=progress, space=dense_space, raise_infeasible=False)
        options.append((zero, build_plan(result, spec.name, fingerprint, spec.config) if result.best else None))
    tried, best, refusal = [], None, None
    # the fastest dense part first: a slower one is solved only where its step plus the tables' floor can win
    for zero, dense in sorted(options, key=lambda o: o[1].predicted["step_time_s"] if o[1] else float("inf")):
        if dense is None:
            tried.append({"zero_stage": zero, "refused": "the dense part does not fit"})
            continue
        dense_s, dense_hbm = dense.predicted["step_time_s"], dense.predicted["peak_memory_bytes"]
        if best is not None and dense_s + floor >= best[2] + best[1].step_s:
            tried.append({"zero_stage": zero, "dense_step_s": dense_s, "dense_hbm_bytes": dense_hbm,
                          "pruned": f"its dense step plus the tables' floor ({floor:.4g} s) is no faster"})
            continue
        try:
            sol = solve_tables(tables, accesses, ctx, dense_s=dense_s, dense_hbm=dense_hbm, fixed=fixed,
                               time_limit=sparse.time_limit, costs=costs)
        except PartitaError as e:  # infeasible, or pieces that do not pack: the other option may have room
            tried.append({"zero_stage": zero, "dense_step_s": dense_s, "dense_hbm_bytes": dense_hbm, "refused": str(e)})
            if refusal is None or dense_hbm < refusal[0]:  # the least dense memory's refusal names what fits nowhere
                refusal = (dense_hbm, e)
            continue
        solves_s += sol.wall_time_s
        tried.append({"zero_stage": zero, "dense_step_s": dense_s, "dense_hbm_bytes": dense_hbm,
                      "step_time_s": dense_s + sol.step_s})
        if best is None or dense_s + sol.step_s < best[2] + best[1].step_s:
            best = (dense, sol, dense_s, dense_hbm)
    if best is None:
        if refusal is not None:
            raise refusal[1]
        raise InfeasibleError(f"the dense part of {spec.name} fits on no rank, replicated or sharded over {R} ranks")
    plan, sol, dense_s, dense_hbm = best
    plan.embeddings = section(sol, tables, accesses, sparse.optimizer, source, dense_s)
    plan.embeddings["pricing"] = sparse.pricing
    plan.embeddings["dense"] = {"zero_stage": plan.zero_stage, "options": tried}
    _merge_predictions(plan, sol, dense_s, dense_hbm)
    plan.solver["embeddings"] = plan.embeddings["solver"]
    # the stable solver fields speak for the whole program: its gap is the embedding block's (of the whole step)
    plan.solver["mip_gap"] = max(plan.solver.get("mip_gap") or 0.0, sol.mip_gap)
    plan.solver["wall_time_s"] = plan.solver.get("wall_time_s", 0.0) + solves_s  # every dense option's table solve
    if sol.status != "optimal":
        plan.solver["status"] = sol.status
    plan.solver.pop("pipeline", None)  # the dense space has one stage by construction
    plan.model["parameters"] = plan.model.get("parameters", 0) + sum(t.params for t in tables)
    plan.solver["total_s"] = time.perf_counter() - t0
    return plan


def section(sol, tables, accesses, optimizer: str, source: str, dense_s: float) -> dict:
    rows = []
    for a in sol.assignments:
        o, c = a.option, a.cost
        access = accesses[a.table.name]
        miss = {"cache_miss_ratio": access.miss_ratio(o.cache_fraction * a.table.rows)} if o.placement == "cache" else {}
        where = ({"collection": a.table.collection, "key": a.table.key, "features": list(a.table.features)}
                 if a.table.collection else {})
        rows.append({"name": a.table.name, **where, "rows": a.table.rows, "dim": a.table.dim,
                     "pooling": access.pooling, **miss, "sharding": o.sharding, "placement": o.placement,
                     "cache_fraction": o.cache_fraction, "shards": o.shards, "ranks": list(a.ranks),
                     "predicted": {"lookup_s": c.lookup_s, "update_s": c.update_s, "comm_s": c.comm_s,
                                   "hbm_bytes": c.hbm_bytes, "host_bytes": c.host_bytes}})
    return {"schema": SECTION_SCHEMA, "optimizer": optimizer, "data": source, "tables": rows,
            "predicted": {"step_time_s": sol.step_s, "latency_s": sol.latency_s, "dense_step_s": dense_s,
                          "per_rank": {"time_s": sol.rank_time.tolist(), "hbm_bytes": sol.rank_hbm.tolist(),
                                       "host_bytes": sol.rank_host.tolist()}},
            "solver": {"status": sol.status, "formulation": sol.formulation, "mip_gap": sol.mip_gap,
                       "lower_bound_s": sol.lower_bound_s, "wall_time_s": sol.wall_time_s, "options": sol.options}}


def _merge_predictions(plan, sol, dense_s: float, dense_hbm: float) -> None:
    """The whole step: the dense plan's, then the slowest rank's tables (nothing overlaps them)."""
    pred = plan.predicted
    step = dense_s + sol.step_s
    scale = dense_s / step
    pred["step_time_s"] = step
    pred["tokens_per_s"] = plan.train["global_batch"] / step
    pred["samples_per_s"] = plan.train["global_batch"] / step
    pred["tflops_per_device"] *= scale
    pred["mfu"] *= scale
    pred["breakdown"]["embeddings_s"] = sol.step_s
    pred["peak_memory_bytes"] = dense_hbm + float(sol.rank_hbm.max(initial=0.0))
    pred["exposed_comm_s"] = pred.get("exposed_comm_s", 0.0) + _slowest_comm(sol)
    for stage in pred.get("memory_per_stage", []):
        stage["embeddings"] = float(sol.rank_hbm.max(initial=0.0))
        stage["total"] = stage.get("total", 0.0) + stage["embeddings"]


def _slowest_comm(sol) -> float:
    """Communication seconds on the slowest rank (its pieces' all-to-alls and reductions, and latency)."""
    import numpy as np
    comm = np.zeros(len(sol.rank_time))
    for a in sol.assignments:
        comm[list(a.ranks)] += a.cost.comm_s
    return float(comm[int(np.argmax(sol.rank_time))]) + sol.latency_s if len(comm) else 0.0


def validate_section(data, world_size: int) -> dict | None:
    """Check a plan's `embeddings` section (hand-written or solved); None where a plan has none."""
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

    from partita.planner.explain import human_bytes
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
    from partita.planner.explain import human_bytes
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

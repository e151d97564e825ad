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

The Plan gains a versioned `embeddings` section (SECTION_SCHEMA), which runtime.rec.run turns into TorchRec's
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

from partita.costmodel import ModelSpec
from partita.costmodel.sparse.embeddings import Table, dense_twin, load_sample, zipf_access
from partita.costmodel.errors import InfeasibleError, PartitaError
from partita.costmodel.hardware import Cluster
from partita.costmodel.sparse.costs import SparseContext
from partita.planner.sparse.embeddings import floor_s, option_costs, parse_fixed, solve_tables
from partita.planner.sparse.inputs import SparseInputs  # noqa: F401 (re-exported: planner.api takes it)
from partita.planner.plan.embeddings import DENSE_ZERO, SECTION_SCHEMA, validate_section  # noqa: F401 (re-exported)

"""The dense part's choices: replicated over every rank (DDP, as TorchRec's DistributedModelParallel runs it)
or sharded over them (FSDP2, ZeRO-3: parameters, gradients and optimizer state split R ways, gathered per
step)."""


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
    from partita.costmodel.capture import capture
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
    options = _dense_options(graph, cluster, train, spec, fingerprint, progress, dense_zero if R > 1 else (0,), local)
    best, tried, solves_s = _with_tables(options, tables, accesses, ctx, fixed, sparse, costs, floor_s(costs, ctx),
                                         spec.name)
    plan, sol, dense_s, dense_hbm = best
    plan.embeddings = section(sol, tables, accesses, sparse.optimizer, source, dense_s)
    plan.embeddings["pricing"] = sparse.pricing
    plan.embeddings["dense"] = {"zero_stage": plan.zero_stage, "options": tried}
    _merge_predictions(plan, sol, dense_s, dense_hbm)
    _merge_solver(plan, sol, solves_s)
    plan.model["parameters"] = plan.model.get("parameters", 0) + sum(t.params for t in tables)
    plan.solver["total_s"] = time.perf_counter() - t0
    return plan


def _dense_options(graph, cluster: Cluster, train, spec: ModelSpec, fingerprint: str, progress,
                   zeros: tuple[int, ...], local: int) -> list[tuple[int, object]]:
    """(ZeRO stage, the dense part's Plan or None where it does not fit) for each stage: one stage of R
    data-parallel ranks, one micro-batch of the whole local batch."""
    from partita.planner.estimate.build import build_plan
    from partita.planner.search import search
    from partita.planner.enumerate.space import SearchSpace
    R, options = cluster.num_devices, []
    for zero in zeros:
        dense_space = SearchSpace(tp=(1,), pp=(1,), dp=(R,), cp=(1,), ep=(1,), zero=(zero,), offload=False,
                                  recompute=("none",), micro_batch=(local,))
        result = search(graph, cluster, train, progress=progress, space=dense_space, raise_infeasible=False)
        options.append((zero, build_plan(result, spec.name, fingerprint, spec.config) if result.best else None))
    return options


def _with_tables(options, tables, accesses, ctx: SparseContext, fixed, sparse: SparseInputs, costs, floor: float,
                 name: str) -> tuple[tuple, list[dict], float]:
    """The tables' block solved beside each dense option, the fastest dense part first (a slower one only where
    its step plus the tables' floor can win): ((dense plan, tables' solution, dense seconds, dense HBM) of the
    fastest step, what each option gave, the tables' solve seconds); the refusal of the option with the least
    dense memory where none fits."""
    tried, best, refusal, solves_s = [], None, None, 0.0
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
        raise InfeasibleError(f"the dense part of {name} fits on no rank, replicated or sharded over {ctx.ranks} ranks")
    return best, tried, solves_s


def _merge_solver(plan, sol, solves_s: float) -> None:
    """The plan's solver section speaks for the whole program: the tables' block beside the dense part's."""
    plan.solver["embeddings"] = plan.embeddings["solver"]
    # the stable solver fields speak for the whole program: its gap is the embedding block's (of the whole step)
    plan.solver["mip_gap"] = max(plan.solver.get("mip_gap") or 0.0, sol.mip_gap)
    plan.solver["wall_time_s"] = plan.solver.get("wall_time_s", 0.0) + solves_s  # every dense option's table solve
    if sol.status != "optimal":
        plan.solver["status"] = sol.status
    plan.solver.pop("pipeline", None)  # the dense space has one stage by construction


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

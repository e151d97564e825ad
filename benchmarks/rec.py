"""Recommendation models (issue 28): partita's embedding program against TorchRec's EmbeddingShardingPlanner, and
whole-step predictions of DLRM against published measurements.

    python -m benchmarks.rec            # writes benchmarks/results/rec.json (about 40 minutes on 2 cores)
    python -m benchmarks.rec --quick    # 6 instances, no 500-table case

Three parts, each on the same models and topologies for both planners:

1. Synthetic instances (INSTANCES of them, seeded): table counts 8-200, rows drawn log-uniform and scaled so the
   tables fill 5-120% of the cluster's HBM, widths 32-256, Zipf skews 0.6-1.3, pooling factors 1-40, on five
   topologies (8 x A100-40GB ... 4 x 8 x H100-80GB, 1,024 samples per rank). Each planner plans the tables alone
   (no dense part: TorchRec's planner does not price one); TorchRec's topology gets partita's device figures
   (usable HBM, host memory, the fitted HBM rate, host link, NVLink and NIC rates), so both see one machine.
   Each plan is scored by TorchRec's own estimator -- its EmbeddingPerfEstimator's per-shard times summed per
   rank, the slowest rank (NoopPerfModel, what its planner minimises) -- and by partita's cost model. Reported:
   whether each found a plan, planning seconds, both scores, and partita's margin under TorchRec's estimator,
   1 - torchrec_score(partita's plan) / torchrec_score(TorchRec's plan), over all and over the large instances
   (16 ranks or more, or 64 tables or more). Instances stop at 96 tables: TorchRec's planner needs 3-5 minutes
   for 200 tables on this machine, which 50 instances cannot afford.
2. The Criteo DLRM (dlrm-criteo-1tb) on 8 x A100-40GB, and 500 tables of 2e9 parameters (1T) on 16 x 8 x
   A100-80GB: whole planning time (capture, dense search, embedding program) and the stated gap; TorchRec's
   planner on the same tables, stopped after TORCHREC_TIMEOUT_S.
3. Published DLRM training throughput (PUBLISHED, with sources): partita's whole-step prediction (dense part
   and tables) and its error, predicted / measured - 1, as benchmarks.published reports errors.
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np

import benchmarks.common as common

INSTANCES = 50
TOPOLOGIES = ("8xA100-40GB", "8xA100-80GB", "2x8xA100-80GB", "8xV100-32GB", "4x8xH100-80GB")
LOCAL_BATCH = 1024
TORCHREC_TIMEOUT_S = 240
"""TorchRec's own planning time limit (its proposals loop; enumerating the options comes before it)."""
LARGE_RANKS, LARGE_TABLES = 16, 64

# NVIDIA DeepLearningExamples, PyTorch/Recommendation/DLRM/README.md (commit 729963dd, 2024-04-04), "Training
# performance results": records/s averaged over an epoch, mixed precision (fp32 tables, fp16 MLPs), the DLRM of
# this repository's dlrm-criteo-1tb architecture (dim 128, bottom 512-256-128, top 1024-1024-512-256-1, dot
# interaction) on Criteo Terabyte preprocessed with frequency threshold 3 ("large", 82 GB of tables) or 15
# ("small", 15 GB). The tables' row counts per threshold are not published: the Criteo 40M-capped tables scaled
# to the published total (TABLE_GB) stand in for them.
DLE = "NVIDIA DeepLearningExamples DLRM README (PyTorch, commit 729963dd), Training performance results"
PUBLISHED = (
    {"key": "dgxa100-8gpu-large", "cluster": "8xA100-80GB", "per_gpu_batch": 8192, "variant": "large",
     "records_per_s": 16_500_000, "source": DLE + ": DGX A100 (8x A100 80GB), 8 GPUs, 8k per GPU, mixed precision"},
    {"key": "dgxa100-1gpu-small", "cluster": "1xA100-80GB", "per_gpu_batch": 65536, "variant": "small",
     "records_per_s": 4_020_000, "source": DLE + ": DGX A100 (8x A100 80GB), 1 GPU, 64k, mixed precision"},
    {"key": "dgx1-8gpu-large", "cluster": "8xV100-32GB", "per_gpu_batch": 8192, "variant": "large",
     "records_per_s": 6_920_000, "source": DLE + ": DGX-1 (8x V100 32GB), 8 GPUs, 8k per GPU, mixed precision"},
    {"key": "dgx2-16gpu-large", "cluster": "16xV100-32GB", "per_gpu_batch": 4096, "variant": "large",
     "records_per_s": 10_800_000, "source": DLE + ": DGX-2 (16x V100 32GB), 16 GPUs, 4k per GPU, mixed precision"},
    {"key": "dgx2-8gpu-large", "cluster": "8xV100-32GB", "per_gpu_batch": 8192, "variant": "large",
     "records_per_s": 7_930_000, "source": DLE + ": DGX-2 (16x V100 32GB), 8 GPUs, 8k per GPU, mixed precision"},
    {"key": "dgx1-1gpu-small", "cluster": "1xV100-32GB", "per_gpu_batch": 65536, "variant": "small",
     "records_per_s": 2_090_000, "source": DLE + ": DGX-1 (8x V100 32GB), 1 GPU, 64k, mixed precision"},
)
TABLE_GB = {"large": 82, "small": 15}
"""The published model sizes (GB of fp32 tables) of the two preprocessing variants (same README, "Results")."""


# ----------------------------------------------------------------------------------------------- instances

def instances(n: int = INSTANCES, seed: int = 0) -> list[dict]:
    from partita.costmodel.hardware import parse_cluster
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        cluster = TOPOLOGIES[i % len(TOPOLOGIES)]
        cl = parse_cluster(cluster)
        count = int(rng.choice([8, 16, 32, 64, 96]))
        dims = rng.choice([32, 64, 128, 256], size=count)
        raw = 10 ** rng.uniform(3, 8, size=count)
        fill = rng.uniform(0.05, 1.2)
        target = fill * cl.num_devices * cl.device.usable_memory(flat=True)
        rows = np.maximum(100, raw * target / float(np.sum(raw * dims * 4))).astype(np.int64)
        out.append({"name": f"i{i:02d}", "cluster": cluster, "ranks": cl.num_devices, "fill": round(float(fill), 3),
                    "alpha": round(float(rng.uniform(0.6, 1.3)), 3),
                    "tables": [{"name": f"t{j}", "rows": int(r), "dim": int(d),
                                "pooling": float(rng.choice([1, 2, 5, 10, 20, 40]))}
                               for j, (r, d) in enumerate(zip(rows, dims))]})
    return out


def _large(inst: dict) -> bool:
    return inst["ranks"] >= LARGE_RANKS or len(inst["tables"]) >= LARGE_TABLES


# ------------------------------------------------------------------------------------------------- partita

def _partita_inputs(inst: dict, pricing: str = "partita"):
    from partita.costmodel.sparse.embeddings import Table, zipf_access
    from partita.costmodel.hardware import parse_cluster
    from partita.costmodel.sparse.costs import SparseContext
    tables = [Table(name=t["name"], rows=t["rows"], dim=t["dim"]) for t in inst["tables"]]
    accesses = {t["name"]: zipf_access(t["rows"], inst["alpha"], t["pooling"]) for t in inst["tables"]}
    cl = parse_cluster(inst["cluster"])
    return tables, accesses, SparseContext(cluster=cl, global_batch=LOCAL_BATCH * cl.num_devices, pricing=pricing)


def partita_plan(inst: dict, pricing: str = "partita") -> dict:
    """partita's embedding program on `inst`, its pieces priced by partita's model or by TorchRec's estimator."""
    from partita.costmodel.errors import PartitaError
    from partita.planner.sparse.embeddings import solve_tables
    tables, accesses, ctx = _partita_inputs(inst, pricing)
    t0 = time.perf_counter()
    try:
        sol = solve_tables(tables, accesses, ctx, dense_s=0.0, dense_hbm=0.0)
    except PartitaError as e:
        return {"found": False, "seconds": time.perf_counter() - t0, "why": str(e)[:200]}
    choices = [{"name": a.table.name, "sharding": a.option.sharding, "placement": a.option.placement,
                "cache_fraction": a.option.cache_fraction, "shards": a.option.shards, "ranks": list(a.ranks)}
               for a in sol.assignments]
    return {"found": True, "seconds": time.perf_counter() - t0, "choices": choices, "gap": sol.mip_gap,
            "formulation": sol.formulation}


def partita_score(inst: dict, choices: list[dict]) -> float:
    """partita's step seconds of the tables under `choices` (slowest rank + the collectives' latency)."""
    from partita.costmodel.sparse.costs import Option, collective_latency, piece_cost
    tables, accesses, ctx = _partita_inputs(inst)
    by_name = {t.name: t for t in tables}
    load = np.zeros(ctx.ranks)
    for c in choices:
        # TorchRec's table_column_wise (column pieces kept on one node) is priced as partita's column_wise
        kind = "column_wise" if c["sharding"] == "table_column_wise" else c["sharding"]
        option = Option(sharding=kind, placement=c["placement"], shards=c["shards"],
                        cache_fraction=c["cache_fraction"])
        load[c["ranks"]] += piece_cost(by_name[c["name"]], accesses[c["name"]], option, ctx).time_s
    return float(load.max()) + sum(collective_latency(ctx, k) for k in {c["sharding"] for c in choices})


# ------------------------------------------------------------------------------------------------- TorchRec

def _quiet():
    import logging
    import warnings
    warnings.filterwarnings("ignore")
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    logging.getLogger().setLevel(logging.ERROR)  # TorchRec's enumerator warns on the root logger


def _topology(cluster: str):
    from partita.costmodel.hardware import parse_cluster
    from partita.costmodel.sparse.torchrec_costs import topology
    return topology(parse_cluster(cluster))


def _module(inst: dict):
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    return EmbeddingBagCollection(device=torch.device("meta"), tables=[
        EmbeddingBagConfig(name=t["name"], embedding_dim=t["dim"], num_embeddings=t["rows"],
                           feature_names=[t["name"]]) for t in inst["tables"]])


def torchrec_plan(inst: dict, timeout_s: int = TORCHREC_TIMEOUT_S) -> dict:
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import ParameterConstraints
    _quiet()
    constraints = {t["name"]: ParameterConstraints(pooling_factors=[t["pooling"]]) for t in inst["tables"]}
    planner = EmbeddingShardingPlanner(topology=_topology(inst["cluster"]), batch_size=LOCAL_BATCH,
                                       constraints=constraints, timeout_seconds=timeout_s, debug=False)
    t0 = time.perf_counter()
    try:
        plan = planner.plan(_module(inst), [EmbeddingBagCollectionSharder()])
    except Exception as e:  # noqa: BLE001 -- TorchRec's PlannerError, or its own crash
        return {"found": False, "seconds": time.perf_counter() - t0, "why": f"{type(e).__name__}: {str(e)[:200]}"}
    seconds = time.perf_counter() - t0
    per_node = _topology(inst["cluster"]).local_world_size
    kernels = {"fused": "hbm", "fused_uvm": "host", "fused_uvm_caching": "cache", "dense": "hbm"}
    choices = []
    module_plan = next(iter(plan.plan.values()))
    for t in inst["tables"]:
        ps = module_plan[t["name"]]
        ranks = list(ps.ranks)
        if ps.sharding_type == "table_row_wise":
            ranks = list(range(ranks[0] // per_node * per_node, ranks[0] // per_node * per_node + per_node))
        cache = ps.cache_params.load_factor if ps.cache_params and ps.cache_params.load_factor else 0.2
        choices.append({"name": t["name"], "sharding": ps.sharding_type, "placement": kernels[ps.compute_kernel],
                        "cache_fraction": cache if ps.compute_kernel == "fused_uvm_caching" else 0.0,
                        "shards": len(ranks) if "column_wise" in ps.sharding_type else 1, "ranks": ranks})
    return {"found": True, "seconds": seconds, "choices": choices}


def torchrec_score(inst: dict, choices: list[dict]) -> dict:
    """TorchRec's estimate of the plan `choices`: its per-shard perf summed per rank, the slowest rank (ms),
    and whether its storage estimate fits every rank's HBM and host memory."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.perf_models import NoopPerfModel
    from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator, EmbeddingStorageEstimator
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import CacheParams
    _quiet()
    kernels = {"hbm": "fused", "host": "fused_uvm", "cache": "fused_uvm_caching"}
    dims = {t["name"]: t for t in inst["tables"]}
    constraints = {}
    for c in choices:
        t = dims[c["name"]]
        kernel = "dense" if c["sharding"] == "data_parallel" else kernels[c["placement"]]
        constraints[c["name"]] = ParameterConstraints(
            sharding_types=[c["sharding"]], compute_kernels=[kernel], pooling_factors=[t["pooling"]],
            min_partition=t["dim"] // c["shards"] if "column_wise" in c["sharding"] else None,
            cache_params=CacheParams(load_factor=c["cache_fraction"]) if c["placement"] == "cache" else None)
    topology = _topology(inst["cluster"])
    enumerator = EmbeddingEnumerator(topology=topology, batch_size=LOCAL_BATCH, constraints=constraints,
                                     estimator=[EmbeddingPerfEstimator(topology, constraints),
                                                EmbeddingStorageEstimator(topology, constraints)])
    options = {o.name: o for o in enumerator.enumerate(_module(inst), [EmbeddingBagCollectionSharder()])}
    hbm, ddr = np.zeros(topology.world_size), np.zeros(topology.world_size)
    for c in choices:
        o = options[c["name"]]
        ranks = c["ranks"] if len(o.shards) == len(c["ranks"]) else list(range(len(o.shards)))
        for shard, rank in zip(o.shards, ranks):
            shard.rank = rank
            hbm[rank] += shard.storage.hbm
            ddr[rank] += shard.storage.ddr
    rated = NoopPerfModel(topology).rate(list(options.values()))
    return {"ms": float(rated), "fits": bool(hbm.max() <= topology.devices[0].storage.hbm
                                             and ddr.max() <= topology.devices[0].storage.ddr)}


# --------------------------------------------------------------------------------------- the comparisons

def compare(inst: dict) -> dict:
    ours, theirs = partita_plan(inst), torchrec_plan(inst)
    ours_tr = partita_plan(inst, pricing="torchrec")
    row = {"name": inst["name"], "cluster": inst["cluster"], "tables": len(inst["tables"]), "fill": inst["fill"],
           "alpha": inst["alpha"], "large": _large(inst)}
    plans = (("partita", ours), ("partita_torchrec_costs", ours_tr), ("torchrec", theirs))
    for who, res in plans:
        row[who] = {k: v for k, v in res.items() if k != "choices"}
        if res["found"]:
            row[who]["shardings"] = sorted({c["sharding"] + "/" + c["placement"] for c in res["choices"]})
            try:
                row[who]["torchrec_ms"] = torchrec_score(inst, res["choices"])
                row[who]["partita_s"] = partita_score(inst, res["choices"])
            except Exception as e:  # noqa: BLE001 -- a plan one side cannot score is reported, not fatal
                row[who]["score_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    scored = lambda who: "torchrec_ms" in row[who] and "partita_s" in row[who]  # noqa: E731
    if scored("partita") and scored("torchrec"):
        row["margin_torchrec_estimator"] = 1 - row["partita"]["torchrec_ms"]["ms"] / row["torchrec"]["torchrec_ms"]["ms"]
        row["margin_partita_model"] = 1 - row["partita"]["partita_s"] / row["torchrec"]["partita_s"]
    if scored("partita_torchrec_costs") and scored("torchrec"):
        row["margin_torchrec_costs"] = (1 - row["partita_torchrec_costs"]["torchrec_ms"]["ms"]
                                        / row["torchrec"]["torchrec_ms"]["ms"])
    return row


def summary(rows: list[dict]) -> dict:
    both = [r for r in rows if "margin_torchrec_estimator" in r]
    large = [r for r in both if r["large"]]
    same = [r for r in rows if "margin_torchrec_costs" in r]
    median = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    return {"instances": len(rows), "torchrec_found": sum(r["torchrec"]["found"] for r in rows),
            "partita_found": sum(r["partita"]["found"] for r in rows),
            "partita_found_where_torchrec_did": all(r["partita"]["found"] for r in rows if r["torchrec"]["found"]),
            "compared": len(both), "large": len(large),
            "partita_worse_by_torchrec_estimator": sum(r["margin_torchrec_estimator"] < -1e-9 for r in both),
            "median_margin_torchrec_estimator": median([r["margin_torchrec_estimator"] for r in both]),
            "median_margin_torchrec_estimator_large": median([r["margin_torchrec_estimator"] for r in large]),
            "min_margin_torchrec_estimator": min((r["margin_torchrec_estimator"] for r in both), default=None),
            "median_margin_partita_model": median([r["margin_partita_model"] for r in both]),
            "median_seconds": {"partita": median([r["partita"]["seconds"] for r in rows]),
                               "torchrec": median([r["torchrec"]["seconds"] for r in rows])},
            "max_seconds": {"partita": max(r["partita"]["seconds"] for r in rows),
                            "torchrec": max(r["torchrec"]["seconds"] for r in rows)},
            "torchrec_costs": {
                "note": "partita's program with TorchRec's own estimator pricing the pieces (--embedding-costs "
                        "torchrec): the same objective as TorchRec's planner, so the margin is the search's alone",
                "found": sum(r["partita_torchrec_costs"]["found"] for r in rows),
                "found_where_torchrec_did": all(r["partita_torchrec_costs"]["found"] for r in rows
                                                if r["torchrec"]["found"]),
                "compared": len(same),
                "fits_by_torchrec_storage": sum(r["partita_torchrec_costs"]["torchrec_ms"]["fits"] for r in same),
                "worse_by_torchrec_estimator": sum(r["margin_torchrec_costs"] < -1e-9 for r in same),
                "median_margin": median([r["margin_torchrec_costs"] for r in same]),
                "median_margin_large": median([r["margin_torchrec_costs"] for r in same if r["large"]]),
                "min_margin": min((r["margin_torchrec_costs"] for r in same), default=None),
                "median_seconds": median([r["partita_torchrec_costs"]["seconds"] for r in rows]),
                "max_seconds": max(r["partita_torchrec_costs"]["seconds"] for r in rows)}}


# ------------------------------------------------------------------------------------- scale and published

def whole_plan(model: str, cluster: str, batch: int, zipf: float | None = None) -> tuple[dict, float]:
    from partita.planner.api import plan
    from partita.planner.sparse.rec_plan import SparseInputs
    from partita.planner.search import TrainConfig
    t0 = time.perf_counter()
    p = plan(model, cluster=cluster, train=TrainConfig(global_batch=batch), sparse=SparseInputs(zipf=zipf))
    return p.to_dict(), time.perf_counter() - t0


def scale_case(name: str, model: str, cluster: str, batch: int, timeout_s: int) -> dict:
    from partita.costmodel.sparse.embeddings import find_tables
    from partita.costmodel.models import resolve_model
    import torch
    d, seconds = whole_plan(model, cluster, batch, zipf=1.05)
    e = d["embeddings"]
    with torch.device("meta"):
        tables = find_tables(resolve_model(model).build())
    inst = {"name": name, "cluster": cluster, "alpha": 1.05,
            "tables": [{"name": t.name.replace(".", "__"), "rows": t.rows, "dim": t.dim, "pooling": 1.0}
                       for t in tables]}
    from partita.costmodel.hardware import parse_cluster
    ranks = parse_cluster(cluster).num_devices
    theirs = torchrec_plan(dict(inst, ranks=ranks), timeout_s=timeout_s) if batch // ranks == LOCAL_BATCH else \
        {"found": None}
    return {"name": name, "model": model, "cluster": cluster, "global_batch": batch,
            "parameters": sum(t.params for t in tables), "tables": len(tables),
            "partita": {"seconds": seconds, "embedding_program_s": e["solver"]["wall_time_s"],
                        "gap": e["solver"]["mip_gap"], "status": e["solver"]["status"],
                        "formulation": e["solver"]["formulation"], "step_time_s": d["predicted"]["step_time_s"]},
            "torchrec": {k: v for k, v in theirs.items() if k != "choices"}}


def published_rows() -> list[dict]:
    from partita.costmodel.models.dlrm import CRITEO_1TB_ROWS
    out = []
    for row in PUBLISHED:
        scale = TABLE_GB[row["variant"]] * 1e9 / (sum(CRITEO_1TB_ROWS) * 128 * 4)
        rows = "-".join(str(max(1, round(r * scale))) for r in CRITEO_1TB_ROWS)
        ranks = int(row["cluster"].split("x")[0])
        batch = row["per_gpu_batch"] * ranks
        d, seconds = whole_plan(f"dlrm:tables=26,rows={rows},dim=128", row["cluster"], batch)
        measured = batch / row["records_per_s"]
        predicted = d["predicted"]["step_time_s"]
        out.append({**row, "global_batch": batch, "measured_step_s": measured, "predicted_step_s": predicted,
                    "error": predicted / measured - 1, "dense_step_s": d["embeddings"]["predicted"]["dense_step_s"],
                    "tables_step_s": d["embeddings"]["predicted"]["step_time_s"], "plan_seconds": seconds,
                    "shardings": sorted({t["sharding"] + "/" + t["placement"] for t in d["embeddings"]["tables"]})})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.rec", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="6 instances and no 1T case (a smoke run)")
    ap.add_argument("--resume", action="store_true", help="keep the instances an interrupted run finished")
    args = ap.parse_args(argv)
    import partita.planner.api  # noqa: F401 -- everything imported before the first case: edits during a
    import partita.planner.sparse.rec_plan  # noqa: F401 -- run do not mix two versions of the code
    import torchrec.distributed.planner  # noqa: F401
    import json
    partial = common.RESULTS / "rec.partial.jsonl"  # rows so far: --resume continues an interrupted run
    done = ({json.loads(line)["name"]: json.loads(line) for line in partial.read_text().splitlines()}
            if args.resume and partial.exists() else {})
    if not args.resume:
        partial.unlink(missing_ok=True)
    rows = []
    for inst in instances(6 if args.quick else INSTANCES):
        if inst["name"] in done:
            rows.append(done[inst["name"]])
            continue
        rows.append(compare(inst))
        common.RESULTS.mkdir(parents=True, exist_ok=True)
        with partial.open("a") as f:
            f.write(json.dumps(rows[-1]) + "\n")
        r = rows[-1]
        print(f"{r['name']} {r['cluster']:>14} {r['tables']:>4} tables fill {r['fill']:.2f}: partita "
              f"{r['partita']['seconds']:.2f}s torchrec {r['torchrec']['seconds']:.2f}s margin "
              f"{r.get('margin_torchrec_estimator', math.nan):+.3f}; with TorchRec's costs "
              f"{r['partita_torchrec_costs']['seconds']:.2f}s margin {r.get('margin_torchrec_costs', math.nan):+.3f}",
              flush=True)
    scale = [scale_case("criteo", "dlrm-criteo-1tb", "8xA100-40GB", 8 * LOCAL_BATCH, TORCHREC_TIMEOUT_S)]
    if not args.quick:
        scale.append(scale_case("1t-500-tables", "dlrm:tables=500,rows=15625000,dim=128", "16x8xA100-80GB",
                                128 * LOCAL_BATCH, TORCHREC_TIMEOUT_S))
    published = published_rows()
    errors = [abs(r["error"]) for r in published]
    path = common.write("rec", {"quick": args.quick, "local_batch": LOCAL_BATCH, "torchrec_timeout_s": TORCHREC_TIMEOUT_S,
                                "instances": rows, "summary": summary(rows), "scale": scale, "published": published,
                                "published_summary": {"rows": len(published), "median_abs_error": statistics.median(errors),
                                                      "max_abs_error": max(errors)}})
    partial.unlink(missing_ok=True)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

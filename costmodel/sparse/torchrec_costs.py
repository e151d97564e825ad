"""TorchRec's own estimate of what a table piece costs: a second pricing for the embedding program.

partita prices a piece by the bytes it moves at the rate of the memory they live in (costmodel.sparse.costs).
TorchRec's planner prices it with its EmbeddingPerfEstimator (a bandwidth roofline with hand-set factors: a
fused_uvm_caching lookup, for one, runs at a blend of HBM and host rates divided by 10) and sizes it with its
EmbeddingStorageEstimator; its planner then proposes plans greedily and scores a plan by its slowest rank,

    T = max_r sum_{shards on r} perf(shard).total          (perf_models.NoopPerfModel)

which is the embedding program's objective with per-piece costs c_to and no per-collective latency. So with
these costs in place of costmodel.sparse.costs's, partita's program optimises exactly what TorchRec's planner does,
over the same sharding types and kernels, and the two plans differ only by their search. Where a user has set
TorchRec's estimator up for their machine (or trusts it over partita's byte model), `--embedding-costs
torchrec` plans by it.

What it needs: TorchRec (the `rec` extra). What it costs: one TorchRec enumeration of the tables per cache
fraction and column split partita offers (TorchRec builds every option of every table in each), seconds for
a hundred tables.

Mapping (TorchRec docs, "Sharding"): placement hbm / cache / host is the compute kernel fused /
fused_uvm_caching / fused_uvm, a cache's fraction TorchRec's CacheParams.load_factor, data_parallel the
"dense" kernel; column_wise into k pieces is TorchRec's column_wise with min_partition = dim / k. A piece's
cost is the largest of the option's shards (TorchRec's last row-wise shard may be smaller), its time the
shard's Perf.total in seconds (lookup: forward compute and prefetch; update: backward compute; comm: forward
and backward comms), its memory the shard's Storage (HBM and DDR bytes).
"""
from __future__ import annotations

import logging
import warnings

from partita.costmodel.sparse.embeddings import Access, Table
from partita.costmodel.errors import PartitaError
from partita.costmodel.hardware import Cluster
from partita.costmodel.sparse.costs import TORCHREC_KERNELS, Option, PieceCost, SparseContext
from partita.costmodel.sparse.names import PRICINGS  # noqa: F401 (re-exported)

MS = 1e-3


def _quiet() -> None:
    warnings.filterwarnings("ignore", module="torchrec")
    logging.getLogger("torchrec").setLevel(logging.ERROR)


def topology(cluster: Cluster):
    """TorchRec's Topology of `cluster`, with partita's device figures: usable HBM, host memory, the fitted
    HBM rate, the host link, NVLink and NIC rates (TorchRec's bandwidths are bytes per millisecond)."""
    from torchrec.distributed.planner.types import Topology
    _quiet()
    d = cluster.device
    per_ms = MS
    return Topology(world_size=cluster.num_devices, compute_device="cuda", hbm_cap=int(d.usable_memory(flat=True)),
                    ddr_cap=int(d.host_memory_bytes), local_world_size=cluster.devices_per_node,
                    hbm_mem_bw=d.mem_bandwidth * d.mem_efficiency * per_ms, ddr_mem_bw=d.host_bw * per_ms,
                    hbm_to_ddr_mem_bw=d.host_bw * per_ms,
                    intra_host_bw=d.intra_node_bw * d.intra_link_efficiency * per_ms,
                    inter_host_bw=d.inter_node_bw * d.inter_link_efficiency * per_ms)


def collection(tables: list[Table]):
    """A meta-device EmbeddingBagCollection of `tables`, table i named "t{i}" (TorchRec's names key a
    ModuleDict, where a module path's dots are not allowed), fp16 where the table is."""
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.types import DataType
    return EmbeddingBagCollection(device=torch.device("meta"), tables=[
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=t.dim, num_embeddings=t.rows, feature_names=[f"t{i}"],
                           data_type=DataType.FP16 if t.weight_bytes == 2 else DataType.FP32)
        for i, t in enumerate(tables)])


def _kernel(o: Option) -> str:
    return "dense" if o.sharding == "data_parallel" else TORCHREC_KERNELS[o.placement]


def _enumerate(tables: list[Table], accesses: dict[str, Access], ctx: SparseContext, split: dict[int, int],
               cache: float, kinds: list[str] | None, kernels: list[str] | None) -> dict:
    """{(table index, sharding, kernel, shards): TorchRec's ShardingOption} of the sharding types `kinds` and
    compute kernels `kernels` (None: all), column pieces split[i] for table i, cache load factor `cache`."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator, EmbeddingStorageEstimator
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import CacheParams
    topo = topology(ctx.cluster)
    constraints = {f"t{i}": ParameterConstraints(
        sharding_types=kinds, compute_kernels=kernels, pooling_factors=[accesses[t.name].pooling],
        min_partition=t.dim // split[i] if i in split else None,
        cache_params=CacheParams(load_factor=cache) if cache > 0 else None) for i, t in enumerate(tables)}
    enumerator = EmbeddingEnumerator(topology=topo, batch_size=max(1, round(ctx.global_batch / ctx.ranks)),
                                     constraints=constraints,
                                     estimator=[EmbeddingPerfEstimator(topo, constraints),
                                                EmbeddingStorageEstimator(topo, constraints)])
    return {(int(o.name[1:]), o.sharding_type, o.compute_kernel, len(o.shards)): o
            for o in enumerator.enumerate(collection(tables), [EmbeddingBagCollectionSharder()])}


def _piece(option, pieces: int) -> PieceCost:
    """The largest shard of TorchRec's ShardingOption as a partita piece."""
    shard = max(option.shards, key=lambda s: s.perf.total)
    perf = shard.perf
    return PieceCost(lookup_s=(perf.fwd_compute + perf.prefetch_compute) * MS, update_s=perf.bwd_compute * MS,
                     comm_s=(perf.fwd_comms + perf.bwd_comms) * MS,
                     hbm_bytes=float(max(s.storage.hbm for s in option.shards)),
                     host_bytes=float(max(s.storage.ddr for s in option.shards)), pieces=pieces)


def torchrec_costs(tables: list[Table], accesses: dict[str, Access], ctx: SparseContext,
                   options: list[list[Option]]) -> list[list[tuple[Option, PieceCost]]]:
    """Per table, those of its `options` TorchRec enumerates, each with TorchRec's cost of one piece."""
    try:
        import torchrec  # noqa: F401
    except ImportError as e:
        raise PartitaError("--embedding-costs torchrec prices tables with TorchRec's estimator, which needs "
                           "TorchRec: pip install 'partita[rec]'") from e
    _quiet()
    if ctx.optimizer != "rowwise_adagrad":
        raise PartitaError(f"TorchRec's estimator prices its default optimizer (row-wise Adagrad), not "
                           f"{ctx.optimizer}; use --embedding-costs partita")
    fractions = sorted({o.cache_fraction for opts in options for o in opts if o.placement == "cache"}) or [0.0]
    splits = sorted({o.shards for opts in options for o in opts if o.sharding == "column_wise"}) or [1]
    found: dict = {}
    # one enumeration of everything at the first split and cache fraction, then only what the others change:
    # column_wise options at the other splits, caching kernels at the other fractions
    for n, k in enumerate(splits):
        split = {i: k for i, opts in enumerate(options)
                 if any(o.sharding == "column_wise" and o.shards == k for o in opts)}
        for m, f in enumerate(fractions):
            kinds = None if n == 0 else ["column_wise"]
            kernels = None if m == 0 else [TORCHREC_KERNELS["cache"]]
            for key, o in _enumerate(tables, accesses, ctx, split, f, kinds, kernels).items():
                found.setdefault((*key, f if key[2] == TORCHREC_KERNELS["cache"] else 0.0), o)
    out = []
    for i, (t, opts) in enumerate(zip(tables, options)):
        priced = []
        for o in opts:
            n = ctx.ranks if o.sharding in ("data_parallel", "row_wise") else \
                ctx.node().size if o.sharding == "table_row_wise" else o.shards
            frac = o.cache_fraction if o.placement == "cache" else 0.0
            if (hit := found.get((i, o.sharding, _kernel(o), n, frac))) is not None:
                priced.append((o, _piece(hit, n)))
        if opts and not priced:
            raise PartitaError(f"table {t.name}: TorchRec's estimator prices none of its options "
                               f"({', '.join(o.describe() for o in opts)}); use --embedding-costs partita")
        out.append(priced)
    return out

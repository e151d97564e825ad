"""What an embedding table costs per training step, by how it is sharded and where its rows live.

Embedding lookups and their fused optimizer updates are memory-bound (Naumov et al., "Deep Learning
Recommendation Model for Personalization and Recommendation Systems", 2019; Mudigere et al., "Software-
Hardware Co-design for Fast and Scalable Training of Deep Learning Recommendation Models", ISCA'22, Sec. 4:
FBGEMM's table-batched embedding (TBE) kernels read one row per ID and run at memory bandwidth): each
byte is priced at the rate of the memory it lives in, with the device's own constants
(costmodel.hardware.Device), no new ones:

    HBM                      Device.mem_bandwidth x Device.mem_efficiency   (the fitted memory-bound rate)
    host DRAM through UVM    Device.host_bw                                 (the host link, as offload)
    HBM cache before host    hits at the HBM rate, misses m(c) at the host rate (costmodel.sparse.embeddings)

The placements are FBGEMM's EmbeddingLocation DEVICE, MANAGED (UVM) and MANAGED_CACHING -- TorchRec's
compute kernels "fused", "fused_uvm" and "fused_uvm_caching" (TorchRec docs, "Sharding"); Neo (Mudigere et
al. Sec. 4.2) and RecShard (Sethi et al., ASPLOS'22) price the latter two by the share of accesses that
reach host memory, as here.

Notation: B the global batch, R ranks, b = B / R, L the pooling factor, d the width of a piece, w the bytes
of a table's weight (4 for TorchRec's default fp32 tables, 2 for FP16 ones; Table.weight_bytes) -- pooled bags,
their gradients and what the all-to-alls move are fp32 whatever the table (TorchRec's default output dtype),
i = 8 bytes per ID (int64 KJT values) plus 4 per bag (its
length), n = B L lookups a step, U(n) distinct rows among them, s the optimizer state bytes per row
(row-wise Adagrad 4, Adam 8 d, SGD 0 -- FBGEMM's EXACT_ROWWISE_ADAGRAD, ADAM and SGD), m the miss ratio of
the piece's cache.

    lookup (forward)   reads n_p rows and writes the pooled bags:     n_p d w + bags d w  bytes
    update (backward, fused with the optimizer, as TBE does): reads each lookup's bag gradient, then reads
                       and writes each distinct row and its state:    n_p d w + U_p (2 d w + 2 s)
    on host (UVM): row and state bytes move at host_bw, pooled outputs and gradients at the HBM rate;
    cached: misses m n_p d w are read from host and written into the cache, and as many evicted rows are
    written back in the backward; the optimizer state stays in host memory with the table (FBGEMM caches
    weights only). The cache's HBM: its rows (d w each), 16 bytes of state a slot (CACHE_SLOT_BYTES) and 4
    bytes for every row of the piece, cached or not (CACHE_MAP_BYTES). Every lookup also pays the cache's
    bookkeeping, hit or miss, c = 540 bytes of HBM
    traffic (CACHE_PROBE_BYTES): FBGEMM's cache is set-associative with 32 int64 tags a set
    (split_table_batched_embeddings_ops_training.DEFAULT_ASSOC; lxu_cache_state is [sets, 32] int64), and
    each ID is linearised (8 bytes written, 8 read), probed against its set's 32 tags twice -- the
    prefetch's find-uncached pass and the forward's cache-location pass, 256 bytes each -- with an 8-byte
    LRU stamp and a 4-byte cache location written. So a cache that holds every row is still slower than
    HBM (1 + c / (d w) the row traffic, about 2x at d = 128), and a plan keeps its tables in HBM while they
    fit.

Sharding types (TorchRec ShardingType; n_p, bags and rows per piece):

    data_parallel   every rank, its own b samples: n_p = b L; the whole table's gradient is all-reduced
                    and the whole table updated by a dense optimizer (TorchRec's "dense" kernel)
    table_wise      one rank: n_p = n, bags = B; input all-to-all of the other ranks' IDs, pooled output
                    all-to-all forward and gradient all-to-all backward, (B - b) d w each
    column_wise     k pieces of d / k columns on k ranks, each as table_wise with width d / k
    row_wise        R pieces of rows / R rows: n_p = n / R, bags = B partial sums reduce-scattered to
                    their owners forward (B d w unreduced), gradients all-gathered backward
    table_row_wise  row-wise over the k ranks of one node (reduce-scatter inside the node), then the
                    node's B / k pooled rows per rank all-to-all to their owners

Collectives are costmodel.price.comm's (Hockney alpha-beta on the cluster's links); the volume a piece adds to
its rank's collectives is priced by their per-byte slope (comm.affine), and each collective's latency
once per step for the sharding types a plan uses (`collective_latency`). A rank's all-to-all time is set
by what the table owners receive and send (the sending side of the others is the same total spread
evenly, never more than the owners' largest). Nothing overlaps the dense part: TorchRec's
TrainPipelineSparseDist can hide the input all-to-all behind the previous batch, which this model does not
count (a conservative choice).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from partita.costmodel.price import comm
from partita.costmodel.sparse.embeddings import Access, Table
from partita.costmodel.errors import PartitaError
from partita.costmodel.sparse.names import PLACEMENTS, SHARDINGS, SPARSE_OPTIMIZERS  # noqa: F401 (re-exported)
from partita.costmodel.hardware import Cluster

TORCHREC_KERNELS = {"hbm": "fused", "cache": "fused_uvm_caching", "host": "fused_uvm"}
"""TorchRec's compute kernel for each placement (data_parallel tables run TorchRec's "dense" kernel)."""
WEIGHT_BYTES = 4
ID_BYTES = 8
LENGTH_BYTES = 4
CACHE_SLOT_BYTES = 16
"""FBGEMM's per-slot cache state: the cached row's index and its LRU stamp, 8 bytes each (lxu_cache_state and
lxu_state, int64 per slot)."""
CACHE_MAP_BYTES = 4
"""FBGEMM's per-row cache state: `cache_index_table_map`, an int32 for every row of a cached table (its hash
size, not its cache slots), in HBM beside the cache (split_table_batched_embeddings_ops_training lists it with
the cache's auxiliary state, "int32, 4B x hash_size"; TorchRec's storage estimator counts it too,
shard_estimators._calculate_cache_aux_state_sizes). A small cache of a huge table pays it in full: 1.4e9 rows
hold 5.2 GiB of HBM whatever the cache's size."""
CACHE_ASSOC = 32
"""Ways of FBGEMM's set-associative embedding cache (DEFAULT_ASSOC on CUDA), one int64 tag each."""
CACHE_PROBE_BYTES = 2 * ID_BYTES + 2 * CACHE_ASSOC * 8 + 8 + 4
"""HBM bytes of cache bookkeeping per lookup (module docstring): linearised ID written and read, two probes
of the set's tags, the LRU stamp, the cache location."""


def state_bytes_per_row(optimizer: str, dim: int) -> int:
    """Optimizer state of one row of width `dim` (fbgemm_gpu OptimType)."""
    if optimizer == "rowwise_adagrad":
        return 4                      # one fp32 accumulator per row
    if optimizer == "adam":
        return 2 * dim * 4            # fp32 first and second moments
    if optimizer == "sgd":
        return 0
    raise PartitaError(f"unknown sparse optimizer {optimizer!r}; accepted: {', '.join(SPARSE_OPTIMIZERS)}")


@dataclass(frozen=True, kw_only=True)
class Option:
    """How one table is sharded and placed."""

    sharding: str
    placement: str = "hbm"
    shards: int = 1
    """Column-wise pieces (k); 1 otherwise."""
    cache_fraction: float = 0.0
    """Rows an HBM cache holds, as a fraction of the table's (placement "cache")."""

    def describe(self) -> str:
        kind = f"{self.sharding} x{self.shards}" if self.sharding == "column_wise" else self.sharding
        where = f"cache {self.cache_fraction:.0%}" if self.placement == "cache" else self.placement
        return f"{kind}, {where}"


@dataclass(frozen=True, kw_only=True)
class PieceCost:
    """What one piece of a table costs the rank that holds it, per step."""

    lookup_s: float
    update_s: float
    comm_s: float
    hbm_bytes: float
    host_bytes: float
    pieces: int
    """How many ranks hold a piece: 1 (table_wise), k (column_wise), R (row_wise, data_parallel), the
    node's devices (table_row_wise)."""

    @property
    def time_s(self) -> float:
        return self.lookup_s + self.update_s + self.comm_s


@dataclass(frozen=True, kw_only=True)
class SparseContext:
    cluster: Cluster
    global_batch: int
    optimizer: str = "rowwise_adagrad"
    pricing: str = "partita"
    """Who prices a piece: "partita" (this module) or "torchrec" (TorchRec's estimator,
    costmodel.sparse.torchrec_costs; planner.sparse.embeddings.option_costs)."""

    @property
    def ranks(self) -> int:
        return self.cluster.num_devices

    def world(self) -> comm.Group:
        return comm.group_for(self.cluster, self.ranks, 1)

    def node(self) -> comm.Group:
        return comm.group_for(self.cluster, min(self.ranks, self.cluster.devices_per_node), 1)


def _rates(cluster: Cluster) -> tuple[float, float]:
    d = cluster.device
    return d.mem_bandwidth * d.mem_efficiency, d.host_bw


def lookup_seconds(cluster: Cluster, lookups: float, bags: float, dim: int, placement: str, miss: float,
                   weight_bytes: int = WEIGHT_BYTES) -> float:
    """Rows read at the table's own width (`weight_bytes`), pooled bags written in fp32 (TorchRec's output)."""
    hbm, host = _rates(cluster)
    rows, out = lookups * dim * weight_bytes, bags * dim * WEIGHT_BYTES
    if placement == "hbm":
        return (rows + out) / hbm
    if placement == "host":
        return rows / host + out / hbm
    return (rows + out + miss * rows + lookups * CACHE_PROBE_BYTES) / hbm + miss * rows / host


def update_seconds(cluster: Cluster, lookups: float, distinct: float, dim: int, placement: str, miss: float,
                   state: int, weight_bytes: int = WEIGHT_BYTES) -> float:
    """fp32 bag gradients read; each distinct row (at the table's width) and its state read and written."""
    hbm, host = _rates(cluster)
    grads = lookups * dim * WEIGHT_BYTES
    rows, states = distinct * 2 * dim * weight_bytes, distinct * 2 * state
    if placement == "hbm":
        return (grads + rows + states) / hbm
    if placement == "host":
        return grads / hbm + (rows + states) / host
    return (grads + rows) / hbm + states / host + miss * lookups * dim * weight_bytes / host


def _a2a(ctx: SparseContext, sent: float) -> float:
    """Bandwidth seconds of `sent` bytes a rank exchanges in an all-to-all over every rank."""
    if ctx.ranks <= 1 or sent <= 0:
        return 0.0
    per_byte = comm.affine(comm.all_to_all, ctx.cluster, ctx.world())[1]
    return per_byte * sent * ctx.ranks / (ctx.ranks - 1)


def _slope(collective, ctx: SparseContext, group: comm.Group, nbytes: float) -> float:
    return comm.affine(collective, ctx.cluster, group)[1] * nbytes if group.size > 1 else 0.0


def piece_cost(table: Table, access: Access, option: Option, ctx: SparseContext) -> PieceCost:
    """The per-rank cost of one piece of `table` under `option` (module docstring)."""
    R, B = ctx.ranks, ctx.global_batch
    b, L = B / R, access.pooling
    n = B * L
    per_bag_ids = L * ID_BYTES + LENGTH_BYTES
    kind, place = option.sharding, option.placement
    d = table.dim // option.shards
    if kind == "data_parallel":
        pieces, rows, lookups, bags = R, table.rows, b * L, b
    elif kind in ("table_wise", "column_wise"):
        pieces, rows, lookups, bags = option.shards, table.rows, n, B
    elif kind == "row_wise":
        pieces, rows, lookups, bags = R, math.ceil(table.rows / R), n / R, B
    elif kind == "table_row_wise":
        k = ctx.node().size
        pieces, rows, lookups, bags = k, math.ceil(table.rows / k), n / k, B
    else:
        raise PartitaError(f"unknown sharding {kind!r}; accepted: {', '.join(SHARDINGS)}")
    miss = access.miss_ratio(option.cache_fraction * table.rows) if place == "cache" else 0.0
    state = state_bytes_per_row(ctx.optimizer, d)
    wb = table.weight_bytes  # the table's own width (TorchRec FP16 tables: 2); pooled bags and their grads fp32
    lookup = lookup_seconds(ctx.cluster, lookups, bags, d, place, miss, wb)
    weights = rows * d * wb + rows * state
    if kind == "data_parallel":
        hbm_rate = _rates(ctx.cluster)[0]
        # dense gradient of the whole table, all-reduced, then the whole table and its state updated
        update = (lookups * d * WEIGHT_BYTES + 3 * rows * d * wb + 2 * rows * state) / hbm_rate
        comm_s = _slope(comm.all_reduce, ctx, ctx.world(), rows * d * wb)
        io = 2 * b * d * WEIGHT_BYTES + rows * d * wb
        return PieceCost(lookup_s=lookup, update_s=update, comm_s=comm_s, hbm_bytes=weights + io, host_bytes=0.0,
                         pieces=pieces)
    distinct = access.distinct(n) / (1 if kind in ("table_wise", "column_wise") else pieces)
    update = update_seconds(ctx.cluster, lookups, distinct, d, place, miss, state, wb)
    if kind in ("table_wise", "column_wise"):
        comm_s = _a2a(ctx, (B - b) * per_bag_ids) + 2 * _a2a(ctx, (B - b) * d * WEIGHT_BYTES)
    elif kind == "row_wise":
        comm_s = (_a2a(ctx, b * per_bag_ids * (R - 1) / R)
                  + 2 * _slope(comm.reduce_scatter, ctx, ctx.world(), B * d * WEIGHT_BYTES))
    else:  # table_row_wise: IDs and pooled rows to and from the node's k pieces, reduce-scatter inside it
        comm_s = (_a2a(ctx, (B - b) * per_bag_ids / pieces) + 2 * _a2a(ctx, (B - b) * d * WEIGHT_BYTES / pieces)
                  + 2 * _slope(comm.reduce_scatter, ctx, ctx.node(), B * d * WEIGHT_BYTES))
    io = lookups * ID_BYTES + 2 * bags * d * WEIGHT_BYTES
    if place == "hbm":
        hbm_b, host_b = weights + io, 0.0
    else:
        cache = option.cache_fraction * rows * (d * wb + CACHE_SLOT_BYTES) + rows * CACHE_MAP_BYTES \
            if place == "cache" else 0.0
        hbm_b, host_b = cache + io, weights
    return PieceCost(lookup_s=lookup, update_s=update, comm_s=comm_s, hbm_bytes=hbm_b, host_bytes=host_b,
                     pieces=pieces)


def collective_latency(ctx: SparseContext, sharding: str) -> float:
    """Latency seconds a step pays once for the collectives of every table of `sharding` together
    (TorchRec batches each sharding type's tables into one collective of each kind). None where TorchRec's
    estimator prices the pieces: its per-shard comms are its whole communication cost."""
    if ctx.ranks <= 1 or ctx.pricing == "torchrec":
        return 0.0
    lat = lambda coll, group: comm.affine(coll, ctx.cluster, group)[0] if group.size > 1 else 0.0  # noqa: E731
    a2a = lat(comm.all_to_all, ctx.world())
    if sharding == "data_parallel":
        return lat(comm.all_reduce, ctx.world())
    if sharding in ("table_wise", "column_wise"):
        return 3 * a2a                                    # IDs; pooled forward; gradients backward
    if sharding == "row_wise":
        return a2a + 2 * lat(comm.reduce_scatter, ctx.world())
    return 3 * a2a + 2 * lat(comm.reduce_scatter, ctx.node())

"""Costs of embedding tables by sharding and placement (issue 28, item 3): the properties the formulas of
costmodel.sparse.costs must have, on the device's own constants."""
import pytest

from partita.costmodel.sparse.embeddings import Table, zipf_access
from partita.costmodel.hardware import parse_cluster
from partita.costmodel.sparse.costs import (CACHE_MAP_BYTES, CACHE_PROBE_BYTES, CACHE_SLOT_BYTES, Option, SparseContext,
                                      collective_latency, piece_cost)

TABLE = Table(name="t", rows=10_000_000, dim=128)
CTX = SparseContext(cluster=parse_cluster("2x8xA100-80GB"), global_batch=16384)


def cost(option, alpha=1.05, ctx=CTX, table=TABLE):
    return piece_cost(table, zipf_access(table.rows, alpha, 4), option, ctx)


def test_hbm_lookups_run_at_the_fitted_memory_rate():
    c = cost(Option(sharding="table_wise"))
    d = CTX.cluster.device
    lookups, bags = 16384 * 4, 16384
    assert c.lookup_s == pytest.approx((lookups + bags) * 128 * 4 / (d.mem_bandwidth * d.mem_efficiency))


def test_host_is_slower_than_cache_which_is_slower_than_hbm_and_holds_less():
    hbm = cost(Option(sharding="table_wise"))
    cache = cost(Option(sharding="table_wise", placement="cache", cache_fraction=0.05))
    host = cost(Option(sharding="table_wise", placement="host"))
    assert hbm.time_s < cache.time_s < host.time_s
    assert host.hbm_bytes < cache.hbm_bytes < hbm.hbm_bytes
    assert hbm.host_bytes == 0 and cache.host_bytes == host.host_bytes > 0


def test_a_cache_that_holds_every_row_still_pays_its_tag_probes():
    """A table that fits in HBM gains nothing from a cache in front of host memory: every lookup probes
    FBGEMM's 32-way tag set whatever it finds, so the planner keeps tables in HBM while they fit."""
    hbm = cost(Option(sharding="table_wise"))
    full = cost(Option(sharding="table_wise", placement="cache", cache_fraction=1.0))
    d = CTX.cluster.device
    probes = 16384 * 4 * CACHE_PROBE_BYTES / (d.mem_bandwidth * d.mem_efficiency)
    assert full.lookup_s == pytest.approx(hbm.lookup_s + probes, rel=1e-6)
    assert full.time_s > hbm.time_s


def test_a_cache_holds_four_bytes_in_hbm_for_every_row_of_its_table():
    """FBGEMM's cache_index_table_map is an int32 per row of a cached table, whatever the cache's size: a 1%
    cache of 10M rows holds 40 MB of it beside 5 MB of cached rows. Before, a small cache of a huge table was
    priced without it (a plan of the rec benchmark then overflowed HBM by TorchRec's own storage estimate)."""
    host = cost(Option(sharding="table_wise", placement="host"))
    cache = cost(Option(sharding="table_wise", placement="cache", cache_fraction=0.01))
    slots = 0.01 * TABLE.rows
    assert cache.hbm_bytes - host.hbm_bytes == pytest.approx(slots * (128 * 4 + 16) + TABLE.rows * 4, rel=1e-9)
    column = cost(Option(sharding="column_wise", shards=2, placement="cache", cache_fraction=0.01))
    column_host = cost(Option(sharding="column_wise", shards=2, placement="host"))
    # a column piece holds every row: the map is not split by the columns
    assert column.hbm_bytes - column_host.hbm_bytes == pytest.approx(slots * (64 * 4 + 16) + TABLE.rows * 4)


def test_the_cache_state_is_what_torchrecs_storage_estimator_counts():
    estimators = pytest.importorskip("torchrec.distributed.planner.shard_estimators")
    for fraction in (0.01, 0.2, 1.0):
        aux = estimators._calculate_cache_aux_state_sizes([[TABLE.rows, 128]], fraction)[0]
        assert fraction * TABLE.rows * CACHE_SLOT_BYTES + TABLE.rows * CACHE_MAP_BYTES == pytest.approx(aux, abs=1)


def test_a_skewed_cache_beats_a_uniform_one():
    option = Option(sharding="table_wise", placement="cache", cache_fraction=0.01)
    assert cost(option, alpha=1.2).time_s < cost(option, alpha=0.0).time_s


def test_row_wise_splits_rows_and_column_wise_splits_width():
    tw = cost(Option(sharding="table_wise"))
    rw = cost(Option(sharding="row_wise"))
    cw = cost(Option(sharding="column_wise", shards=4))
    weights = TABLE.rows * 128 * 4
    assert rw.pieces == 16 and rw.hbm_bytes < weights / 16 * 1.2
    assert cw.pieces == 4 and cw.lookup_s == pytest.approx(tw.lookup_s / 4)
    assert cw.comm_s == pytest.approx(tw.comm_s / 4, rel=0.35)  # IDs go to every piece, outputs are 1/4


def test_data_parallel_all_reduces_the_whole_table():
    small, large = Table(name="s", rows=1000, dim=128), Table(name="l", rows=10**6, dim=128)
    dp_small = cost(Option(sharding="data_parallel"), table=small)
    dp_large = cost(Option(sharding="data_parallel"), table=large)
    assert dp_large.comm_s > 100 * dp_small.comm_s
    assert dp_large.hbm_bytes > 10**6 * 128 * 4  # the whole table on every rank


def test_adam_keeps_two_moments_rowwise_adagrad_one_float():
    adagrad = SparseContext(cluster=CTX.cluster, global_batch=16384, optimizer="rowwise_adagrad")
    adam = SparseContext(cluster=CTX.cluster, global_batch=16384, optimizer="adam")
    a = cost(Option(sharding="table_wise"), ctx=adagrad)
    b = cost(Option(sharding="table_wise"), ctx=adam)
    assert b.hbm_bytes - a.hbm_bytes == pytest.approx(TABLE.rows * (2 * 128 * 4 - 4), rel=1e-6)
    assert b.update_s > a.update_s


def test_more_ranks_across_nodes_cost_more_all_to_all():
    one = SparseContext(cluster=parse_cluster("8xA100-80GB"), global_batch=16384)
    two = SparseContext(cluster=parse_cluster("2x8xA100-80GB"), global_batch=16384)
    assert cost(Option(sharding="table_wise"), ctx=two).comm_s > cost(Option(sharding="table_wise"), ctx=one).comm_s
    assert collective_latency(two, "table_wise") > collective_latency(one, "table_wise") > 0


def test_an_fp16_table_moves_and_holds_half_the_row_bytes_of_an_fp32_one():
    import dataclasses
    ctx = SparseContext(cluster=parse_cluster("8xA100-80GB"), global_batch=8192, optimizer="sgd")
    t32 = Table(name="t", rows=10_000_000, dim=128)
    t16 = dataclasses.replace(t32, weight_bytes=2)
    access = zipf_access(t32.rows, 1.05, 4)
    hbm32 = piece_cost(t32, access, Option(sharding="table_wise", placement="hbm"), ctx)
    hbm16 = piece_cost(t16, access, Option(sharding="table_wise", placement="hbm"), ctx)
    host32 = piece_cost(t32, access, Option(sharding="table_wise", placement="host"), ctx)
    host16 = piece_cost(t16, access, Option(sharding="table_wise", placement="host"), ctx)
    # sgd keeps no state: the table's bytes halve; the pooled all-to-alls stay fp32
    assert host16.host_bytes == pytest.approx(host32.host_bytes / 2)
    assert hbm16.hbm_bytes < 0.51 * hbm32.hbm_bytes and hbm16.comm_s == hbm32.comm_s
    assert host16.lookup_s < host32.lookup_s and host16.update_s < host32.update_s


def test_a_torchrec_fp16_table_is_found_at_its_width():
    torchrec = pytest.importorskip("torchrec")
    import torch

    from partita.costmodel.sparse.embeddings import find_tables
    ebc = torchrec.EmbeddingBagCollection(device=torch.device("meta"), tables=[
        torchrec.EmbeddingBagConfig(name="a", embedding_dim=8, num_embeddings=100, feature_names=["f"],
                                    data_type=torchrec.DataType.FP16)])
    assert [t.weight_bytes for t in find_tables(ebc)] == [2]

"""A TorchRec user's model -- an EmbeddingBagCollection and a KeyedJaggedTensor input -- is planned as partita
plans any recommendation model (issue 28, item 1): its tables found with their collection, config names and
features, the KJT taken as an ID tensor that rebuilds the same KJT, the dense part captured without the tables.
Training it through DistributedModelParallel is tests/e2e/test_rec_runs.py's."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("torchrec")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the factory modules

from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor  # noqa: E402

import torchrec_factories  # noqa: E402
from partita.costmodel.sparse.embeddings import find_tables  # noqa: E402
from partita.costmodel.errors import PartitaError  # noqa: E402
from partita.costmodel.sparse.kjt import Features, KJTFromIds  # noqa: E402
from partita.costmodel.models import resolve_model  # noqa: E402
from partita.planner.api import plan  # noqa: E402
from partita.planner.sparse.embeddings import parse_fixed  # noqa: E402
from partita.planner.sparse.rec_plan import SparseInputs, accesses_for  # noqa: E402
from partita.planner.search import TrainConfig  # noqa: E402

MODEL = "torchrec_factories:dlrm"
EBC = "sparse_arch.embedding_bag_collection"


def _tables():
    spec = resolve_model(MODEL)
    with torch.device("meta"):
        return spec, find_tables(spec.build())


def test_the_collection_tables_are_found_with_their_configs_and_features():
    spec, tables = _tables()
    by_key = {t.key: t for t in tables}
    assert [t.name for t in tables] == [f"{EBC}.embedding_bags.{k}" for k in ("t_users", "t_items", "t_ads", "t_tags")]
    assert by_key["t_items"].features == ("item", "seen") and by_key["t_items"].collection == EBC
    assert (by_key["t_users"].rows, by_key["t_users"].dim) == (1000, torchrec_factories.DIM)
    # one ID tensor in place of the KJT: 2 IDs per sample and feature (the example's mean), 5 features
    dense, ids = spec.example_inputs(3)
    assert ids.shape == (3, 10) and ids.dtype == torch.long and dense.shape == (3, torchrec_factories.DENSE)
    # a shared table is looked up by each of its features
    acc, source = accesses_for(tables, spec, SparseInputs())
    assert acc[by_key["t_items"].name].pooling == 4 and acc[by_key["t_users"].name].pooling == 2
    assert "example KeyedJaggedTensor" in source
    acc, _ = accesses_for(tables, spec, SparseInputs(zipf=1.0, pooling=3))
    assert acc[by_key["t_items"].name].pooling == 6


def test_the_id_tensor_rebuilds_the_kjt_the_collection_pools():
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name="a", embedding_dim=4, num_embeddings=20, feature_names=["f"]),
        EmbeddingBagConfig(name="b", embedding_dim=4, num_embeddings=30, feature_names=["g", "h"])])
    features = Features(keys=("f", "g", "h"), pooling=(2, 1, 3))
    ids = torch.randint(0, 20, (5, 6))
    got = ebc(KJTFromIds(features)(ids)).to_dict()
    # the same IDs as TorchRec users build a KJT: per key, every sample's IDs in turn
    f, g, h = ids[:, :2], ids[:, 2:3], ids[:, 3:]
    want = ebc(KeyedJaggedTensor.from_lengths_sync(
        keys=["f", "g", "h"], values=torch.cat([f.reshape(-1), g.reshape(-1), h.reshape(-1)]),
        lengths=torch.tensor([2] * 5 + [1] * 5 + [3] * 5, dtype=torch.int32))).to_dict()
    assert set(got) == {"f", "g", "h"}
    for key in want:
        assert torch.equal(got[key], want[key])
    assert not torch.equal(got["g"], got["h"])  # not one feature's IDs for another's


def test_a_torchrec_model_plans_without_allocating_its_tables():
    # two 2e9-row tables (64 GB each in fp32) on this machine's memory: only shapes are read
    p = plan("torchrec_factories:big", cluster="8xA100-80GB", train=TrainConfig(global_batch=4096))
    tables = {t["key"]: t for t in p.embeddings["tables"]}
    assert set(tables) == {"t_users", "t_items", "t_ads", "t_tags"}
    assert tables["t_items"]["collection"] == EBC and tables["t_items"]["features"] == ["item", "seen"]
    assert tables["t_users"]["rows"] == 2_000_000_000
    # the dense part is captured without the tables: its parameters are the two MLPs' only
    dense = sum(p.numel() for n, p in torchrec_factories.dlrm()[0].named_parameters() if "embedding_bags" not in n)
    assert p.model["parameters"] == dense + sum(t["rows"] * t["dim"] for t in tables.values())


def test_tables_are_fixed_by_their_config_name():
    _, tables = _tables()
    fixed = parse_fixed("t_users=row_wise,t_items=column_wise:2", tables)
    assert {t.split(".")[-1]: f.sharding for t, f in fixed.items()} == {"t_users": "row_wise", "t_items": "column_wise"}
    with pytest.raises(PartitaError, match="no table of the model"):
        parse_fixed("t_nope=row_wise", tables)


def test_a_weighted_kjt_is_refused_in_one_line(monkeypatch):
    def weighted():
        model, (dense, kjt), loss = torchrec_factories.dlrm()
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths(),
                                                  weights=torch.ones(kjt.values().shape))
        return model, (dense, kjt), loss
    monkeypatch.setattr(torchrec_factories, "weighted", weighted, raising=False)
    with pytest.raises(PartitaError, match="weighted KeyedJaggedTensor"):
        resolve_model("torchrec_factories:weighted")


def test_export_names_the_collection_and_its_config_names(tmp_path, capsys):
    from partita.cli import main
    p = plan(MODEL, cluster="2xA100-40GB", train=TrainConfig(global_batch=16),
             sparse=SparseInputs(fixed="t_users=row_wise,t_items=column_wise:2,t_ads=table_wise,t_tags=data_parallel"))
    path = tmp_path / "plan.json"
    p.save(path)
    assert main(["export", str(path), "--to", "torchrec"]) == 0
    namespace: dict = {}
    exec(compile(capsys.readouterr().out, "export.py", "exec"), namespace)
    model = torchrec_factories.dlrm()[0]
    sharding = namespace["sharding_plan"](model.get_submodule(EBC)).plan
    assert list(sharding) == [EBC]
    kinds = {k: ps.sharding_type for k, ps in sharding[EBC].items()}
    assert kinds == {"t_users": "row_wise", "t_items": "column_wise", "t_ads": "table_wise", "t_tags": "data_parallel"}


def test_a_sample_names_a_collections_tables_by_their_config_names(tmp_path):
    import numpy as np
    from partita.costmodel.sparse.embeddings import load_sample
    _, tables = _tables()
    rng = np.random.default_rng(0)
    arrays = {t.key: rng.integers(0, t.rows, 400) for t in tables}
    arrays["t_items.lengths"] = np.full(100, 4)
    np.savez(tmp_path / "s.npz", **arrays)
    acc = load_sample(str(tmp_path / "s.npz"), tables)
    assert set(acc) == {t.name for t in tables}
    assert acc[f"{EBC}.embedding_bags.t_items"].pooling == 4
    del arrays["t_ads"]
    np.savez(tmp_path / "short.npz", **arrays)
    with pytest.raises(PartitaError, match="missing .*t_ads"):
        load_sample(str(tmp_path / "short.npz"), tables)

"""Recommendation models: the dlrm preset and family, user factories with nn.EmbeddingBag tables, planned on
meta/fake tensors (issue 28, item 1)."""
import pytest
import torch

from partita.costmodel.sparse.embeddings import find_tables
from partita.costmodel.errors import PartitaError
from partita.costmodel.models import resolve_model
from partita.costmodel.models.dlrm import CRITEO_1TB_ROWS
from partita.planner.api import plan
from partita.planner.sparse.rec_plan import SparseInputs
from partita.planner.search import TrainConfig


def test_criteo_preset_is_the_mlperf_dlrm():
    spec = resolve_model("dlrm-criteo-1tb")
    with torch.device("meta"):
        model = spec.build()
    tables = find_tables(model)
    assert [t.rows for t in tables] == list(CRITEO_1TB_ROWS) and len(tables) == 26
    assert {t.dim for t in tables} == {128}
    widths = lambda seq: [m.out_features for m in seq if isinstance(m, torch.nn.Linear)]  # noqa: E731
    assert widths(model.bottom) == [512, 256, 128] and model.bottom[0].in_features == 13
    assert widths(model.top) == [1024, 1024, 512, 256, 1]
    assert model.top[0].in_features == 128 + 27 * 26 // 2  # dot interaction of 27 vectors, no diagonal
    mlp = lambda ws: sum(a * b + b for a, b in zip(ws[:-1], ws[1:]))  # noqa: E731
    dense = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("embeddings"))
    assert dense == mlp([13, 512, 256, 128]) + mlp([479, 1024, 1024, 512, 256, 1])


def test_dlrm_forward_runs_on_real_tensors():
    spec = resolve_model("dlrm:tables=3,rows=50-60-70,dim=8,bottom=16-8,top=32-1,dense=5,pooling=2")
    model = spec.build()
    dense, ids = spec.example_inputs(4)
    loss = spec.loss_fn(model, dense, ids)
    loss.backward()
    assert model.embeddings["cat_2"].weight.grad is not None and model.top[0].in_features == 8 + 4 * 3 // 2


@pytest.mark.parametrize("text, words", [
    ("dlrm:tables=3,rows=10-20", "2 row counts for 3 tables"),
    ("dlrm:tables=2", "needs rows"),
    ("dlrm:rows=10,width=3", "bad model parameter"),
    ("dlrm:rows=10,dim=16,bottom=64-32", "must end at the embedding dim"),
    ("dlrm:rows=10,top=64-2", "one logit"),
    ("dlrm:rows=ten", "not a list of integers"),
])
def test_dlrm_family_errors_are_one_line(text, words):
    with pytest.raises(PartitaError, match=words) as e:
        resolve_model(text)
    assert "\n" not in str(e.value)


def test_factory_with_embedding_bags_plans_its_tables(monkeypatch):
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    p = plan("rec_factories:two_tables", cluster="2xcpu", train=TrainConfig(global_batch=8))
    names = [t["name"] for t in p.embeddings["tables"]]
    assert names == ["users", "items"]
    assert p.embeddings["tables"][0]["pooling"] == 3  # the example batch's IDs per feature
    assert p.mesh.dp == 2 and p.predicted["breakdown"]["embeddings_s"] > 0


def test_a_trillion_parameters_plan_without_allocating():
    # 8 tables of 1e9 rows x 128: 1.02T parameters, 4 TB of fp32 weights -- allocating them would fail here
    p = plan("dlrm:tables=8,rows=1000000000,dim=128", cluster="16x8xA100-80GB",
             train=TrainConfig(global_batch=16384), sparse=SparseInputs(zipf=1.05))
    rows = sum(t["rows"] * t["dim"] for t in p.embeddings["tables"])
    assert rows == 8 * 10**9 * 128
    per_rank = p.embeddings["predicted"]["per_rank"]
    hbm = 80 * 2**30
    assert max(per_rank["hbm_bytes"]) < hbm  # every table placed within each rank's memory
    assert p.solver["embeddings"]["status"] in ("optimal", "feasible")


def test_sparse_flags_need_tables():
    with pytest.raises(PartitaError, match="apply to models with embedding tables"):
        plan("tiny-gpt", cluster="2xcpu", train=TrainConfig(global_batch=4), sparse=SparseInputs(zipf=1.0))


def test_cli_names_the_table_that_fits_nowhere(capsys):
    from partita.cli import main
    code = main(["plan", "--model", "dlrm:tables=2,rows=1000-1000000000000,dim=128", "--cluster", "2xA100-40GB",
                 "--global-batch", "64"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "table embeddings.cat_1 (1,000,000,000,000 rows x 128) fits on no rank" in err and "GiB" in err


def test_cli_dim_that_does_not_split_is_one_line(capsys):
    from partita.cli import main
    code = main(["plan", "--model", "dlrm:tables=2,rows=100,dim=24,bottom=32-24", "--cluster", "4xA100-40GB",
                 "--global-batch", "64", "--embedding-sharding", "embeddings.cat_0=column_wise:4"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "does not split into 4 column pieces" in err

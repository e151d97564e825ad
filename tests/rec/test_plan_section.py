"""The Plan's versioned `embeddings` section (issue 28): written by the planner, validated on load, absent from
(and not needed by) plans without tables; `partita plan --json` keeps its stable names for a DLRM."""
import copy
import json

import pytest

from partita.planner.api import plan
from partita.cli import main
from partita.planner.plan import Plan, PlanError
from partita.planner.sparse.rec_plan import SECTION_SCHEMA, SparseInputs
from partita.planner.search import TrainConfig

MODEL = "dlrm:tables=4,rows=64-80-96-50,dim=8,bottom=16-8,top=16-1,dense=4,pooling=2"


@pytest.fixture(scope="module")
def rec_plan():
    return plan(MODEL, cluster="2xcpu", train=TrainConfig(global_batch=16),
                sparse=SparseInputs(fixed="embeddings.cat_2=column_wise:2", optimizer="sgd"))


def test_section_round_trips(rec_plan, tmp_path):
    path = tmp_path / "p.json"
    rec_plan.save(path)
    loaded = Plan.load(path)
    assert loaded.embeddings == rec_plan.embeddings and loaded.embeddings["schema"] == SECTION_SCHEMA
    cw = next(t for t in loaded.embeddings["tables"] if t["name"] == "embeddings.cat_2")
    assert cw["sharding"] == "column_wise" and cw["shards"] == 2 and sorted(cw["ranks"]) == [0, 1]
    assert loaded.predicted["step_time_s"] == pytest.approx(
        loaded.embeddings["predicted"]["dense_step_s"] + loaded.embeddings["predicted"]["step_time_s"])


def test_plans_without_tables_have_no_section_and_load_unchanged(tmp_path):
    p = plan("tiny-gpt", cluster="2xcpu", train=TrainConfig(global_batch=4))
    d = p.to_dict()
    assert "embeddings" not in d
    assert Plan.from_dict(json.loads(json.dumps(d))).embeddings is None


@pytest.mark.parametrize("edit, words", [
    (lambda e: e.update(schema="partita.embeddings/9"), "embeddings.schema"),
    (lambda e: e["tables"][0].update(ranks=[0, 7]), r"ranks must be distinct ranks in \[0, 2\)"),
    (lambda e: e["tables"][0].update(sharding="diagonal"), "sharding must be one of"),
    (lambda e: e["tables"][1].update(name=e["tables"][0]["name"]), "unique string name"),
    (lambda e: e["tables"][2].update(shards=3), "does not split into 3 column pieces|puts 3 piece"),
    (lambda e: e["tables"][0].update(key="t"), "collection's table needs"),
    (lambda e: e["tables"][0].update(placement="cache", cache_fraction="1; import os"), "cache_fraction must be"),
    (lambda e: e.update(dense={"zero_stage": 3, "options": [{"zero_stage": 3}]}), "embeddings.dense must be"),
    (lambda e: e.update(dense={"zero_stage": 2, "options": []}), "embeddings.dense must be"),
    (lambda e: e.update(pricing="guess"), "embeddings.pricing must be one of partita, torchrec"),
])
def test_a_bad_section_is_one_line(rec_plan, edit, words):
    d = copy.deepcopy(rec_plan.to_dict())
    edit(d["embeddings"])
    with pytest.raises(PlanError, match=words) as e:
        Plan.from_dict(d)
    assert "\n" not in str(e.value)


def test_cli_json_keeps_the_stable_names(capsys):
    assert main(["plan", "--model", MODEL, "--cluster", "2xcpu", "--global-batch", "16", "--zipf", "1.1",
                 "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"step_time_s", "tokens_per_s", "peak_memory_bytes", "exposed_comm_s"} <= set(d["predicted"])
    assert {"status", "wall_time_s", "mip_gap"} <= set(d["solver"]) and d["mesh"]["dp"] == 2
    assert d["embeddings"]["data"].startswith("zipf alpha=1.1")
    assert d["solver"]["mip_gap"] >= d["embeddings"]["solver"]["mip_gap"]  # the gap covers the tables too


def test_explain_shows_the_tables(rec_plan):
    text = rec_plan.explain()
    assert "embedding tables  4 tables" in text and "column_wise x2" in text and "embedding program" in text


def test_a_plan_with_tables_runs_its_dense_part_replicated_or_sharded_only(rec_plan):
    d = copy.deepcopy(rec_plan.to_dict())
    d["zero_stage"] = 1
    with pytest.raises(PlanError, match="zero_stage must be one of 0, 3"):
        Plan.from_dict(d)


def test_the_export_keeps_a_plans_free_text_in_its_comment(rec_plan, tmp_path, capsys):
    """A plan file whose name holds a newline is refused on load; one built in memory is exported with the
    name on its comment line, and the code is the benign plan's statement for statement."""
    import ast
    import dataclasses

    from partita.export.torchrec import to_torchrec
    d = copy.deepcopy(rec_plan.to_dict())
    d["model"]["name"] = "x\nimport os; os.system('echo owned')"
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    assert main(["export", str(path), "--to", "torchrec"]) == 2
    assert "model.name holds a control character" in capsys.readouterr().err
    evil = dataclasses.replace(rec_plan, model={**rec_plan.model, "name": "x\rimport os\u2028os.system('owned')"})
    code = to_torchrec(evil)
    assert not any(line.startswith("import os") for line in code.splitlines())
    assert ast.dump(ast.parse(code)) == ast.dump(ast.parse(to_torchrec(rec_plan)))


def test_explain_says_which_dense_option_was_chosen(rec_plan):
    assert "dense part  replicated (DDP), chosen with the tables" in rec_plan.explain()


def test_tables_priced_by_torchrecs_estimator_say_so(rec_plan):
    """--embedding-costs torchrec: the pieces carry TorchRec's estimate (no per-collective latency; other
    piece times than partita's byte model), the section and the report say who priced them."""
    theirs = plan(MODEL, cluster="2xcpu", train=TrainConfig(global_batch=16),
                  sparse=SparseInputs(fixed="embeddings.cat_2=column_wise:2", pricing="torchrec"))
    e = theirs.embeddings
    assert e["pricing"] == "torchrec" and rec_plan.embeddings["pricing"] == "partita"
    assert e["predicted"]["latency_s"] == 0.0 < rec_plan.embeddings["predicted"]["latency_s"]
    assert "TorchRec's EmbeddingPerfEstimator" in theirs.explain()
    assert "TorchRec's EmbeddingPerfEstimator" not in rec_plan.explain()
    assert Plan.from_dict(json.loads(json.dumps(theirs.to_dict()))).embeddings == e


@pytest.mark.parametrize("sparse, words", [
    (dict(pricing="torchrec", optimizer="adam"), "TorchRec's estimator prices its default optimizer"),
    (dict(pricing="guess"), "--embedding-costs 'guess'; accepted: partita, torchrec"),
])
def test_torchrec_pricing_refusals_are_one_line(sparse, words):
    from partita.costmodel.errors import PartitaError
    with pytest.raises(PartitaError, match=words) as e:
        plan(MODEL, cluster="2xcpu", train=TrainConfig(global_batch=16), sparse=SparseInputs(**sparse))
    assert "\n" not in str(e.value)


def test_torchrec_pricing_without_torchrec_says_how_to_install(monkeypatch):
    import sys
    from partita.costmodel.errors import PartitaError
    monkeypatch.setitem(sys.modules, "torchrec", None)  # import torchrec now raises ImportError
    with pytest.raises(PartitaError, match=r"pip install 'partita\[rec\]'"):
        plan(MODEL, cluster="2xcpu", train=TrainConfig(global_batch=16), sparse=SparseInputs(pricing="torchrec"))


def test_cli_embedding_costs_flag(capsys):
    assert main(["plan", "--model", MODEL, "--cluster", "2xcpu", "--global-batch", "16", "--embedding-costs",
                 "torchrec", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["embeddings"]["pricing"] == "torchrec"

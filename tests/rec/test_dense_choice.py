"""The dense part of a recommendation model is chosen with its tables (issue 28, item 4): replicated (DDP) or
sharded (FSDP, ZeRO-3), whichever gives the faster whole step with the tables placed in the memory it leaves
(planner.sparse.rec_plan). An option skipped by the floor bound must be no faster when solved."""
from __future__ import annotations

import pytest

from partita.costmodel.errors import PartitaError
from partita.planner.api import plan
from partita.planner.sparse.rec_plan import SparseInputs
from partita.planner.search import TrainConfig

# a DLRM whose top MLP has 0.8B parameters: replicated, every rank updates all of them each step
WIDE_TOP = "dlrm:tables=8,rows=55000000,dim=128,top=16384-16384-16384-16384-1"
SMALL_TOP = "dlrm:tables=26,rows=2000000,dim=128"


def _plan(model, **fixed):
    return plan(model, cluster="8xA100-40GB", train=TrainConfig(global_batch=8192), sparse=SparseInputs(zipf=1.05),
                **fixed)


@pytest.mark.parametrize("model, chosen", [(WIDE_TOP, 3), (SMALL_TOP, 0)])
def test_the_dense_part_is_the_option_with_the_faster_whole_step(model, chosen):
    p = _plan(model)
    dense = p.embeddings["dense"]
    assert p.zero_stage == dense["zero_stage"] == chosen
    assert {o["zero_stage"] for o in dense["options"]} == {0, 3}
    step = p.predicted["step_time_s"]
    for o in dense["options"]:
        if "step_time_s" in o:
            assert o["step_time_s"] >= step - 1e-12
        if o["zero_stage"] != chosen:  # solved or pruned, the other option fixed by hand is no faster
            other = _plan(model, zero=o["zero_stage"])
            assert other.zero_stage == o["zero_stage"]
            assert other.predicted["step_time_s"] >= step - 1e-12
            if "pruned" in o:
                assert other.predicted["step_time_s"] >= o["dense_step_s"]


def test_sharding_the_wide_dense_part_leaves_its_memory_to_the_tables():
    chosen, replicated = _plan(WIDE_TOP), _plan(WIDE_TOP, zero=0)
    by_zero = {o["zero_stage"]: o for o in chosen.embeddings["dense"]["options"]}
    assert by_zero[3]["dense_hbm_bytes"] < by_zero[0]["dense_hbm_bytes"] / 3
    # beside the replicated dense part some tables no longer fit in HBM and go behind a cache; sharded, all do
    assert {t["placement"] for t in chosen.embeddings["tables"]} == {"hbm"}
    assert {t["placement"] for t in replicated.embeddings["tables"]} - {"hbm"}


def test_only_the_dense_zero_stage_is_a_what_if_for_a_recommendation_model():
    with pytest.raises(PartitaError, match="--zero 0 or --zero 3"):
        _plan(SMALL_TOP, zero=1)
    with pytest.raises(PartitaError, match="other dense what-if flags"):
        _plan(SMALL_TOP, tp=2)

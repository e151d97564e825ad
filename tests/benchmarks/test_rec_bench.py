"""benchmarks.rec scores plans as TorchRec's planner does: its score of TorchRec's own plan is the rating TorchRec's
planner gave that plan, and partita's score is its cost model's step."""
import pytest

import benchmarks.rec as rec


def test_scoring_reproduces_torchrecs_own_rating():
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.perf_models import NoopPerfModel
    from torchrec.distributed.planner.types import ParameterConstraints
    inst = rec.instances(3)[2]  # 8 tables on 2 x 8 A100-80GB
    assert len(inst["tables"]) == 8
    planner = EmbeddingShardingPlanner(
        topology=rec._topology(inst["cluster"]), batch_size=rec.LOCAL_BATCH, debug=False,
        constraints={t["name"]: ParameterConstraints(pooling_factors=[t["pooling"]]) for t in inst["tables"]})
    planner.plan(rec._module(inst), [EmbeddingBagCollectionSharder()])
    own = NoopPerfModel(rec._topology(inst["cluster"])).rate(planner._best_plan)
    theirs = rec.torchrec_plan(inst)
    assert rec.torchrec_score(inst, theirs["choices"])["ms"] == pytest.approx(own, rel=1e-9)


def test_partita_score_is_the_programs_step():
    inst = rec.instances(3)[2]
    ours = rec.partita_plan(inst)
    from partita.planner.embeddings import solve_tables
    tables, accesses, ctx = rec._partita_inputs(inst)
    step = solve_tables(tables, accesses, ctx, dense_s=0.0, dense_hbm=0.0).step_s
    assert rec.partita_score(inst, ours["choices"]) == pytest.approx(step, rel=1e-9)

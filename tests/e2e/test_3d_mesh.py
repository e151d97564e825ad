"""One 3-D mesh, pp x dp x tp = 2 x 2 x 2 on 8 processes, planned by the planner itself and run with
--verify: the losses equal single-process training. Slow (8 ranks time-share 2 cores, ~30-60 s)."""
import pytest

import partita.planner as planner
from partita.costmodel.hardware import parse_cluster
from partita.costmodel.models import resolve_model
from partita.costmodel.capture import capture
from partita.planner.api import _fingerprint
from partita.planner.estimate.build import build_plan
from partita.planner.search import SearchSpace, search
from tests.e2e.test_plans_match_single_process import assert_matches, launch


@pytest.mark.slow
def test_pp_dp_tp_on_eight_processes_matches_single_process(tmp_path):
    model = "small-gpt"  # 4 layers, 4 heads: splits over pp=2 and tp=2
    spec = resolve_model(model)
    graph = capture(spec, dtype="fp32")
    result = search(graph, parse_cluster("8xcpu"), planner.TrainConfig(global_batch=8, dtype="fp32"),
                    space=SearchSpace(pp=(2,), tp=(2,), zero=(0,), recompute=("none",), offload=False))
    plan = build_plan(result, model, _fingerprint(spec), spec.config)
    assert (plan.mesh.pp, plan.mesh.dp, plan.mesh.tp) == (2, 2, 2) and plan.placements
    proc, out = launch(tmp_path, plan.to_dict(), 8, model)
    assert_matches(proc, out)

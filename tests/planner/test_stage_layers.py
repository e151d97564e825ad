"""A pinned pipeline split (SearchSpace.stage_layers, `partita plan --stage-layers`): the stage program prices
exactly those layers per stage (planner.solve.milp's sum_o h[s, o] = n_s), the plan and `explain` show that
split, and a split that cannot be is refused in one line. The run: tests/e2e/test_stage_layers_run.py."""
import pytest

from partita.cli import main
from partita.costmodel.errors import PartitaError
from partita.planner.api import plan_search
from partita.planner.enumerate.space import SearchSpace, TrainConfig

MODEL = "gpt:layers=6,hidden=64,heads=4,seq=32,vocab=256"


def _layers_per_stage(plan) -> list[int]:
    return [sum(m.startswith("blocks.") for m in s.modules) for s in plan.stages]


def test_a_pinned_uneven_split_is_the_plan_s_split():
    train = TrainConfig(global_batch=4, dtype="fp32")
    _, free = plan_search(MODEL, cluster="2xcpu", train=train, pp=2)
    _, pinned = plan_search(MODEL, cluster="2xcpu", train=train, stage_layers=(1, 5))
    assert _layers_per_stage(free) == [3, 3]  # what the planner picks itself
    assert pinned.mesh.pp == 2 and _layers_per_stage(pinned) == [1, 5]
    assert [s.modules for s in pinned.stages] == [["tok_emb", "pos_emb", "blocks.0"],
                                                  ["blocks.1", "blocks.2", "blocks.3", "blocks.4", "blocks.5",
                                                   "ln_f", "head"]]
    assert [b.stage for b in pinned.blocks if b.fqn.startswith("blocks.")] == [0, 1, 1, 1, 1, 1]
    assert pinned.solver["fixed"]["stage_layers"] == [1, 5]
    assert pinned.predicted["step_time_s"] > free.predicted["step_time_s"]  # priced as pinned, not as the free one
    text = pinned.explain()
    assert "tok_emb, pos_emb, blocks.0 " in text and "blocks.1-5, ln_f, head" in text
    assert "stage-layers=1,5" in text


@pytest.mark.parametrize("fixed,why", [
    ({"stage_layers": (1, 5), "pp": 4}, "stage-layers 1,5 gives 2 pipeline stages but pp=4: give one count per stage"),
    ({"stage_layers": (0, 6)}, "stage-layers 0,6: stage 0 holds no layer"),
    ({"stage_layers": (2, 5)}, "stage-layers 2,5 places 7 layers but the model has 6 repeated layers: the counts must "
                               "sum to 6"),
    ({"stage_layers": (1, 5), "virtual_stages": 2}, "stage-layers pins one model chunk per pipeline stage"),
])
def test_refusals_are_one_line(fixed, why):
    with pytest.raises(PartitaError, match=why) as e:
        plan_search(MODEL, cluster="2xcpu", train=TrainConfig(global_batch=4, dtype="fp32"), **fixed)
    assert "\n" not in str(e.value)


def test_the_space_fixes_pp_and_one_chunk():
    space = SearchSpace(stage_layers=(10, 11, 11, 10))
    assert space.pp == (4,) and space.virtual_stages == (1,) and space.stage_layers == (10, 11, 11, 10)


def test_the_cli_flag(tmp_path, capsys):
    out = tmp_path / "p.json"
    base = ["plan", "--model", MODEL, "--cluster", "2xcpu", "--global-batch", "4", "--dtype", "fp32"]
    assert main(base + ["--stage-layers", "5,1", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["explain", str(out)]) == 0
    assert "blocks.0-4" in capsys.readouterr().out
    assert main(base + ["--stage-layers", "3,2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "partita: error: stage-layers 3,2 places 5 layers but the model has 6 repeated layers: the counts " \
                  "must sum to 6", err

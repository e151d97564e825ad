"""`partita plan --nnodes MIN:MAX`: one plan per size of an elastic job, each what a plan of that size alone would
be, the table of what losing nodes costs, and one-line errors (planner.plan.planset, planner.api.plan_set)."""
import json

import pytest

from partita.cli import main
from partita.planner.api import plan
from partita.planner.plan import Plan
from partita.planner.plan import planset
from partita.planner.plan.errors import PlanError
from partita.planner.search import TrainConfig

BIG = "gpt:layers=12,hidden=1024,heads=16,seq=128,vocab=50000"  # ~0.2B parameters: too big for one cpu device


def test_each_size_is_planned_as_that_cluster_alone_with_the_same_global_batch(tmp_path, capsys):
    out = tmp_path / "set"
    assert main(["plan", "--model", "tiny-gpt", "--cluster", "3x2xcpu", "--global-batch", "12", "--nnodes", "1:3",
                 "--mtbf", "10", "--out", str(out)]) == 0
    report = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["nodes-1.json", "nodes-2.json", "nodes-3.json", "plan-set.json"]
    for n in (1, 2, 3):
        p = Plan.load(out / f"nodes-{n}.json")
        alone = plan("tiny-gpt", cluster=f"{n}x2xcpu", train=TrainConfig(global_batch=12))
        assert p.mesh == alone.mesh and p.schedule == alone.schedule and p.zero_stage == alone.zero_stage
        assert p.predicted["step_time_s"] == pytest.approx(alone.predicted["step_time_s"])
        assert p.mesh.world_size == 2 * n and p.train["global_batch"] == 12
        assert p.cluster["spec"] == f"{n}x2xcpu"
    summary = json.loads((out / "plan-set.json").read_text())
    assert summary["schema"] == "partita.planset/1" and summary["nnodes"] == [1, 3]
    rows = {r["nodes"]: r for r in summary["sizes"]}
    assert rows[3]["relative_throughput"] == 1.0
    for n in (1, 2):
        assert rows[n]["relative_throughput"] == pytest.approx(rows[3]["step_time_s"] / rows[n]["step_time_s"])
    # a job of n nodes fails n/3 as often as the full one (10 h between interruptions at 3 nodes)
    assert rows[1]["resilience"]["mtbf_s"] == pytest.approx(30 * 3600)
    assert rows[3]["resilience"]["mtbf_s"] == pytest.approx(10 * 3600)
    assert "throughput" in report and "expected time lost" in report and "assumed" in report
    # explain reads the set back from its plan files alone
    (out / "plan-set.json").unlink()
    assert main(["explain", str(out)]) == 0
    again = capsys.readouterr().out
    assert [line for line in again.splitlines()[1:] if line.strip()] == \
        [line for line in report.splitlines()[1:] if line.strip() and not line.startswith("plans written")]


def test_a_size_no_plan_fits_says_why_and_the_others_are_kept(tmp_path, capsys):
    out = tmp_path / "set"
    assert main(["plan", "--model", BIG, "--cluster", "2x1xcpu", "--global-batch", "4", "--nnodes", "1:2",
                 "--out", str(out), "--json"]) == 0
    rows = {r["nodes"]: r for r in json.loads(capsys.readouterr().out)["sizes"]}
    assert rows[1]["file"] is None and "GiB per device" in rows[1]["why"]
    assert rows[2]["file"] == "nodes-2.json" and (out / "nodes-2.json").is_file()
    assert not (out / "nodes-1.json").exists()
    with pytest.raises(PlanError, match=r"no plan for 1 node\(s\) \(it has 2\)"):
        planset.for_nodes(out, 1)
    assert planset.for_nodes(out, 2).mesh.world_size == 2


@pytest.mark.parametrize("args,needle", [
    (["--cluster", "2x2xcpu", "--nnodes", "3:2"], "--nnodes 3:2: MIN must be at least 1 and at most MAX"),
    (["--cluster", "2x2xcpu", "--nnodes", "1:3"], "the cluster is the full allocation, so MAX must be its node count"),
    (["--cluster", "2x1x2xcpu@1Gbps", "--nnodes", "1:2"], "a cluster of islands is planned for one size"),
    (["--cluster", "2x2xcpu", "--nnodes", "one:two"], "is not MIN:MAX node counts"),
    (["--cluster", "2x2xcpu", "--mtbf", "0"], "is not a positive number"),
])
def test_bad_sizes_are_one_line(args, needle, capsys):
    try:
        code = main(["plan", "--model", "tiny-gpt", "--global-batch", "8", *args])
    except SystemExit as e:  # argparse's own line for a value of the wrong form
        code = e.code
    assert code == 2 and needle in capsys.readouterr().err


def test_a_set_holding_another_models_plan_or_no_plan_is_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "set"
    assert main(["plan", "--model", "tiny-gpt", "--cluster", "2x2xcpu", "--global-batch", "8", "--nnodes", "1:2",
                 "--out", str(out)]) == 0
    other = plan("tiny-llama", cluster="3x2xcpu", train=TrainConfig(global_batch=12))
    other.save(out / "nodes-3.json")
    capsys.readouterr()
    assert main(["explain", str(out)]) == 2
    err = capsys.readouterr().err
    assert "nodes-3.json is a plan of model 'tiny-llama'" in err and "a set holds one model's plans" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["explain", str(empty)]) == 2
    assert "holds no plan file nodes-N.json" in capsys.readouterr().err
    # writing a set again into the directory replaces the old sizes' files
    assert main(["plan", "--model", "tiny-gpt", "--cluster", "2x2xcpu", "--global-batch", "8", "--nnodes", "2:2",
                 "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["nodes-2.json", "plan-set.json"]

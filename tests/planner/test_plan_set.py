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
    # with n nodes up the fastest plan of at most n nodes runs (on cpus, whose links between nodes are slow, fewer
    # nodes can be faster), and its throughput is stated relative to the best with every node up
    best = {n: min(rows[k]["step_time_s"] for k in rows if k <= n) for n in rows}
    for n in (1, 2, 3):
        assert rows[n]["relative_throughput"] == pytest.approx(best[3] / best[n])
        assert rows[rows[n]["runs"]]["step_time_s"] == best[n]
    # a job of n nodes fails n/3 as often as the full one (10 h between interruptions at 3 nodes)
    assert rows[1]["resilience"]["mtbf_s"] == pytest.approx(30 * 3600)
    assert rows[3]["resilience"]["mtbf_s"] == pytest.approx(10 * 3600)
    assert "throughput" in report and "expected time lost" in report and "assumed" in report
    # explain reads the set back from its plan files alone
    (out / "plan-set.json").unlink()
    assert main(["explain", str(out)]) == 0
    again = capsys.readouterr().out
    assert [line for line in again.splitlines()[1:] if line.strip()] == \
        [line for line in report.splitlines()[1:] if line.strip() and not line.startswith(("plans written", "run it"))]
    # the command to run it carries the full size's intervals, snapshots where they lose less than checkpoints alone
    full = rows[3]["resilience"]
    snaps = (f" --snapshot-every {full['snapshots']['every_steps']}"
             if full["snapshots"]["lost_fraction"] < full["lost_fraction"] else "")
    assert (f"run it elastically on every node: partita run {out} --model tiny-gpt --nnodes 1:3 --rdzv-endpoint "
            f"HOST:PORT --checkpoint-dir DIR --checkpoint-every {full['every_steps']}{snaps}\n") in report


def test_a_size_no_plan_fits_says_why_and_the_others_are_kept(tmp_path, capsys):
    out = tmp_path / "set"
    assert main(["plan", "--model", BIG, "--cluster", "2x1xcpu", "--global-batch", "4", "--nnodes", "1:2",
                 "--out", str(out), "--json"]) == 0
    rows = {r["nodes"]: r for r in json.loads(capsys.readouterr().out)["sizes"]}
    assert rows[1]["file"] is None and "GiB per device" in rows[1]["why"] and rows[1]["runs"] is None
    assert rows[2]["file"] == "nodes-2.json" and (out / "nodes-2.json").is_file()
    assert not (out / "nodes-1.json").exists()
    with pytest.raises(PlanError, match=r"no plan for 1 node\(s\) or fewer \(it has 2\)"):
        planset.for_nodes(out, 1)
    assert planset.for_nodes(out, 2)[1].mesh.world_size == 2


def test_a_size_whose_meshes_cannot_split_the_batch_runs_a_smaller_sizes_plan(tmp_path, capsys):
    """Global batch 8 on 3 nodes of 1 device: no data-parallel degree of a 3-device mesh divides 8 without a
    pipeline, so with 3 nodes up the 2-node plan runs and one node waits; the table says what that costs."""
    out = tmp_path / "set"
    assert main(["plan", "--model", "tiny-gpt", "--cluster", "4x1xcpu", "--global-batch", "8", "--nnodes", "2:4",
                 "--pp", "1", "--out", str(out)]) == 0
    report = capsys.readouterr().out
    summary = json.loads((out / "plan-set.json").read_text())
    rows = {r["nodes"]: r for r in summary["sizes"]}
    assert rows[3]["file"] is None and rows[3]["runs"] == 2 and "divid" in rows[3]["why"]
    assert rows[3]["relative_throughput"] == rows[2]["relative_throughput"]
    assert "runs the 2-node plan, 1 idle" in report
    assert planset.for_nodes(out, 3) == (2, Plan.load(out / "nodes-2.json"))


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


def test_partita_run_of_a_set_takes_the_plan_for_its_node_count(tmp_path):
    import subprocess
    import sys
    one, three = tmp_path / "one", tmp_path / "three"
    assert main(["plan", "--model", "tiny-gpt", "--cluster", "2x2xcpu", "--global-batch", "8", "--nnodes", "1:2",
                 "--out", str(one)]) == 0
    assert main(["plan", "--model", "tiny-gpt", "--cluster", "4x1xcpu", "--global-batch", "8", "--nnodes", "2:4",
                 "--pp", "1", "--out", str(three)]) == 0

    def run(directory, *args):
        return subprocess.run([sys.executable, "-m", "partita.cli", "run", str(directory), "--model", "tiny-gpt",
                               *args], capture_output=True, text=True, timeout=300, cwd=tmp_path)

    trained = run(one, "--steps", "2", "--losses-out", str(tmp_path / "l.json"))  # one node: nodes-1.json, 2 ranks
    assert trained.returncode == 0, trained.stderr
    assert "nodes-1.json for 1 node(s) (pp=1 dp=2 tp=1" in trained.stderr
    assert len(json.loads((tmp_path / "l.json").read_text())["losses"]) == 2
    refused = run(three, "--nnodes", "3", "--rdzv-endpoint", "127.0.0.1:29999")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "with 3 node(s) its fastest plan is the one for 2 (nodes-2.json); start 2 nodes" in refused.stderr


def test_the_run_command_takes_snapshots_only_where_they_lose_less_than_checkpoints_alone():
    from partita.cli import _intervals
    from partita.planner.estimate import resilience as r
    from partita.costmodel.hardware import parse_cluster
    from types import SimpleNamespace as NS
    plan = NS(train={"dtype": "bf16", "optimizer": "adam", "master_weights": "fp32"}, zero_stage=1,
              mesh=NS(pp=1, dp=32, tp=1, world_size=32), model={"parameters": 8_000_000_000},
              predicted={"step_time_s": 3.5})
    gpus = r.price_plan(plan, nodes=4, mtbf_s=10 * 3600, cluster=parse_cluster("4x8xH100-80GB"))
    assert gpus.snapshots.lost_fraction < gpus.lost_fraction
    assert _intervals(gpus) == f"--checkpoint-every {gpus.every_steps} --snapshot-every {gpus.snapshots.every_steps}"
    slow = r.price_plan(plan, nodes=4, mtbf_s=10 * 3600, cluster=parse_cluster("4x8xH100-80GB"), snapshot_bw=1e6)
    assert slow.snapshots.lost_fraction > slow.lost_fraction and _intervals(slow) == f"--checkpoint-every {slow.every_steps}"
    assert _intervals(None) == "--checkpoint-every N"

"""The trainer loop's hooks and the sync-mode seam (runtime.loop.trainer, runtime.loop.sync), on real 2-rank gloo
runs (tests/rank_pool.py; the toy modes are registered by tests/runtime/sync_job.py for one run each).

- A plan without the `sync` section runs as synchronous data parallelism, whose hook does nothing.
- A hook registered for a toy mode runs at every optimizer step, around it: after the backward (gradients
  present), before the parameters change, and after they did.
- A toy local SGD (no per-step gradient averaging; parameters averaged every H steps) trains as expected beside
  synchronous DP under plain SGD: H = 1 is synchronous DP (averaging parameters after one step is averaging the
  gradients of that step), H = 2 has the first step's loss and differs from the second step on.
- Every registered mode has a price and a runtime hook; an unknown mode has neither, said in one line.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from partita.costmodel import PartitaError
from partita.planner.plan import Plan
from partita.planner.plan.sync import SYNC_MODES, Sync

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT / "tests"))
import rank_pool  # noqa: E402
from test_plans_match_single_process import make_plan  # noqa: E402

JOB = Path(__file__).resolve().parent / "sync_job.py"
STEPS = 4
FLAGS = ["--model", "tiny-gpt", "--steps", str(STEPS), "--lr", "0.5", "--log-every", "0"]


def _plan_file(tmp_path: Path, name: str, sync: dict | None) -> Path:
    """A dp=2 DDP plan of tiny-gpt under plain SGD, with the given sync section (None: none, as old plans)."""
    plan = make_plan(dp=2)
    plan["train"]["optimizer"] = "sgd"
    if sync is not None:
        plan["sync"] = sync
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(plan, indent=2))
    return path


def _run(tmp_path: Path, name: str, sync: dict | None) -> dict:
    """One 2-rank run of the plan through sync_job.py: its losses (rank 0's --losses-out) and each rank's record."""
    plan, out = _plan_file(tmp_path, name, sync), tmp_path / name
    done = rank_pool.shared().run(2, [str(plan), *FLAGS, "--losses-out", str(out) + ".losses.json"], cwd=ROOT,
                                  env={"SYNC_JOB_OUT": str(out)}, timeout=300, script=JOB)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(2)]
    return {"losses": json.loads((tmp_path / f"{name}.losses.json").read_text())["losses"], "ranks": ranks,
            "stdout": done.stdout}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("sync")
    return {"synchronous": _run(tmp, "synchronous", None),
            "counted": _run(tmp, "counted", {"mode": "counted"}),
            "local_sgd_1": _run(tmp, "local_sgd_1", {"mode": "local_sgd", "options": {"every": 1}}),
            "local_sgd_2": _run(tmp, "local_sgd_2", {"mode": "local_sgd", "options": {"every": 2}})}


def test_a_plan_without_the_sync_section_runs_as_synchronous(runs, tmp_path):
    assert Plan.load(_plan_file(tmp_path, "old", None)).sync == Sync()
    sync = runs["synchronous"]
    assert len(sync["losses"]) == STEPS and all(r["record"] == [] for r in sync["ranks"])
    assert "partita run: tiny-gpt on 2 rank(s)" in sync["stdout"]  # the report printed as ever


def test_a_registered_hook_runs_around_every_optimizer_step(runs):
    want = [entry for step in range(1, STEPS + 1)
            for entry in (["during_backward", step], ["before_optimizer", step, True], ["after_optimizer", step, True])]
    for rank in runs["counted"]["ranks"]:
        assert rank["code"] == 0 and rank["record"] == want
    # a hook that touches nothing trains exactly as synchronous DP
    assert runs["counted"]["losses"] == runs["synchronous"]["losses"]


def test_a_toy_local_sgd_trains_as_expected_beside_synchronous(runs):
    sync, every1, every2 = (runs[k]["losses"] for k in ("synchronous", "local_sgd_1", "local_sgd_2"))
    assert [r["record"] for r in runs["local_sgd_2"]["ranks"]] == [[["averaged", 2], ["averaged", 4]]] * 2
    assert [r["record"] for r in runs["local_sgd_1"]["ranks"]] == [[["averaged", s] for s in range(1, 5)]] * 2
    # H = 1 under SGD: the mean of one local step from equal weights is the step on the mean gradient
    assert max(abs(a - b) for a, b in zip(every1, sync)) < 1e-5, (every1, sync)
    # H = 2: the same first step (same weights), then replicas that drifted apart between averagings
    assert every2[0] == pytest.approx(sync[0], abs=1e-6)
    assert min(abs(a - b) for a, b in zip(every2[1:], sync[1:])) > 1e-4, (every2, sync)


def test_every_mode_has_a_price_and_a_hook_and_an_unknown_one_neither():
    from partita.planner.estimate.sync import PRICES
    from partita.runtime.loop.sync import HOOKS, Synchronous, make_hook
    assert {"synchronous", "compressed", "diloco", "streaming"} <= set(SYNC_MODES)
    assert {e.price for e in SYNC_MODES.values()} <= set(PRICES) <= set(SYNC_MODES)  # each entry finds its own
    assert {e.hook for e in SYNC_MODES.values()} <= set(HOOKS) <= set(SYNC_MODES)
    assert isinstance(make_hook(Sync(), executor=None, topo=None), Synchronous)
    with pytest.raises(PartitaError) as refused:
        make_hook(Sync(mode="local-sgd"), executor=None, topo=None)
    assert str(refused.value) == f"sync mode 'local-sgd' has no runtime hook; accepted: {', '.join(SYNC_MODES)}"

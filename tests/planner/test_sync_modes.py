"""Sync modes on the planner's side (planner.plan.sync, planner.estimate.sync, SearchSpace.sync, `partita plan --sync`).

- A plan without the `sync` section (every plan written before it) loads as synchronous and is written back
  byte for byte as it was; a synchronous plan is written without the section.
- An unknown or malformed mode is one line at load (every command that reads a plan), in SearchSpace and at
  the CLI, naming the accepted modes; the section's strings are checked like every other string of a plan.
- The synchronous price is what the estimator already computes (the breakdown's dp_comm_s), no extra memory.
- A mode registered for a test (a registry entry) is accepted with its declared options and nothing else.
"""
from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from partita import cli
from partita.costmodel import PartitaError
from partita.planner.plan import Plan, PlanError
from partita.planner.plan import sync as sync_contract
from partita.planner.plan.sections import COUNT
from partita.planner.plan.sync import SYNC_MODES, Sync, SyncMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from test_plans_match_single_process import make_plan  # noqa: E402
from test_plan_files import one_line_error  # noqa: E402  (tests/planner, beside this file)


@pytest.fixture(scope="module")
def old_plan() -> dict:
    """A plan dict of the shape written before the sync section existed (dp=2, tiny-gpt)."""
    return make_plan(dp=2)


def test_a_plan_without_the_section_loads_as_synchronous_and_round_trips(old_plan, tmp_path):
    assert "sync" not in old_plan
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old_plan, indent=2) + "\n")
    plan = Plan.load(path)
    assert plan.sync == Sync() and plan.sync.mode == "synchronous" and plan.sync.is_default
    written = plan.to_dict()
    assert "sync" not in written
    again = tmp_path / "again.json"
    plan.save(again)
    assert Plan.load(again).to_json() == plan.to_json()
    assert json.loads(again.read_text()) == written


def test_an_explicit_synchronous_section_loads_and_is_written_as_the_default(old_plan):
    plan = Plan.from_dict({**old_plan, "sync": {"mode": "synchronous"}})
    assert plan.sync.is_default and "sync" not in plan.to_dict()
    assert plan.to_json() == Plan.from_dict(old_plan).to_json()


@pytest.mark.parametrize("section, needle", [
    ({"mode": "local-sgd"}, f"sync.mode is 'local-sgd'; accepted: {', '.join(SYNC_MODES)}"),
    ({"mode": None}, "sync.mode is None; accepted: synchronous"),
    ({"mode": 3}, "sync.mode is 3; accepted: synchronous"),
    ({"mode": ["synchronous"]}, "sync.mode is ['synchronous']; accepted: synchronous"),
    ({}, "sync.mode is None; accepted: synchronous"),
    ("synchronous", "sync must be a JSON object"),
    ([], "sync must be a JSON object"),
    ({"mode": "synchronous", "every": 4}, "sync has unknown key 'every'"),
    ({"mode": "synchronous", "options": []}, "sync.options must be a JSON object"),
    ({"mode": "synchronous", "options": {"every": 4}},
     "sync.options.every is not an option of the synchronous mode; it takes: none"),
    ({"mode": "x" * 100_000}, "accepted: synchronous"),
    ({"mode": "$(touch PWNED)"}, "sync.mode is '$(touch PWNED)'; accepted: synchronous"),
    ({"mode": "synchronous\x1b[31m"}, "holds a control character"),
    ({"mode": "\u202esynchronous"}, "holds a control character"),
])
def test_a_bad_section_is_one_line_in_every_command(old_plan, tmp_path, capsys, monkeypatch, section, needle):
    """At load: explain, compare, export and run (refused before anything is launched)."""
    def launched(*a, **k):
        raise AssertionError("started a process")
    monkeypatch.setattr(subprocess, "run", launched)
    monkeypatch.setattr(subprocess, "Popen", launched)
    path = tmp_path / "p.json"
    path.write_text(json.dumps({**copy.deepcopy(old_plan), "sync": section}))
    with pytest.raises(PlanError, match=None) as refused:
        Plan.load(path)
    assert needle in str(refused.value) and "\n" not in str(refused.value)
    p = str(path)
    for argv in (["explain", p], ["compare", p, p], ["export", p, "--to", "megatron"],
                 ["run", p, "--model", "tiny-gpt", "--steps", "1"]):
        assert needle in one_line_error(argv, capsys)


@pytest.mark.parametrize("mode", ["local-sgd", "", 5, None, ("synchronous", "x")])
def test_search_space_accepts_only_registered_modes(mode):
    from partita.planner.enumerate.space import SearchSpace
    assert SearchSpace().sync == "auto" and SearchSpace(sync="synchronous").fixed() == {"sync": "synchronous"}
    assert SearchSpace(sync=("synchronous", "diloco")).sync == ("synchronous", "diloco")
    with pytest.raises(PartitaError) as refused:
        SearchSpace(sync=mode)
    shown = mode[-1] if isinstance(mode, tuple) else mode
    assert str(refused.value) in (f"sync is {shown!r}; accepted: {', '.join(SYNC_MODES)}, auto",
                                  f"sync must be a mode, a tuple of modes or 'auto'; got {mode!r}")


def test_the_cli_flag_refuses_an_unknown_mode_inone_line_error(tmp_path, capsys):
    line = one_line_error(["plan", "--model", "tiny-gpt", "--cluster", "2xcpu", "--global-batch", "4", "--sync", "local-sgd",
                      "--out", str(tmp_path / "p.json")], capsys)
    assert line == f"partita: error: sync is 'local-sgd'; accepted: {', '.join(SYNC_MODES)}, auto"
    assert not (tmp_path / "p.json").exists()


def test_the_synchronous_price_is_the_estimators_dp_comm_and_no_memory(tmp_path, capsys):
    """A solved plan, asked for synchronous explicitly (API and CLI), is the plan made without asking: no sync
    section, the same prediction; its price is the breakdown's exposed dp traffic, no extra memory."""
    from partita.planner.api import plan_search
    from partita.planner.enumerate.space import SearchSpace, TrainConfig
    from partita.planner.estimate.sync import PRICES, SyncPrice, sync_price
    train = TrainConfig(global_batch=4)
    plain = plan_search("tiny-gpt", cluster="2xcpu", train=train, space=SearchSpace(dp=(2,), zero=(0,)))[1]
    asked = plan_search("tiny-gpt", cluster="2xcpu", train=train,
                        space=SearchSpace(dp=(2,), zero=(0,), sync="synchronous"))[1]
    # on one island "auto" (the default) is synchronous: the same plan, which records the restriction asked for
    assert asked.predicted == plain.predicted and asked.mesh == plain.mesh and "sync" not in plain.to_dict()
    assert asked.solver["fixed"] == {**plain.solver["fixed"], "sync": "synchronous"}
    price = sync_price("synchronous", plain.predicted)
    dp_comm = plain.predicted["breakdown"]["dp_comm_s"]
    assert dp_comm > 0  # two ranks: the gradient all-reduce has a latency at least
    assert price == SyncPrice(exposed_s=dp_comm, extra_memory_bytes=0)
    assert {e.price for e in SYNC_MODES.values()} <= set(PRICES) <= set(SYNC_MODES)  # every mode is priced
    with pytest.raises(PartitaError, match=re.escape(f"sync mode 'local-sgd' has no price; accepted: {', '.join(SYNC_MODES)}")):
        sync_price("local-sgd", plain.predicted)
    out = tmp_path / "cli.json"
    assert cli.main(["plan", "--model", "tiny-gpt", "--cluster", "2xcpu", "--global-batch", "4", "--dp", "2",
                     "--zero", "0", "--sync", "synchronous", "--json", "--out", str(out)]) == 0
    capsys.readouterr()
    assert "sync" not in json.loads(out.read_text())


def test_a_registered_mode_takes_its_declared_options_only(old_plan, monkeypatch):
    """What a new mode's registry entry gives: its name accepted, its options checked like a plan's figures."""
    monkeypatch.setitem(SYNC_MODES, "local_sgd", SyncMode(name="local_sgd", summary="average every H steps",
                                                          options={"every": COUNT}))
    plan = Plan.from_dict({**old_plan, "sync": {"mode": "local_sgd", "options": {"every": 2}}})
    assert plan.sync == Sync(mode="local_sgd", options={"every": 2})
    assert plan.to_dict()["sync"] == {"mode": "local_sgd", "options": {"every": 2}}
    assert Plan.from_dict(json.loads(plan.to_json())).sync == plan.sync
    for options, needle in (({"every": "2"}, "sync.options.every must be a whole number"),
                            ({"every": -1}, "sync.options.every must be a whole number"),
                            ({"outer_lr": 0.7}, "sync.options.outer_lr is not an option of the local_sgd mode; it "
                                                "takes: every")):
        with pytest.raises(PlanError, match=None) as refused:
            Plan.from_dict({**old_plan, "sync": {"mode": "local_sgd", "options": options}})
        assert needle in str(refused.value)
    assert sync_contract.accepted().endswith(", local_sgd") and sync_contract.accepted().startswith(
        "synchronous, compressed, diloco")

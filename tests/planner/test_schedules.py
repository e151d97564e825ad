"""planner.plan.schedules: every schedule's facts in one record, read alike by the plan's validation, the
search space, the candidate cost, the runtime, the CLI and the Gantt plot (issue #43 step 3)."""
from __future__ import annotations

import argparse
import ast
import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch.distributed.pipelining as pipelining
from torch.distributed.pipelining.schedules import get_schedule_class

from partita.cli import build_parser
from partita.planner.enumerate.space import SCHEDULE_CHOICES, TrainConfig, _schedules
from partita.planner.plan import Plan, PlanError
from partita.planner.plan import executable
from partita.planner.plan.schedules import AUTO, SCHEDULES, schedule
from partita.report import viz
from partita.runtime.parallel import pp as runtime_pp

ROOT = Path(__file__).resolve().parents[2]
SHAPES = [(1, 1), (2, 2), (3, 2), (4, 2), (6, 3), (8, 4), (3, 4), (12, 4), (16, 8), (5, 3),
          (1, 2), (1, 4), (2, 8)]  # (m, pp); the last four: fewer micro-batches than stages


def _runs(record):
    """(m, pp, v) the record runs, over SHAPES and its chunk counts."""
    for (m, p), v in itertools.product(SHAPES, (2, 3, 4) if record.virtual else (1,)):
        if record.refusal(m, p, v) is None:
            yield m, p, v


def _peak_chunks(tl: viz.Timeline, rank: int) -> int:
    """Most chunk activations rank `rank` holds at once in the simulated timeline (forward done, backward not)."""
    events = sorted([(q.end, 1) for q in tl.passes if q.rank == rank and q.kind == "F"]
                    + [(q.end, -1) for q in tl.passes if q.rank == rank and q.kind == "B"])
    held = peak = 0
    for _, d in events:
        held += d
        peak = max(peak, held)
    return peak


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_the_gantt_order_holds_what_the_in_flight_formula_prices(name):
    record, seen = SCHEDULES[name], 0
    for m, p, v in _runs(record):
        tl = viz.simulate_pipeline(name, m, [1.0] * p, [2.0] * p, virtual_stages=v)
        simulated = [_peak_chunks(tl, r) / v for r in range(p)]
        assert simulated == pytest.approx(record.in_flight(m, p, v).tolist()), (m, p, v)
        seen += 1
    assert seen >= 4, f"{name}: too few runnable shapes tested"


def _chunk_at_simulated_peak(tl: viz.Timeline, rank: int, chunk: int) -> int:
    """Micro-batches of `chunk` rank `rank` holds when the simulated timeline first reaches its peak."""
    events = sorted([(q.end, 1, q.chunk) for q in tl.passes if q.rank == rank and q.kind == "F"]
                    + [(q.end, -1, q.chunk) for q in tl.passes if q.rank == rank and q.kind == "B"],
                    key=lambda e: (e[0], e[1]))
    held, by_chunk, peak, at_peak = 0, {}, 0, 0
    for _, d, c in events:
        held += d
        by_chunk[c] = by_chunk.get(c, 0) + d
        if held > peak:
            peak, at_peak = held, by_chunk.get(chunk, 0)
    return at_peak


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_the_ends_chunks_hold_what_the_timeline_holds_at_each_end_ranks_peak(name):
    """edge_in_flight (what the embeddings' and the head's chunks hold, planner.estimate.phases) against the
    replayed order; one chunk per rank: in_flight's ends."""
    record = SCHEDULES[name]
    for m, p, v in _runs(record):
        tl = viz.simulate_pipeline(name, m, [1.0] * p, [2.0] * p, virtual_stages=v)
        last = v - 1 if record.virtual else 0
        expected = (_chunk_at_simulated_peak(tl, 0, 0), _chunk_at_simulated_peak(tl, p - 1, last))
        assert record.edge_in_flight(m, p, v) == expected, (m, p, v)
        if v == 1:
            assert expected == tuple(record.in_flight(m, p, v)[[0, -1]])
    # Nemotron-4 340B as NeMo ran it (pp 8, 12 chunks, 16 micro-batches): the last rank averages 7.4 micro-batches
    # over its chunks and holds one of the head's; rank 0, 8.6 on average and 15 of the embeddings' chunk
    if record.virtual:
        assert record.edge_in_flight(16, 8, 12) == (15.0, 1.0)
        assert record.in_flight(16, 8, 12)[[0, -1]] == pytest.approx([103 / 12, 89 / 12])


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_the_simulated_step_is_the_priced_step(name):
    """Equal stages: the replayed order takes exactly m tau + bubble; unequal ones never beat the lower bound."""
    record, rng = SCHEDULES[name], np.random.default_rng(3)
    for m, p, v in _runs(record):
        tl = viz.simulate_pipeline(name, m, [0.5] * p, [1.25] * p, virtual_stages=v)
        assert tl.pipeline_s == pytest.approx(record.pipeline_s(m, [1.75] * p, v)), (m, p, v)
        tau = rng.uniform(0.2, 3.0, p)
        assert record.pipeline_s(m, tau, v) >= record.lower_bound_factor(m, p, v) * tau.sum() - 1e-12


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_each_rank_runs_every_pass_once_forward_before_backward(name):
    record = SCHEDULES[name]
    for m, p, v in _runs(record):
        for r in range(p):
            order = record.order(p, m, r, v)
            assert sorted(order) == sorted((k, i, c) for k in "FB" for i in range(m) for c in range(v))
            assert all(order.index(("F", i, c)) < order.index(("B", i, c)) for i in range(m) for c in range(v))


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_the_torch_class_named_exists_and_is_torchs_own_for_the_name(name):
    record = SCHEDULES[name]
    cls = getattr(pipelining, record.torch_class)
    assert get_schedule_class(name) is cls  # torchtitan's --pipeline_parallel_schedule takes the same name
    assert runtime_pp.SCHEDULES[name] == record.torch_class


def test_unknown_names_are_refused_with_the_accepted_ones():
    with pytest.raises(PlanError, match="'ZeroBubble' is not one partita runs; accepted: 1F1B, GPipe"):
        schedule("ZeroBubble")
    assert schedule("GPipe") is SCHEDULES["GPipe"]


# ---- one refusal rule: plan validation, the runtime and the search space ------------------------------

def tiny_plan(name: str, m: int, pp: int, v: int) -> dict:
    """tiny-gpt (2 blocks) over pp x v stages of one module each where it can: the shape plan validation reads."""
    mods = ["tok_emb", "pos_emb", "blocks.0", "blocks.1", "ln_f", "head"]
    n = pp * v
    cuts = [round(k * len(mods) / n) for k in range(n + 1)]
    stages = [{"index": i, "modules": mods[cuts[i]:cuts[i + 1]], "split_at": None if i == 0 else mods[cuts[i]]}
              for i in range(n)]
    owner = {f: i for i, s in enumerate(stages) for f in s["modules"]}
    return {"schema": "partita.plan/1", "model": {"name": "tiny-gpt"}, "cluster": {},
            "train": {"global_batch": m, "dtype": "fp32"}, "mesh": {"pp": pp, "dp": 1, "tp": 1},
            "schedule": {"name": name, "num_microbatches": m, "micro_batch_size": 1, "virtual_stages": v},
            "stages": stages,
            "blocks": [{"fqn": f, "stage": owner[f], "sharding": "replicate"} for f in ("blocks.0", "blocks.1")]}


REFUSED = [("1F1B", 1, 2, 1), ("Interleaved1F1B", 5, 2, 2), ("Interleaved1F1B", 3, 2, 3),
           ("Interleaved1F1B", 2, 1, 2)]


@pytest.mark.parametrize("name,m,pp,v", REFUSED)
def test_plan_validation_and_the_runtime_refuse_in_the_same_words(name, m, pp, v):
    why = SCHEDULES[name].refusal(m, pp, v)
    assert why and "\n" not in why
    with pytest.raises(PlanError) as loaded:
        Plan.from_dict(tiny_plan(name, m, pp, v))
    assert str(loaded.value) == why
    # the runtime's pre-flight, on a plan object that skipped validation (built in Python, not loaded)
    ok = Plan.from_dict(tiny_plan(name, pp if name == "1F1B" else 2 * pp, pp, v)) if pp > 1 else \
        Plan.from_dict(tiny_plan("1F1B", m, 1, 1))
    bypass = dataclasses.replace(ok, schedule=dataclasses.replace(ok.schedule, name=name, num_microbatches=m,
                                                                  virtual_stages=v))
    with pytest.raises(PlanError) as ran:
        runtime_pp.check_schedule(bypass)
    assert str(ran.value) == why


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_what_validation_accepts_the_runtime_accepts(name):
    record = SCHEDULES[name]
    for m, p, v in _runs(record):
        if p * v <= 6 and (p > 1 or not record.virtual):
            plan = Plan.from_dict(tiny_plan(name, m, p, v))
            runtime_pp.check_schedule(plan)


def test_the_search_space_tries_exactly_what_the_rule_lets_run():
    layers = 8
    for (m, p), requested in itertools.product(SHAPES, SCHEDULE_CHOICES):
        if p == 1:
            continue  # pp = 1 plans no pipeline
        tried = _schedules(requested, p, m, layers)
        for name, v in tried:
            assert SCHEDULES[name].refusal(m, p, v, layers) is None
        names = [n for n, s in SCHEDULES.items() if s.searched(m, p)] if requested == AUTO else [requested]
        for name in names:
            for v in ((2, 4) if SCHEDULES[name].virtual else (1,)):
                if SCHEDULES[name].refusal(m, p, v, layers) is None:
                    assert (name, v) in tried, (requested, m, p, name, v)


def test_auto_runs_every_pipeline_shape_and_gpipe_only_below_one_microbatch_per_stage():
    """Fewer micro-batches than stages: 1F1B and interleaving refuse, and --schedule auto plans GPipe (its
    bubble priced: m max tau + sum tau - max tau); from m = pp on, 1F1B (and interleaving where it runs)."""
    for m, p in SHAPES:
        if p > 1:
            plain = [n for n, v in _schedules(AUTO, p, m, 8) if v == 1]
            assert plain == (["GPipe"] if m < p else ["1F1B"]), (m, p)


def test_the_search_space_names_the_rules_refusal(capsys):
    from partita.cli import main
    code = main(["plan", "--model", "gpt:layers=8,hidden=64,heads=4,seq=32,vocab=256", "--cluster", "8xA100-80GB",
                 "--global-batch", "12", "--pp", "2", "--dp", "4", "--virtual-stages", "2"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == f"partita: error: {SCHEDULES['Interleaved1F1B'].refusal(3, 2, 2)}"


# ---- no other place lists the schedules ---------------------------------------------------------------

def test_cli_and_search_choices_are_the_registry():
    parser = build_parser()
    plan = next(a for a in parser._subparsers._group_actions if isinstance(a, argparse._SubParsersAction))
    action = next(a for a in plan.choices["plan"]._actions if "--schedule" in a.option_strings)
    assert list(action.choices) == [AUTO, *SCHEDULES] and action.default is None  # not given: TrainConfig's
    assert TrainConfig(global_batch=1).schedule == AUTO
    assert SCHEDULE_CHOICES == (AUTO, *SCHEDULES)
    assert executable.SCHEDULES == tuple(SCHEDULES)


def test_no_product_module_lists_schedule_names_itself():
    """A tuple, list, set or dict holding two or more schedule names, anywhere in the product but the
    registry, is a second list to keep in step: read planner.plan.schedules instead."""
    names = set(SCHEDULES)
    found = []
    for top in ("costmodel", "planner", "runtime", "partita"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if path.name == "schedules.py" and path.parent.name == "plan":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                elts = node.keys if isinstance(node, ast.Dict) else \
                    node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else []
                listed = {e.value for e in elts if isinstance(e, ast.Constant) and e.value in names}
                if len(listed) >= 2:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {sorted(listed)}")
    assert not found, found


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_the_edges_from_a_shortened_order_equal_the_whole_orders(name):
    """edge_in_flight replays the order of the fewest micro-batches with the same peak (schedules.
    _same_peak_microbatches); here against the whole order of m micro-batches, m up to 8 times that."""
    from partita.planner.plan.schedules import _chunk_at_peak, _same_peak_microbatches
    record = SCHEDULES[name]
    for p in range(2, 7):
        for v in ((1, 2, 3, 4) if record.virtual else (1,)):
            for m in range(1, 8 * (2 * p + v * p) + 1):
                if record.refusal(m, p, v) is not None:
                    continue
                whole = (_chunk_at_peak(record.order(p, m, 0, v), 0),
                         _chunk_at_peak(record.order(p, m, p - 1, v), v - 1 if record.virtual else 0))
                assert record.edge_in_flight(m, p, v) == whole, (m, p, v)
                if name != "GPipe":
                    assert _same_peak_microbatches(record, m, p, v) <= 2 * p + v * p

"""Regression tests for four planner faults, each on real solves (cvxpy + HiGHS) of real models' programs:

1. a solve stopped at its time limit with no incumbent must not become a plan (it returned all zeros);
2. a solve with a cutoff must not label a solution no better than the cutoff "optimal";
3. min_pp (the Megatron baseline) must find the shallowest pipeline that fits, not the shallowest solved;
4. option pruning must keep a variant that is better only at the absent-gradient memory peak.
"""
from dataclasses import replace
from functools import lru_cache

import pytest

import partita.planner.search as search_module
from partita.costmodel.hardware import parse_cluster
from partita.costmodel.price.memory import state_bytes
from partita.costmodel.models import resolve_model
from partita.costmodel.capture import capture
from partita.planner.api import plan
from partita.planner.estimate.baselines import baseline_spaces
from partita.planner.enumerate.candidates import enumerate_candidates
from partita.planner.solve.milp import evaluate, fits, polish, solve_stages
from partita.planner.solve.milp_blocks import fits_blocks, solve_blocks
from partita.planner.enumerate.options import Variant, cost_variant, pareto_indices
from partita.planner.search import search
from partita.planner.enumerate.space import SearchSpace, TrainConfig
from partita.planner.enumerate.strategies import replicate_option

GPT48 = "gpt:layers=48,hidden=256,heads=4,seq=128,vocab=1000"
"""48 small layers: many integer counts per stage, so HiGHS has work left when the time limit is tiny."""
TIME_LIMIT_NO_INCUMBENT = "time_limit_no_incumbent"
"""The status of a solve stopped by its time limit before finding any assignment."""
NO_TIME = 1e-6
"""A time limit (seconds) HiGHS hits right after presolve, before any incumbent."""


@lru_cache(maxsize=None)
def graph_of(model: str):
    return capture(resolve_model(model), dtype="bf16")


@lru_cache(maxsize=None)
def candidates_of(model: str, cluster: str, global_batch: int):
    return enumerate_candidates(graph_of(model), parse_cluster(cluster), TrainConfig(global_batch=global_batch),
                                SearchSpace())[3]


def pipelined_candidate():
    """A 4-stage candidate of GPT48 on 2 x 8 A100s: every stage must hold layers."""
    return next(c for c in candidates_of(GPT48, "2x8xA100-80GB", 64) if c.pp == 4 and c.formulation == "counts")


# 1. time limit with no incumbent ------------------------------------------------------------------------

def test_time_limit_without_incumbent_is_not_a_plan():
    c = pipelined_candidate()
    sol = solve_stages(replace(c.problem, time_limit_s=NO_TIME))
    assert not sol.feasible, f"a {sol.status} solve returned counts placing {sol.counts.sum()} of " \
                             f"{c.problem.num_layers} layers"
    assert sol.status == TIME_LIMIT_NO_INCUMBENT and sol.counts is None and sol.objective == float("inf")


def test_time_limit_with_cutoff_and_no_incumbent_is_not_a_plan():
    c = pipelined_candidate()
    full = solve_stages(c.problem)
    sol = solve_stages(replace(c.problem, time_limit_s=NO_TIME), cutoff=2 * full.objective)
    assert not sol.feasible and sol.status == TIME_LIMIT_NO_INCUMBENT


def test_a_feasible_solve_is_a_complete_assignment_within_memory():
    c = pipelined_candidate()
    sol = solve_stages(c.problem)
    assert sol.feasible and sol.status == "optimal"
    assert sol.counts.sum() == c.problem.num_layers and (sol.counts.sum(axis=1) >= 1).all()
    assert fits(c.problem, sol.counts)


def test_polish_stopped_by_the_time_limit_keeps_the_plan():
    """The second, lexicographic solve (polish) stopped before any incumbent leaves the plan as it was."""
    c = pipelined_candidate()
    assert c.problem.option_rank.any()
    sol = solve_stages(c.problem)
    polished = polish(replace(c.problem, time_limit_s=NO_TIME), sol)
    assert polished.counts.sum() == c.problem.num_layers and (polished.counts == sol.counts).all()


def test_search_whose_solves_all_hit_the_time_limit_finds_no_plan(monkeypatch):
    """Every candidate solved with a tiny time limit: no plan (before the fix: 0 of 48 layers, MFU > 5000%)."""
    real = search_module.solve_stages
    monkeypatch.setattr(search_module, "solve_stages",
                        lambda prob, cutoff=None: real(replace(prob, time_limit_s=NO_TIME), cutoff=cutoff))
    space = SearchSpace(pp=(4,), tp=(1,), zero=(0,), recompute=("none",), offload=False)
    result = search(graph_of(GPT48), parse_cluster("2x8xA100-80GB"), TrainConfig(global_batch=64), space=space,
                    raise_infeasible=False)
    assert result.best is None, f"a plan placing {result.best.solution.counts.sum()} of 48 layers"
    solved = [c for c in result.candidates if c.solution is not None]
    assert solved and all(c.solution.status == TIME_LIMIT_NO_INCUMBENT for c in solved)


def test_block_program_time_limit_without_incumbent_is_not_a_plan(two_tower):
    """A model that is not one stack of identical layers is planned with the per-block program
    (planner.solve.milp_blocks): 4 stages of its 7 blocks."""
    cands = candidates_of(two_tower, "1x4xA100-80GB", 16)
    c = max((c for c in cands if c.formulation == "blocks"), key=lambda c: (c.pp, len(c.problem.block_of)))
    assert c.pp == 4 and c.problem.num_blocks > c.pp
    sol = solve_blocks(replace(c.problem, time_limit_s=NO_TIME))
    assert not sol.feasible, f"a {sol.status} solve returned {sol.counts.sum()} of {c.problem.num_blocks} blocks"
    assert sol.status == TIME_LIMIT_NO_INCUMBENT
    full = solve_blocks(c.problem)
    assert full.feasible and fits_blocks(c.problem, full.counts) and full.counts.sum() == c.problem.num_blocks


# 2. cutoff ------------------------------------------------------------------------------------------------

def cutoff_candidate():
    """A pipelined candidate whose objective has a sizeable constant (the prefix/suffix stage time)."""
    c = max((c for c in candidates_of(GPT48, "2x8xA100-80GB", 64) if c.pp >= 2 and c.formulation == "counts"),
            key=lambda c: c.problem.extra_time.sum() / c.virtual_stages / c.lower_bound)
    return replace(c.problem, mip_rel_gap=0.0)


def test_cutoff_below_the_optimum_is_cut_off_not_optimal():
    prob = cutoff_candidate()
    optimum = solve_stages(prob)
    assert optimum.status == "optimal"
    cutoff = optimum.objective * (1 - 1e-3)  # no assignment is better than this
    sol = solve_stages(prob, cutoff=cutoff)
    assert sol.status == "cutoff" and not sol.feasible, \
        f"labelled {sol.status!r} with step time {sol.objective:.6g} s, not better than the cutoff {cutoff:.6g} s"


def test_cutoff_above_the_optimum_reports_the_true_status_and_gap():
    prob = cutoff_candidate()
    optimum = solve_stages(prob)
    sol = solve_stages(prob, cutoff=optimum.objective * (1 + 1e-3))
    assert sol.status == "optimal" and sol.mip_gap is not None and sol.mip_gap <= 1e-6
    assert sol.objective == pytest.approx(optimum.objective, rel=1e-9)
    assert sol.objective == pytest.approx(evaluate(prob, sol.counts), rel=1e-12)


# 3. min_pp ------------------------------------------------------------------------------------------------

def test_megatron_baseline_takes_the_shallowest_pipeline_that_fits():
    """~58B parameters on 32 A100s, TP8, full recompute, no ZeRO: one stage does not fit, two do, and four
    (interleaved) have the lowest bound, which used to prune every two-stage candidate before it was solved."""
    graph = graph_of("gpt:layers=32,hidden=12288,heads=96,seq=2048,vocab=51200")
    cluster, train = parse_cluster("4x8xA100-80GB"), TrainConfig(global_batch=64)
    megatron = next(s for s in baseline_spaces(cluster) if s.min_pp)
    at_depth = lambda pp: search(graph, cluster, train, space=replace(megatron, pp=(pp,), min_pp=False),
                                 raise_infeasible=False).best
    assert at_depth(1) is None and at_depth(2) is not None
    result = search(graph, cluster, train, space=megatron, raise_infeasible=False)
    assert result.best is not None and result.best.pp == 2, f"pp={result.best.pp} while pp=2 fits"
    assert result.best.step_time == pytest.approx(at_depth(2).step_time, rel=5e-3)


# 4. option pruning ----------------------------------------------------------------------------------------

def real_variant() -> Variant:
    graph = graph_of("tiny-gpt")
    cluster = parse_cluster("1x8xA100-80GB")
    base = replicate_option(graph, graph.repeated()[0], cluster, 1)
    return cost_variant(Variant(base), cluster, state_bytes("bf16", "adam"), 0, 1, 1, 1)


@pytest.mark.parametrize("order", ["more-gradient first", "more-gradient last"])
def test_variant_better_only_in_gradient_bytes_survives_pruning(order):
    """Same state W, more of it gradient G: less memory at the absent-gradient peak (W - G + k A)."""
    v = real_variant()
    assert v.grad > 0
    more = replace(v, grad=v.grad)
    less = replace(v, grad=v.grad / 2)
    vs = [more, less] if order == "more-gradient first" else [less, more]
    kept = [vs[i] for i in pareto_indices(vs)]
    assert any(k is more for k in kept), "the variant with less memory before the first backward was pruned"


def test_variant_trading_state_for_gradient_share_survives_pruning():
    """More state but less of it outside the gradients: neither variant dominates the other."""
    v = real_variant()
    a = replace(v, grad=0.0)
    b = replace(v, state=v.state * 1.1, grad=v.state * 0.5)  # W - G: 0.6 W < W
    assert sorted(pareto_indices([a, b])) == [0, 1]


def test_a_recomputing_variant_never_prunes_one_free_of_the_gated_phases():
    """Offload under op recompute is faster and holds less host memory than plain offload, but a recomputing
    layer makes the gated phases bind on its stage (the rebuild; under autocast the forward end, which holds
    its weight casts): plain offload must survive it, or a plan that fits is missed (llama3-8b at global
    batch 4 on one H200 was refused, though plain offload fits it)."""
    v = real_variant()
    plain = replace(v, recompute="none", offload_activations=True, act=0.0, host_act=4e8, time=0.12)
    op = replace(v, recompute="op", offload_activations=True, act=0.0, host_act=1e8, time=0.04)
    assert sorted(pareto_indices([op, plain])) == [0, 1]
    assert pareto_indices([op, replace(op, time=0.05)]) == [0]  # between recomputing variants, still pruned


def test_llama3_8b_fits_one_h200_by_offloading():
    train = TrainConfig(global_batch=4, seq_len=4096, dtype="bf16")
    p = plan("llama3-8b", cluster="1xH200-141GB", train=train)
    assert p.predicted["peak_memory_bytes"] <= parse_cluster("1xH200-141GB").device.usable_memory()
    assert any(b.offload_activations and b.recompute == "none" for b in p.blocks)


def test_what_a_plan_keeps_in_host_memory_is_stated_and_bounded():
    """The llama3-8b shape at 35 layers fills an H200 with its model states, so its activations go to host memory
    (135 GiB). The plan states it (runtime.launcher.sizes checks it against the host a run starts on), and it is
    the quantity the solver bounds: on a host with 80% of that room the plan keeps at most that there."""
    wide = "llama:layers=35,hidden=4096,heads=32,kv_heads=8,ffn=14336,vocab=128256,seq=4096"
    train = TrainConfig(global_batch=4, seq_len=4096, dtype="bf16")
    cl = parse_cluster("1xH200-141GB")
    (host,) = plan(wide, cluster=cl, train=train).predicted["host_memory_per_stage"]
    assert 100 * 2**30 < host <= cl.device.host_memory_bytes
    smaller = replace(cl, device=replace(cl.device, host_memory_bytes=0.8 * host))
    (less,) = plan(wide, cluster=smaller, train=train).predicted["host_memory_per_stage"]
    assert 0 < less <= 0.8 * host
    assert "host_memory_per_stage" not in plan(wide.replace("35", "4"), cluster=cl, train=train).predicted


def test_the_memory_bound_refuses_only_programs_with_no_assignment(monkeypatch):
    """milp.cannot_fit skips HiGHS for programs whose memory rows no assignment meets: it must never refuse
    one HiGHS solves, and it should catch most that HiGHS finds infeasible (capacities cut to make some)."""
    import numpy as np

    import partita.planner.solve.milp as milp
    cases = [replace(c.problem, capacity=np.asarray(c.problem.capacity) * f)
             for c in candidates_of(GPT48, "2x8xA100-80GB", 64)[:40] if c.formulation == "counts"
             for f in (1.0, 0.02, 0.005, 0.002)]
    refused = [milp.cannot_fit(p) for p in cases]
    monkeypatch.setattr(milp, "cannot_fit", lambda prob: False)
    solved = [solve_stages(p) for p in cases]
    assert not any(r and s.feasible for r, s in zip(refused, solved))
    infeasible = [not s.feasible for s in solved]
    assert sum(infeasible) >= 10 and sum(refused) >= sum(infeasible) // 2, (sum(refused), sum(infeasible))

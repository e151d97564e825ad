"""planner.enumerate.lazy: candidates built in order of a cheap bound. The bound is never above a built
candidate's lower bound, and the search solves the same candidates in the same order, and returns the same
plan, as the search that builds every candidate first -- in fewer builds, and without the solves of candidates
the cheap bound proves out of memory."""
import pytest

from partita.planner import TrainConfig
from partita.planner import search as search_module
from partita.planner.api import plan_search
from partita.planner.enumerate.base import _Bases
from partita.planner.enumerate.lazy import _states_fit, pre_bound
from partita.planner.solve.bounds import stage_bound
from partita.planner.solve.milp import solve_stages
from partita.planner.enumerate.space import SearchSpace

CASES = {  # model, cluster, train, space: dense with pipelines and TP; experts; TP overlap and interleaving
    "megatron-18b": ("megatron-18b", "8x8xA100-80GB", TrainConfig(global_batch=512, seq_len=2048), None),
    "tiny-moe": ("tiny-moe", "8xcpu", TrainConfig(global_batch=16), None),
    "llama3-8b-overlap": ("llama3-8b", "4x8xH100-80GB", TrainConfig(global_batch=64),
                          SearchSpace(stack="te-2024")),
}


@pytest.fixture(scope="module", params=list(CASES))
def searched(request):
    model, cluster, train, space = CASES[request.param]
    result, _ = plan_search(model, cluster=cluster, train=train, space=space)
    return result


def _solved(result):
    return [(c.key, c.solution.status, c.solution.objective) for c in result.candidates if c.solution is not None]


def _out_of_memory(c) -> bool:
    """Whether no program of the candidate fits: its stage bound says so, or the solver does."""
    return stage_bound(c.problem) == float("inf") or not solve_stages(c.problem).feasible


def test_the_cheap_bound_is_never_above_a_candidates_lower_bound(searched):
    """... and is inf only where no program of the candidate fits (the states check)."""
    r = searched
    bases = _Bases(r.graph, r.cluster, r.prefix, r.layers, r.suffix)
    every = r.every_candidate()
    assert not r.unbuilt.pending and len(every) >= len(r.candidates)
    for c in every:
        choice = (c.pp, c.dp, c.tp, c.zero, c.micro_batch, c.schedule, c.virtual_stages, c.sequence_parallel,
                  c.cp, c.ep, c.tp_overlap, c.p2p_overlap)
        bound = pre_bound(bases, r.train, r.space, choice)
        assert bound <= c.lower_bound * (1 + 1e-12) or _out_of_memory(c), c.key


def test_the_states_check_proves_the_choices_out_of_memory_that_the_programs_say_are():
    """gpt3-175b on 64 A100s: most choices cannot hold the model's states; the cheap check finds them before they
    are built, and every one it finds is out of memory by its own program."""
    result, _ = plan_search("gpt3-175b", cluster="8x8xA100-80GB",
                            train=TrainConfig(global_batch=1536, seq_len=2048))
    bases = _Bases(result.graph, result.cluster, result.prefix, result.layers, result.suffix)
    built = len(result.candidates)
    proved = [c for c in result.every_candidate()
              if _states_fit(bases, bases.running(result.train, c.zero).get(c.tp, c.sequence_parallel)[0],
                             result.train, result.space, c.pp, c.dp * c.cp, c.tp, c.sequence_parallel, c.zero, c.ep,
                             c.virtual_stages) is False]
    assert len(proved) > 1000 and built < 1200  # (2,102 were built without the check)
    assert all(stage_bound(c.problem) == float("inf") for c in proved)


def test_the_search_solves_the_same_candidates_and_finds_the_same_plan_in_fewer_builds(searched, monkeypatch):
    r = searched
    lazy = search_module.search(r.graph, r.cluster, r.train, space=r.space)
    monkeypatch.setattr(search_module, "lazy_candidates", lambda *a: None)  # build every candidate first
    eager = search_module.search(r.graph, r.cluster, r.train, space=r.space)
    assert lazy.best.key == eager.best.key and lazy.best.step_time == eager.best.step_time
    skipped = [c for c in eager.candidates if c.solution is not None and c.key not in {x[0] for x in _solved(lazy)}]
    assert _solved(lazy) == [x for x in _solved(eager) if x[0] not in {c.key for c in skipped}]
    assert all(not c.solution.feasible for c in skipped)  # solved before any plan bounded them, out of memory
    assert len(lazy.candidates) <= len(eager.candidates) <= lazy.considered  # (unbuilt choices may build none)
    if r.graph.name != "tiny-moe":  # a CPU's tiny model is priced by its collectives, which the cheap bound omits
        assert len(lazy.candidates) < len(eager.candidates) / 2
    assert len(lazy.every_candidate()) == len(eager.candidates)  # what a picture of every mesh asks for

"""A stage's memory is checked at each moment it can peak (planner.search.memory_phases)."""
import numpy as np
import pytest

from partita.costmodel.hardware import parse_cluster
from partita.costmodel.price.memory import state_bytes
from partita.planner.solve.milp import phase_memory
from partita.planner.search import SearchSpace, TrainConfig
from partita.planner.enumerate.candidates import _Bases, build_candidate, split_model
from partita.planner.estimate.phases import stage_memory

SB = state_bytes("fp32", "adam")


def candidate(graph, pp=1, dp=1, tp=1, zero=0, b=4, batch=8, recompute=("none",)):
    prefix, layers, suffix = split_model(graph)
    cluster = parse_cluster(f"{pp * dp * tp}xcpu")
    bases = _Bases(graph, cluster, prefix, layers, suffix)
    space = SearchSpace(recompute=recompute, offload=False)
    c = build_candidate(bases, TrainConfig(global_batch=batch, dtype="fp32"), space, pp, dp, tp, zero, b)
    return c


def test_no_gradient_exists_at_the_first_backward_of_a_step(graph_of):
    """One micro-batch: the peak (start of the backward) has no gradient yet; with two, the second
    micro-batch's backward peaks with the first one's gradients held."""
    g = graph_of("tiny-gpt")
    one, two = candidate(g, b=8), candidate(g, b=4)
    assert one.num_microbatches == 1 and two.num_microbatches == 2
    plain = next(i for i, o in enumerate(one.options) if o.recompute == "none")
    counts = np.zeros((1, len(one.options)), dtype=int)
    counts[0, plain] = 2
    o = one.options[plain]
    assert o.grad == SB.grad * o.base.param_numel
    a, b = stage_memory(one, 0, counts), stage_memory(two, 0, counts)
    grads = 2 * o.grad + one.parts["e_grad"][0]
    states = 2 * o.state + one.parts["e_state"][0]
    assert a["phase"] == b["phase"] == "forward/backward"
    assert a["model_states"] == pytest.approx(states - grads, abs=2) and b["model_states"] == pytest.approx(states, abs=2)


def test_the_optimizer_step_is_a_phase_of_its_own(graph_of):
    """Model states and the step's temporaries (2 x the largest parameter, fp32), no activations."""
    g = graph_of("tiny-gpt")
    c = candidate(g)
    (opt,) = [q for q in c.problem.phases if q.name == "optimizer step"]
    largest = max(max(d["params"].values(), default=0) for _, d in g.g.nodes(data=True))
    assert opt.const[0] == pytest.approx(c.parts["e_state"][0] + 2 * 4 * largest)
    assert np.allclose(opt.coeff, [o.state for o in c.options])


def test_the_rebuild_phase_binds_only_where_a_layer_is_recomputed(graph_of):
    g = graph_of("tiny-gpt")
    c = candidate(g, recompute=("none", "full"))
    (rebuild,) = [q for q in c.problem.phases if q.name == "recompute"]
    none = [i for i, o in enumerate(c.options) if o.recompute == "none"]
    full = [i for i, o in enumerate(c.options) if o.recompute == "full"]
    assert rebuild.gate[full].all() and not rebuild.gate[none].any()
    counts = np.zeros((1, len(c.options)), dtype=int)
    counts[0, none[0]] = 2
    assert phase_memory(c.problem, counts)[2, 0] == -np.inf  # no recomputed layer: the phase does not apply
    counts[0, none[0]], counts[0, full[0]] = 1, 1
    assert np.isfinite(phase_memory(c.problem, counts)[2, 0])

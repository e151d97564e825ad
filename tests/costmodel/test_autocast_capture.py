"""A bf16 capture records the model as the runtime's torch.autocast runs it (costmodel.trace, costmodel.autocast).

The autocast record's saved bytes are checked against a real CPU autocast forward of the runtime's own
model and recompute code, under the allocator trace, per recompute policy (as
tests/costmodel/test_saved_bytes_by_recompute.py does in fp32): what autograd keeps for the backward is
the activations the record charges per sample times the micro-batch, plus, without recompute, one bf16
cast of every weight a matmul uses (`weight_saved_bytes`, once per micro-batch). The weight casts are
checked on their own: 2 bytes per Linear weight element, none in the as-captured bf16 record, the same
whatever the batch.
"""
import pytest
import torch
import torch.nn as nn

from partita.costmodel.hardware import parse_cluster
from partita.costmodel.models import resolve_model
from partita.costmodel.trace import capture
from partita.planner.candidates import split_model
from partita.planner.strategies import replicate_option
from partita.runtime.recipe import build_model
from tests.costmodel.test_saved_bytes_by_recompute import forward_under_policy

MODELS = ["tiny-gpt", "tiny-llama", "hf:gpt2"]
POLICIES = ["none", "selective", "op", "full"]
MICRO_BATCH = 2
TOLERANCE = 0.02


def autocast_graph(name: str, batch: int = 1):
    return capture(resolve_model(name), dtype="bf16", batch=batch, autocast="cpu").as_run("autocast")


def predicted(graph, policy: str, micro_batch: int) -> int:
    """What the planner charges one micro-batch's forward (planner.options.cost_variant): every group's
    activations under its policy, and the weight casts of the groups that do not recompute."""
    _, layers, _ = split_model(graph)
    total = 0
    for grp in graph.groups:
        o = replicate_option(graph, grp, parse_cluster("1xcpu"), 1)
        mine = policy if grp in layers else "none"
        total += o.saved_by_policy[mine] * micro_batch + (o.weight_saved if mine == "none" else 0)
    return total


def linear_weight_bytes_bf16(model: nn.Module) -> int:
    """2 bytes per element of every weight a matmul reads: nn.Linear's, and transformers' Conv1D's (a tied
    weight once: autocast caches one cast per tensor)."""
    weights = {id(m.weight): m.weight for m in model.modules()
               if isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D"}
    return sum(2 * w.numel() for w in weights.values())


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", MODELS)
def test_autocast_record_equals_an_autocast_forward_per_recompute_policy(name, policy):
    if name.startswith("hf:"):
        pytest.importorskip("transformers")
    graph = autocast_graph(name)
    # the fp32 model the runtime trains, under its autocast and recompute code
    live, _, _, checkpointed = forward_under_policy(name, policy, MICRO_BATCH, torch.bfloat16)
    trace, loss = live.trace, live.result
    assert trace.in_order and trace.unreported_free_bytes == 0
    rng = torch.get_rng_state().untyped_storage().nbytes()
    measured = live.after - loss.untyped_storage().nbytes() - checkpointed * rng
    want = predicted(graph, policy, MICRO_BATCH)
    assert abs(measured - want) <= TOLERANCE * want, (
        f"{name} {policy}: predicted {want} B, measured {measured} B ({measured / want - 1:+.2%})")
    loss.backward()


@pytest.mark.parametrize("name", MODELS)
def test_one_bf16_cast_of_each_weight_is_saved_whatever_the_batch(name):
    if name.startswith("hf:"):
        pytest.importorskip("transformers")
    model = build_model(resolve_model(name), seed=0)
    one, two = autocast_graph(name, 1), autocast_graph(name, 2)
    casts = sum(d["weight_saved_bytes"] for _, d in one.g.nodes(data=True))
    assert casts == linear_weight_bytes_bf16(model) > 0
    assert sum(d["weight_saved_bytes"] for _, d in two.g.nodes(data=True)) == casts
    # the model as captured (bf16 parameters: FSDP2's mixed precision) saves no copy of its weights
    as_captured = capture(resolve_model(name), dtype="bf16", autocast="cpu")
    assert sum(d["weight_saved_bytes"] for _, d in as_captured.g.nodes(data=True)) == 0
    # and autocast keeps the residual stream in fp32: more activation bytes than the bf16 model
    saved = lambda g: sum(d["saved_bytes"] for _, d in g.g.nodes(data=True))
    assert saved(one) > saved(as_captured)


def test_cuda_lists_save_a_materialised_softmax_in_fp32():
    """CUDA autocast runs softmax in fp32 where CPU autocast keeps the input's bf16 (costmodel.autocast):
    the saved attention probabilities of a materialised attention are twice the bytes under CUDA's lists."""
    spec = resolve_model("gpt:layers=2,hidden=64,heads=4,vocab=128,seq=32,attention=math")
    by = {p: capture(spec, dtype="bf16", autocast=p).as_run("autocast") for p in ("cpu", "cuda")}
    probs = {p: sum(d["saved_bytes"] for _, d in g.g.nodes(data=True) if d["kind"] == "scaled_masked_softmax")
             for p, g in by.items()}
    heads, seq = 4, 32
    assert probs["cpu"] == 2 * (2 * heads * seq * seq)  # bf16 probabilities, two layers, one sample
    assert probs["cuda"] == 2 * (4 * heads * seq * seq)  # fp32

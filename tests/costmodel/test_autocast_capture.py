"""A bf16 capture records the model as the runtime's torch.autocast runs it (costmodel.capture.trace, costmodel.capture.autocast).

Its saved bytes are checked against a real CPU autocast forward, per recompute policy, by
tests/costmodel/test_saved_bytes_by_recompute.py. Here: the weight casts on their own -- 2 bytes per element
of every weight a matmul reads, none in the as-captured bf16 record, the same whatever the batch -- and
CUDA's fp32 list, emulated for GPU plans.
"""
import pytest
import torch.nn as nn

from partita.costmodel.models import resolve_model
from partita.costmodel.capture import capture
from partita.runtime.loop.recipe import build_model

MODELS = ["tiny-gpt", "tiny-llama", "hf:gpt2"]


def autocast_graph(name: str, batch: int = 1):
    return capture(resolve_model(name), dtype="bf16", batch=batch, autocast="cpu").as_run("autocast")


def linear_weight_bytes_bf16(model: nn.Module) -> int:
    """2 bytes per element of every weight a matmul reads: nn.Linear's, and transformers' Conv1D's (a tied
    weight once: autocast caches one cast per tensor)."""
    weights = {id(m.weight): m.weight for m in model.modules()
               if isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D"}
    return sum(2 * w.numel() for w in weights.values())


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
    """CUDA autocast runs softmax in fp32 where CPU autocast keeps the input's bf16 (costmodel.capture.autocast):
    the saved attention probabilities of a materialised attention are twice the bytes under CUDA's lists."""
    spec = resolve_model("gpt:layers=2,hidden=64,heads=4,vocab=128,seq=32,attention=math")
    by = {p: capture(spec, dtype="bf16", autocast=p).as_run("autocast") for p in ("cpu", "cuda")}
    probs = {p: sum(d["saved_bytes"] for _, d in g.g.nodes(data=True) if d["kind"] == "scaled_masked_softmax")
             for p, g in by.items()}
    heads, seq = 4, 32
    assert probs["cpu"] == 2 * (2 * heads * seq * seq)  # bf16 probabilities, two layers, one sample
    assert probs["cuda"] == 2 * (4 * heads * seq * seq)  # fp32

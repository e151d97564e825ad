"""costmodel.price.fusion.fused_kernel_saves: on a stack that runs its norms and gated activations as fused kernels
(Megatron-Core / Transformer Engine; apex's norms alone on others: Stack.fused_saves), a Llama layer saves what
those kernels save -- an RMSNorm's input and output, not eager's x * rsqrt(...); SwiGLU's [gate, up] and its
product, not silu(gate) -- while a softmax and a dropout keep what eager keeps, and the stack partita runs (eager
PyTorch) is priced as captured."""
from __future__ import annotations

import numpy as np
import pytest

from partita.costmodel.capture import capture
from partita.costmodel.hardware import parse_cluster
from partita.costmodel.models import resolve_model
from partita.costmodel.price.fusion import fused_kernel_saves, with_kernels
from partita.planner.enumerate.candidates import split_model
from partita.planner.enumerate.space import SearchSpace, TrainConfig
from partita.planner.estimate.terms import stage_terms
from partita.planner.search import search

SEQ, HIDDEN, FFN, LAYERS = 256, 256, 512, 2
LLAMA = f"llama:layers={LAYERS},hidden={HIDDEN},heads=8,kv_heads=4,seq={SEQ},vocab=512,ffn={FFN}"
GPT_MATH = "gpt:layers=2,hidden=256,heads=8,seq=256,vocab=512,attention=math,dropout=0.1"
BF16 = 2


@pytest.fixture(scope="module")
def llama():
    return capture(resolve_model(LLAMA), dtype="bf16")


def _layer_saved(graph) -> int:
    layer = split_model(graph)[1][0]
    return sum(graph.g.nodes[n]["saved_bytes"] for n in graph.nodes_of(layer))


def test_a_fused_llama_layer_drops_the_norms_intermediate_and_silu_gate(llama):
    fused = fused_kernel_saves(llama)
    # per sample: two RMSNorms' x * rsqrt(mean(x^2) + eps), s x h each, and silu(gate), s x ffn, in bf16
    dropped = 2 * SEQ * HIDDEN * BF16 + SEQ * FFN * BF16
    assert _layer_saved(llama) - _layer_saved(fused) == dropped


def test_a_stack_fusing_only_its_norms_keeps_silu_gate(llama):
    # InternLM's flash1-2022 stack: apex's fused RMSNorm, its SwiGLU eager (F.silu(w1(x)) * w2(x))
    norms = with_kernels(llama, "eager", "flash1-2022")
    assert _layer_saved(llama) - _layer_saved(norms) == 2 * SEQ * HIDDEN * BF16


def test_softmax_dropout_and_gelu_keep_their_saves():
    graph = capture(resolve_model(GPT_MATH), dtype="bf16")
    fused = fused_kernel_saves(graph)
    assert {n: d["saved_bytes"] for n, d in fused.g.nodes(data=True)} == \
        {n: d["saved_bytes"] for n, d in graph.g.nodes(data=True)}


def test_with_kernels_follows_the_stack(llama):
    assert with_kernels(llama, "eager", "pytorch") is llama
    assert with_kernels(llama, "eager", "flash-2023") is llama  # eager elementwise kernels: as captured
    fused = with_kernels(llama, "eager", "te-2024")
    assert fused.g.graph["kernels"] == "fused-saves:norm,gate" and _layer_saved(fused) < _layer_saved(llama)
    assert with_kernels(fused, "eager", "te-2024") is fused
    assert with_kernels(llama, "compiled", "te-2024").g.graph["kernels"] == "compiled"


def _activations(graph, stack: str) -> float:
    space = SearchSpace(tp=(1,), pp=(1,), dp=(1,), zero=(0,), micro_batch=(1,), recompute=("none",), offload=False,
                        stack=stack)
    result = search(graph, parse_cluster("1xH100-80GB"), TrainConfig(global_batch=1, seq_len=SEQ, dtype="bf16", autocast=False), space=space)
    return stage_terms(result)["activations"]


def test_a_megatron_core_plan_holds_the_fused_layers_activations(llama):
    dropped = LAYERS * (2 * SEQ * HIDDEN * BF16 + SEQ * FFN * BF16)
    assert np.isclose(_activations(llama, "flash-2023") - _activations(llama, "te-2024"), dropped)

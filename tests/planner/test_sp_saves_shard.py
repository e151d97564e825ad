"""Sequence parallelism on a Megatron-LM / Transformer Engine stack saves the shard of a column-parallel layer's
input and gathers it again in the backward (Korthikanti et al. 2022, section 4.2.2): a layer's saved bytes per rank
are the unsharded layer's / t, where PyTorch's ColwiseParallel (the stack partita runs) keeps each gathered input
whole."""
from __future__ import annotations

import dataclasses

from partita.costmodel.capture import capture
from partita.costmodel.hardware import gpu_device, parse_cluster
from partita.costmodel.models import resolve_model
from partita.planner.enumerate.candidates import split_model
from partita.planner.enumerate.strategies import sequence_option

GPT = "gpt:layers=2,hidden=256,heads=8,seq=256,vocab=512"
TP = 4


def _saved(stack: str) -> tuple[int, int]:
    graph = capture(resolve_model(GPT), dtype="bf16")
    layer = split_model(graph)[1][0]
    cluster = parse_cluster(f"1x{TP}xH100-80GB")
    cluster = dataclasses.replace(cluster, device=gpu_device("H100-80GB", stack))
    whole = sum(graph.g.nodes[n]["saved_bytes"] for n in graph.nodes_of(layer))
    return sequence_option(graph, layer, cluster, TP).saved_bytes, whole


def test_megatron_keeps_the_shard():
    saved, whole = _saved("te-2024")
    assert abs(saved - whole / TP) <= 16  # integer division per node


def test_pytorch_keeps_the_gathered_inputs_whole():
    saved, whole = _saved("pytorch")
    assert saved > whole / TP

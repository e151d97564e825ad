"""Sequence parallelism on batch-first activations (PyTorch's DTensor layers: torchtitan, partita's runtime) shards
dim 1, and NCCL gathers and scatters dim 0: with more than one sample per micro-batch, every all-gather's output and
every reduce-scatter's input is re-laid by a copy of the whole tensor (torch.distributed._functional_collectives).
Megatron's [seq, batch, hidden] layout gathers in place. costmodel.hardware.stacks.Stack.sp_batch_first."""
from __future__ import annotations

import dataclasses

import pytest

from partita.costmodel.capture import capture
from partita.costmodel.hardware import gpu_device, parse_cluster
from partita.costmodel.hardware.stacks import STACKS
from partita.costmodel.models import resolve_model
from partita.costmodel.price.memory import state_bytes
from partita.planner.enumerate.candidates import split_model
from partita.planner.enumerate.options import Variant, cost_variant
from partita.planner.enumerate.strategies import sequence_option, tensor_option

SEQ, HIDDEN, TP = 256, 256, 4
GPT = f"gpt:layers=2,hidden={HIDDEN},heads=8,seq={SEQ},vocab=512"


@pytest.fixture(scope="module")
def layer_graph():
    graph = capture(resolve_model(GPT), dtype="bf16")
    return graph, split_model(graph)[1][0]


def _cluster(stack: str):
    cluster = parse_cluster(f"1x{TP}xH100-80GB")
    return dataclasses.replace(cluster, device=gpu_device("H100-80GB", stack))


def test_each_sequence_parallel_collective_copies_its_whole_tensor_once(layer_graph):
    graph, layer = layer_graph
    c = _cluster("pytorch")
    o = sequence_option(graph, layer, c, TP)
    # a GPT layer: two gathers (the inputs of q/k/v and of fc1) and two reduce-scatters (the outputs of the
    # attention's and the MLP's row-parallel projections), each [b, s, h] in bf16, forward and backward alike
    whole = SEQ * HIDDEN * 2
    rate = c.device.mem_bandwidth * c.device.mem_efficiency
    fwd, bwd = o.layout_copy_s(c, 3, 3)
    assert fwd == pytest.approx(2 * 3 * 4 * whole / rate)  # read and written, 3 samples
    assert bwd == pytest.approx(fwd)
    assert o.layout_copy_s(c, 1, 1) == (0.0, 0.0)       # one sample: the gathered tensor is a view
    assert o.layout_copy_s(c, 1, 2)[0] > 0              # two samples, split over cp = 2: still copied
    te = _cluster("te-2024")
    assert sequence_option(graph, layer, te, TP).layout_copy_s(te, 3, 3) == (0.0, 0.0)  # [s, b, h]: in place
    # without sequence parallelism the collectives are all-reduces of whole tensors: nothing to re-lay
    assert tensor_option(graph, layer, c, TP).layout_copy_s(c, 3, 3) == (0.0, 0.0)


def test_the_copies_are_compute_and_a_full_recompute_repeats_the_forward_ones(layer_graph, monkeypatch):
    graph, layer = layer_graph
    monkeypatch.setitem(STACKS, "pytorch-in-place", dataclasses.replace(
        STACKS["pytorch"], name="pytorch-in-place", sp_batch_first=False, constants="pytorch"))
    first, in_place = _cluster("pytorch"), _cluster("pytorch-in-place")
    sb = state_bytes("bf16", "adam")
    fwd, bwd = sequence_option(graph, layer, first, TP).layout_copy_s(first, 2, 2)
    for recompute, extra in (("none", fwd + bwd), ("full", 2 * fwd + bwd)):
        a, b = (cost_variant(Variant(sequence_option(graph, layer, c, TP), recompute=recompute), c, sb,
                             zero=0, dp=1, tp=TP, b=2) for c in (first, in_place))
        assert a.compute - b.compute == pytest.approx(extra)
        assert a.time > b.time
        assert a.tp_comm == pytest.approx(b.tp_comm)    # on the compute stream, not the collectives'

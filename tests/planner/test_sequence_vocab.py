"""Sequence parallelism and vocabulary parallelism as planner strategies: what each splits, what it
communicates, and how the search uses them."""
import numpy as np
import pytest

from partita.costmodel.price import comm
from partita.costmodel.hardware import parse_cluster
from partita.planner.search import SearchSpace, TrainConfig, search
from partita.planner.enumerate.candidates import _Bases, _edge_reshards, build_candidate, split_model
from partita.planner.enumerate.strategies import replicate_option, sequence_option, tensor_option

CLUSTER = parse_cluster("8xA100-80GB")


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-llama"])
def test_token_embedding_is_split_over_the_vocabulary(name, graph_of):
    g = graph_of(name)
    rep = replicate_option(g, "tok_emb", CLUSTER, 2)
    vocab = tensor_option(g, "tok_emb", CLUSTER, 2)
    assert vocab.placements["tok_emb"] == "vocab"
    emb = next(n for n in g.nodes_of("tok_emb") if g.g.nodes[n]["kind"] == "embedding")
    table = sum(g.g.nodes[emb]["params"].values())
    assert rep.param_numel - vocab.param_numel == table // 2
    assert vocab.tp_comm_bytes_fwd == [g.g.nodes[emb]["out_bytes"]]  # partial lookups summed
    assert vocab.tp_comm_bytes_bwd == []
    seq = sequence_option(g, "tok_emb", CLUSTER, 2)
    assert seq.tp_scatter_fwd == [g.g.nodes[emb]["out_bytes"]] and not seq.tp_comm_bytes_fwd


def test_position_embedding_is_not_split(graph_of):
    """An Embedding indexed by arange (positions) is not a vocabulary: nothing to gain from a split."""
    assert tensor_option(graph_of("tiny-gpt"), "pos_emb", CLUSTER, 2) is None


def test_head_and_loss_are_split_over_the_vocabulary(graph_of):
    g = graph_of("tiny-gpt")
    rep = replicate_option(g, "head", CLUSTER, 2)
    vocab = tensor_option(g, "head", CLUSTER, 2)
    assert vocab.placements == {"head": "vocab"}
    ce = next(n for n in g.nodes_of("head") if g.g.nodes[n]["kind"] == "cross_entropy")
    tokens = g.g.nodes[next(iter(g.g.predecessors(ce)))]["shape"][0]
    assert vocab.tp_comm_bytes_fwd == [4 * tokens] * 3  # row max, sum of exps, target logit
    softmax = g.g.nodes[ce]["saved_bytes"]  # what the loss keeps of the logits: sharded; the targets: not
    assert vocab.saved_bytes == softmax // 2 + (rep.saved_bytes - softmax)
    # half the work per sample, but a GEMM with half the vocabulary columns runs further from peak
    # (costmodel.price.kernels): its per-micro-batch term, the tiles it leaves empty, does not halve
    assert vocab.fwd_s == pytest.approx(rep.fwd_s / 2, rel=0.05)
    b = 4
    whole = lambda o: b * (o.fwd_s + o.bwd_s) + o.fixed_s  # noqa: E731
    assert whole(rep) / 2 < whole(vocab) < whole(rep)
    assert vocab.param_numel == rep.param_numel // 2


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-llama"])
def test_sequence_parallel_swaps_all_reduces_for_gathers_and_scatters(name, graph_of):
    g = graph_of(name)
    tp = tensor_option(g, "blocks.0", CLUSTER, 2)
    sp = sequence_option(g, "blocks.0", CLUSTER, 2)
    assert sp.layout == "S" and tp.layout == "R"
    assert sorted(sp.tp_scatter_fwd) == sorted(tp.tp_comm_bytes_fwd)  # row-parallel outputs
    assert sorted(sp.tp_gather_fwd) == sorted(tp.tp_comm_bytes_bwd)   # column-parallel inputs
    assert sorted(sp.tp_gather_bwd) == sorted(sp.tp_scatter_fwd)
    assert sorted(sp.tp_scatter_bwd) == sorted(sp.tp_gather_fwd)
    assert {f for f, s in sp.placements.items() if s == "sequence"} == {"blocks.0.ln1", "blocks.0.ln2"}
    assert sp.saved_bytes < tp.saved_bytes
    # a ring all-gather plus reduce-scatter moves an all-reduce's bytes, paying the latency twice
    group = comm.group_for(CLUSTER, 2, 1)
    for x in sp.tp_scatter_fwd:
        pair = comm.all_gather(CLUSTER, group, 4 * x) + comm.reduce_scatter(CLUSTER, group, 4 * x)
        assert pair >= comm.all_reduce(CLUSTER, group, 4 * x)


def test_sequence_parallel_sends_a_shard_between_pipeline_stages(graph_of):
    g = graph_of("small-gpt", "bf16")
    cluster = parse_cluster("2x8xA100-80GB")
    prefix, layers, suffix = split_model(g)
    bases = _Bases(g, cluster, prefix, layers, suffix)
    train, space = TrainConfig(global_batch=16), SearchSpace()
    plain = build_candidate(bases, train, space, 2, 2, 4, 0, 1, "1F1B", 1, sp=False)
    sp = build_candidate(bases, train, space, 2, 2, 4, 0, 1, "1F1B", 1, sp=True)
    across = 2 * 4 >= cluster.devices_per_node
    # a bf16 ZeRO-0 plan runs under autocast, whose residual stream stays fp32 (costmodel.capture.trace)
    whole = g.as_run("autocast").boundary_bytes(layers[0])
    assert whole == 2 * g.boundary_bytes(layers[0])
    assert plain.parts["e_p2p"][0] == pytest.approx(2 * comm.p2p(cluster, whole, across))
    assert sp.parts["e_p2p"][0] == pytest.approx(2 * comm.p2p(cluster, whole / 4, across))
    assert sp.sequence_parallel and not plain.sequence_parallel


def test_a_replicated_neighbour_of_sequence_sharded_layers_pays_a_gather(graph_of):
    """GPT's position embedding stays replicated (R) beside sequence-sharded layers (S): one all-gather
    of its output crosses that edge; Llama (no position embedding) has no such edge."""
    for name, expect_edge in (("tiny-gpt", True), ("tiny-llama", False)):
        g = graph_of(name)
        prefix, layers, suffix = split_model(g)
        bases = _Bases(g, CLUSTER, prefix, layers, suffix)
        _, pre, suf, _ = bases.get(2, sp=True)
        edges = _edge_reshards(bases, pre, suf, 4, 1)
        if expect_edge:
            i = prefix.index("pos_emb")
            assert pre[i].layout == "R"
            group = comm.group_for(CLUSTER, 2, 1)
            pos = next(n for n in g.nodes_of("pos_emb") if g.g.nodes[n]["kind"] == "embedding")
            assert edges[0] == pytest.approx(comm.all_gather(CLUSTER, group, g.g.nodes[pos]["out_bytes"] * 4))
        else:
            assert np.all(edges == 0)


def test_search_picks_sequence_parallelism_when_memory_binds(graph_of):
    """gpt3-sized layers on one node: sequence parallelism divides the norms' and dropouts' activations
    by t, which plain tensor parallelism keeps whole; the planner must use it when activations bind."""
    g = graph_of("megatron-18b", "bf16")
    cluster = parse_cluster("1x8xA100-80GB")
    res = search(g, cluster, TrainConfig(global_batch=8), space=SearchSpace(tp=(8,), zero=(0,), offload=False,
                                                                           recompute=("none",)))
    assert res.best is not None and res.best.sequence_parallel
    only_tp = search(g, cluster, TrainConfig(global_batch=8),
                     space=SearchSpace(tp=(8,), zero=(0,), offload=False, recompute=("none",),
                                       sequence_parallel=(False,)), raise_infeasible=False)
    assert only_tp.best is None or only_tp.best.step_time >= res.best.step_time

"""Memory formulas reproduced exactly: ZeRO's model states and Korthikanti's activations per layer."""
import pytest

from partita.costmodel.hardware import parse_cluster
from partita.costmodel.price.memory import state_bytes
from partita.costmodel.models import PRESETS
from partita.planner.enumerate.options import zero_state_bytes
from partita.planner.enumerate.strategies import replicate_option, tensor_option


@pytest.mark.parametrize("stage,expected_gb", [(0, 120), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_worked_example(stage, expected_gb):
    """REFERENCE.md: Psi = 7.5e9, N_d = 64, mixed-precision Adam (K = 12): 120 / 31.4 / 16.6 / 1.9 GB."""
    sb = state_bytes("bf16", "adam")
    assert (sb.param, sb.grad, sb.optimizer) == (2, 2, 12)
    got = zero_state_bytes(7.5e9, sb, stage, 64) / 1e9
    assert got == pytest.approx(expected_gb, abs=0.05)
    exact = {0: 16 * 7.5e9, 1: 4 * 7.5e9 + 12 * 7.5e9 / 64, 2: 2 * 7.5e9 + 14 * 7.5e9 / 64, 3: 16 * 7.5e9 / 64}
    assert zero_state_bytes(7.5e9, sb, stage, 64) == exact[stage]


def _layer(graph_of, name):
    c = PRESETS[name]
    return graph_of(name, "bf16"), c.seq, c.hidden, c.heads


@pytest.mark.parametrize("name", ["megatron-1.7b", "megatron-18b"])
def test_korthikanti_rows_no_parallelism_tp_and_full_recompute(name, graph_of):
    """Korthikanti et al. 2022, Table 2 (16-bit activations, 1-byte dropout masks), per layer, b = 1:
    no parallelism  s b h (34 + 5 a s / h);   tensor parallel  s b h (10 + 24/t + 5 a s / (h t));
    full recompute  2 s b h. Ours differ only by the LayerNorms' saved mean and rstd, which the table
    leaves out (2 norms x 2 statistics x s elements, in the activation dtype on this CPU build)."""
    graph, s, h, a = _layer(graph_of, name)
    cluster = parse_cluster("8xA100-80GB")
    layer = "blocks.3"
    stats = 2 * 2 * 2 * s
    none = replicate_option(graph, layer, cluster, 1)
    assert none.saved_by_policy["none"] == pytest.approx(s * h * (34 + 5 * a * s / h) + stats, rel=1e-9)
    assert none.saved_by_policy["full"] == 2 * s * h
    for t in (2, 4, 8):
        tp = tensor_option(graph, layer, cluster, t)
        expected = s * h * (10 + 24 / t + 5 * a * s / (h * t)) + stats
        assert tp.saved_by_policy["none"] == pytest.approx(expected, rel=1e-9), t
        assert tp.saved_by_policy["full"] == 2 * s * h


def test_selective_recompute_drops_the_attention_core(graph_of):
    """Selective keeps parametric outputs; with materialised attention the a s^2 terms all go."""
    graph, s, h, a = _layer(graph_of, "megatron-1.7b")
    opt = replicate_option(graph, "blocks.3", parse_cluster("8xA100-80GB"), 1)
    assert opt.saved_by_policy["selective"] < s * h * 34
    assert opt.refwd_by_policy["none"] == 0 < opt.refwd_by_policy["selective"] < opt.refwd_by_policy["full"]


def test_per_op_recompute_keeps_every_other_product(graph_of):
    """"op" (torchtitan's per-op policy) on a GPT layer (q k v proj fc1 fc2, materialised attention): it
    keeps the outputs of q, v and fc1 (s h, s h, 4 s h elements, 2 bytes each) and the layer input (2 s h),
    and re-runs the rest: 2 s h + 12 s h / t, between selective and full in bytes and in re-run time."""
    graph, s, h, a = _layer(graph_of, "megatron-1.7b")
    cluster = parse_cluster("8xA100-80GB")
    opt = replicate_option(graph, "blocks.3", cluster, 1)
    assert opt.saved_by_policy["op"] == 14 * s * h
    assert opt.saved_by_policy["full"] < opt.saved_by_policy["op"] < opt.saved_by_policy["selective"]
    assert opt.refwd_by_policy["selective"] < opt.refwd_by_policy["op"] < opt.refwd_by_policy["full"]
    for t in (2, 4, 8):
        assert tensor_option(graph, "blocks.3", cluster, t).saved_by_policy["op"] == 2 * s * h + 12 * s * h // t


@pytest.mark.parametrize("name", ["megatron-1.7b", "megatron-18b"])
def test_korthikanti_sequence_parallel_rows(name, graph_of):
    """Korthikanti et al. 2022, Table 2: TP + sequence parallel  (s b h / t)(34 + 5 a s / h), and full
    recompute keeps the layer input, sequence-sharded: 2 s b h / t. Ours add what PyTorch's
    ColwiseParallel keeps that Megatron-LM does not: the all-gathered (whole) outputs of the two
    LayerNorms that feed column-parallel layers, 2 x 2 s b h (1 - 1/t), where Megatron keeps the shard
    and gathers again in the backward; plus the LayerNorm statistics, sharded like everything else."""
    from partita.planner.enumerate.strategies import sequence_option
    graph, s, h, a = _layer(graph_of, name)
    cluster = parse_cluster("8xA100-80GB")
    for t in (2, 4, 8):
        sp = sequence_option(graph, "blocks.3", cluster, t)
        paper = s * h / t * (34 + 5 * a * s / h)
        gathered = 2 * 2 * s * h * (1 - 1 / t)
        stats = 2 * 2 * 2 * s / t
        assert sp.saved_by_policy["none"] == pytest.approx(paper + gathered + stats, rel=1e-9), t
        assert sp.saved_by_policy["full"] == 2 * s * h // t
        tp = tensor_option(graph, "blocks.3", cluster, t)
        assert sp.param_numel == tp.param_numel and sp.fwd_s < tp.fwd_s  # norms and dropout split too

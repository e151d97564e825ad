"""ZeRO inside a pipeline is priced as torch.distributed.pipelining runs an FSDP2 stage (planner.enumerate.options):
gradients accumulate whole in fp32 and are reduce-scattered once per step, parameters stay gathered."""
import pytest

import partita.planner as planner
from partita.costmodel.hardware import parse_cluster
from partita.costmodel.price.memory import state_bytes
from partita.planner.enumerate.options import Variant, cost_variant
from partita.planner.enumerate.strategies import replicate_option

MODEL = "gpt:layers=4,hidden=256,heads=8,seq=128,vocab=1000"


@pytest.fixture
def layer(graph_of):
    g = graph_of(MODEL, "bf16")
    return replicate_option(g, "blocks.0", parse_cluster("2x8xA100-80GB"), 1)


@pytest.mark.parametrize("zero", [2, 3])
def test_a_pipelined_stage_syncs_its_gradients_once_per_step(layer, zero):
    cluster, sb = parse_cluster("2x8xA100-80GB"), state_bytes("bf16", "adam")
    flat = cost_variant(Variant(layer), cluster, sb, zero, dp=8, tp=1, b=2)
    piped = cost_variant(Variant(layer), cluster, sb, zero, dp=8, tp=1, b=2, pipelined=True)
    n = layer.param_numel
    # per micro-batch: no reduce-scatter, no forward gather; ZeRO-3 still gathers before each backward
    lanes = piped.timing.lanes
    assert lanes.scatter_bwd == 0 and lanes.gather_fwd == 0
    assert lanes.gather_bwd == pytest.approx(flat.timing.lanes.gather_bwd) and (lanes.gather_bwd > 0) == (zero == 3)
    assert flat.timing.lanes.scatter_bwd > 0
    # once per step: the reduce-scatter, exposed, and the first forward's gather
    assert piped.zero_scatter == pytest.approx(flat.timing.lanes.scatter_bwd)
    assert piped.flush == pytest.approx(flat.flush + piped.zero_flush_exposed + piped.zero_flush_contention)
    assert piped.zero_first.hidden + piped.zero_first.exposed == pytest.approx(flat.timing.lanes.gather_fwd or
                                                                               lanes.gather_bwd)
    # memory: parameters gathered and fp32 gradient accumulators, whole; the optimizer state sharded
    assert piped.grad == pytest.approx(4 * n)
    assert piped.state == pytest.approx(sb.param * n + 4 * n + sb.optimizer * n / 8)
    assert flat.state < piped.state
    # each micro-batch adds its bf16 gradients into the fp32 accumulators: n (2 + 2 x 4) bytes through HBM
    dev = cluster.device
    assert piped.accumulate == pytest.approx(n * 10 / (dev.mem_bandwidth * dev.mem_efficiency)
                                             + layer.param_tensors * dev.op_latency)
    assert piped.compute == pytest.approx(flat.compute + piped.accumulate) and flat.accumulate == 0


def test_the_pipeline_reduce_scatter_does_not_grow_with_the_micro_batches():
    """Twice the micro-batches: the per-step ZeRO traffic stays; before, every micro-batch reduce-scattered."""
    def zero_s(batch):
        p = planner.plan(MODEL, cluster="4x2xA100-80GB", train=planner.TrainConfig(global_batch=batch),
                         pp=2, dp=4, tp=1, zero=2, micro_batch=1, recompute="none", offload=False)
        assert p.mesh.pp == 2 and p.zero_stage == 2 and p.schedule.num_microbatches == batch // 4
        assert any("reduce-scattered once per step" in a for a in p.predicted["assumptions"])
        # the once-per-step traffic is in the breakdown, which still adds up to the step
        assert sum(p.predicted["breakdown"].values()) == pytest.approx(p.predicted["step_time_s"], rel=1e-9)
        return p.predicted["breakdown"]["zero_comm_s"]
    few, many = zero_s(16), zero_s(32)
    assert few > 0 and many == pytest.approx(few, rel=1e-6)


def test_interleaving_is_also_tried_as_deep_as_the_layers_allow():
    """Besides v = 2 and 4, the deepest interleaving that gives every chunk a layer (up to 8): the smallest
    bubble, the one a 126-layer model on 16 stages (Llama 3 405B) reaches with v = 7."""
    from partita.planner.enumerate.space import _schedules, deepest_virtual
    assert deepest_virtual(16, 126) == 7 and deepest_virtual(8, 96) == 8 and deepest_virtual(1, 96) == 1
    tried = [v for s, v in _schedules("auto", 16, 32, 126) if s == "Interleaved1F1B"]
    assert tried == [2, 4, 7]
    assert [v for s, v in _schedules("auto", 4, 8, 8) if s == "Interleaved1F1B"] == [2]  # 2 layers per device
    assert [v for _, v in _schedules("auto", 16, 32, 126, (4,))] == [4]  # a fixed --virtual-stages is kept

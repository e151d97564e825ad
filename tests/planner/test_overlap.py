"""Communication overlaps as plan choices (costmodel.price.streams, planner.enumerate.space.overlap_choices): tensor-parallel
collectives pipelined with the GEMMs they feed (Megatron-Core --tp-comm-overlap, torch async TP) and an
interleaved pipeline's sends beside compute (--overlap-p2p-communication). Priced, searched where the stack
runs them and partita's runtime does not run the stack, exported to Megatron-LM, refused by `partita run`."""
import pytest

from partita.costmodel import PartitaError, resolve_model
from partita.costmodel.hardware import parse_cluster
from partita.costmodel.price.streams import LayerStreams, layer_timing, tp_overlap
from partita.planner.api import plan
from partita.export import to_megatron, to_torchtitan
from partita.planner.plan import PlanError
from partita.planner.enumerate.space import SearchSpace, TrainConfig, check_space
from partita.runtime.launcher.checks import preflight

K = 0.15
GPT = "gpt:layers=8,hidden=6144,heads=48,seq=2048,vocab=51200"
TP8 = dict(tp=8, pp=1, sequence_parallel=True, recompute="selective", micro_batch=1, offload=False)
TRAIN = TrainConfig(global_batch=8)


def test_a_chunked_collective_exposes_one_chunk_and_what_the_gemms_do_not_cover():
    """Wang et al. ASPLOS'23: k chunks pipelined with the GEMM; the first (or last) has nothing beside it."""
    covered = tp_overlap(1.0, 10.0, 8, K)
    assert covered.exposed == pytest.approx(1 / 8) and covered.hidden == pytest.approx(7 / 8)
    assert covered.contention == pytest.approx(K * 7 / 8)
    short = tp_overlap(1.0, 0.5, 8, K)  # GEMMs shorter than the collective: the rest is exposed
    assert short.exposed == pytest.approx(1 / 8 + 7 / 8 - 0.5) and short.contention == pytest.approx(K * 0.5)
    lanes = dict(compute_fwd=1.0, compute_bwd=2.0, tp=0.6, tp_fwd=0.2, gemm_fwd=0.8, gemm_bwd=1.6)
    serial, piped = layer_timing(LayerStreams(**lanes), K), layer_timing(LayerStreams(**lanes, tp_chunks=4), K)
    assert serial.total == pytest.approx(3.6) and serial.exposed["tp"] == pytest.approx(0.6)
    assert piped.exposed["tp"] == pytest.approx(0.6 / 4) and piped.tp == piped.exposed["tp"]
    assert piped.total == pytest.approx(3.0 + 0.15 + K * 0.45) and piped.hidden == pytest.approx(0.45)
    # torch's async TP decomposes forward patterns only: the backward's own 0.4 s stay whole on the critical path
    forward_only = layer_timing(LayerStreams(**{**lanes, "gemm_bwd": 0.0}, tp_chunks=4, tp_serial=0.4), K)
    assert forward_only.exposed["tp"] == pytest.approx(0.2 / 4 + 0.4) and forward_only.hidden == pytest.approx(0.15)
    assert forward_only.total == pytest.approx(3.0 + 0.05 + 0.4 + K * 0.15)


@pytest.fixture(scope="module")
def tp8():
    """The same TP=8 sequence-parallel GPT on one H100 node, TP collectives exposed and overlapped."""
    return {on: plan(GPT, cluster="8xH100-80GB", train=TRAIN, space=SearchSpace(**TP8, tp_comm_overlap=on))
            for on in (False, True)}


def test_tp8_sequence_parallel_on_h100_exposes_less_tp_comm_with_overlap(tp8):
    off, on = tp8[False].predicted, tp8[True].predicted
    # partita's stack (pytorch) prices torch's async TP: the forward's collectives in 8 chunks, one exposed;
    # the backward's (as many bytes under selective recompute) stay whole (Stack.tp_overlap_backward)
    tp_off, tp_on = off["breakdown"]["tp_comm_s"], on["breakdown"]["tp_comm_s"]
    assert tp_off / 2 < tp_on < 0.75 * tp_off
    assert on["breakdown"]["contention_s"] > off["breakdown"]["contention_s"]  # the GEMMs slow beside it
    assert on["step_time_s"] < off["step_time_s"] and on["hidden_comm_s"] > off["hidden_comm_s"]
    assert tp8[True].overlap == {"tp_comm": True, "p2p": False} and tp8[False].overlap["tp_comm"] is False
    assert any("in 8 chunks" in a and "backward's own collectives exposed" in a for a in on["assumptions"])
    # Megatron-Core's userbuffers overlap the backward's too: one chunk of 8 exposed in each direction, and
    # whatever of the rest outlasts the GEMMs beside it
    te = {on: plan(GPT, cluster="8xH100-80GB", train=TRAIN, space=SearchSpace(**TP8, tp_comm_overlap=on,
                                                                              stack="te-2024")).predicted
          for on in (False, True)}
    assert te[True]["breakdown"]["tp_comm_s"] < te[False]["breakdown"]["tp_comm_s"] / 3
    assert any("the backward's beside the gradient GEMMs" in a for a in te[True]["assumptions"])
    # priced, not run: a plan note, the runtime's one-line refusal, and Megatron-LM's flag on export
    assert "--tp-comm-overlap" in tp8[True].solver["not_executed"]
    with pytest.raises(PlanError, match="not run by partita's runtime") as e:
        preflight(tp8[True], resolve_model(GPT), 8)
    assert "\n" not in str(e.value)
    assert "--tp-comm-overlap" in to_megatron(tp8[True]).splitlines()
    assert "--tp-comm-overlap" not in to_megatron(tp8[False]).splitlines()
    assert "enable_async_tensor_parallel = true" in to_torchtitan(tp8[True])


def test_the_search_chooses_tp_overlap_where_allowed_and_never_unasked_for_partitas_runtime(tp8):
    searched = plan(GPT, cluster="8xH100-80GB", train=TRAIN, space=SearchSpace(**TP8, tp_comm_overlap=(False, True)))
    assert searched.overlap["tp_comm"] and searched.predicted["step_time_s"] == pytest.approx(
        tp8[True].predicted["step_time_s"])
    # by default the stack decides: Megatron-Core's overlaps, partita's runtime (pytorch) does not
    megatron = plan(GPT, cluster="8xH100-80GB", train=TRAIN, space=SearchSpace(**TP8, stack="te-2024"))
    assert megatron.overlap["tp_comm"]
    default = plan(GPT, cluster="8xH100-80GB", train=TRAIN, space=SearchSpace(**TP8))
    assert not default.overlap["tp_comm"] and "not_executed" not in default.solver


PIPE = dict(tp=8, pp=4, virtual_stages=2, sequence_parallel=True, recompute="selective", micro_batch=1,
            offload=False, stack="te-2024")


def test_interleaved_pipeline_sends_overlap_compute_as_megatron_core_runs_them():
    """pp=4 x tp=8 over 4 H100 nodes (the sends cross nodes), interleaved with 2 chunks."""
    big = "gpt:layers=16,hidden=8192,heads=64,seq=2048,vocab=51200"
    train = TrainConfig(global_batch=16, schedule="Interleaved1F1B")
    runs = {on: plan(big, cluster="4x8xH100-80GB", train=train,
                     space=SearchSpace(**PIPE, tp_comm_overlap=False, p2p_overlap=on)) for on in (False, True)}
    off, on = runs[False].predicted["breakdown"], runs[True].predicted["breakdown"]
    assert off["p2p_s"] > 0 and on["p2p_s"] < off["p2p_s"]
    assert runs[True].predicted["step_time_s"] < runs[False].predicted["step_time_s"]
    assert runs[True].overlap["p2p"] and "--overlap-p2p-communication" in to_megatron(runs[True]).splitlines()
    assert "--overlap-p2p-communication" in runs[True].solver["not_executed"]
    chosen = plan(big, cluster="4x8xH100-80GB", train=train, space=SearchSpace(**PIPE))  # the stack decides
    assert chosen.overlap == {"tp_comm": True, "p2p": True}


@pytest.mark.parametrize("space,schedule,message", [
    (dict(stack="flash-2023", tp_comm_overlap=True), "auto", "the flash-2023 stack does not overlap tensor-parallel"),
    (dict(p2p_overlap=True), "auto", "the pytorch stack does not overlap pipeline sends"),
    (dict(tp_comm_overlap=True, sequence_parallel=False), "auto", "needs --sequence-parallel on"),
    (dict(tp_comm_overlap=True, tp=1), "auto", "needs tp > 1"),
    (dict(stack="te-2024", p2p_overlap=True), "1F1B", "needs pp > 1 and the Interleaved1F1B schedule"),
])
def test_an_overlap_with_nothing_to_overlap_is_one_line(space, schedule, message):
    with pytest.raises(PartitaError, match=message) as e:
        check_space(parse_cluster("8xH100-80GB"), TrainConfig(global_batch=8, schedule=schedule),
                    SearchSpace(**space), max_pp=8, layers=8, seq=2048)
    assert "\n" not in str(e.value)

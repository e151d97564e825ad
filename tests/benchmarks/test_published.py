"""benchmarks.published keeps working: the published data meets the benchmark's requirements and is
self-consistent, and pricing a row yields a plan in exactly the published configuration, in the
published metric. (The benchmark itself: `python -m benchmarks.published`.)"""
from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import published  # noqa: E402
from benchmarks.published_data import (HARDWARE_TFLOPS, METRICS, NONE, ROWS, SKIPPED, TOKENS, Model,  # noqa: E402
                                       Row, Table)
from benchmarks.published_data_first_contact import FIRST_CONTACT_ROWS  # noqa: E402
from partita.costmodel.hardware import gpu_device, DEVICES  # noqa: E402
from partita.planner.enumerate.options import RECOMPUTE  # noqa: E402


def test_data_meets_the_benchmark_requirements():
    sources = {r.table.source for r in ROWS}
    assert len(ROWS) >= 20 and len(sources) >= 4
    assert any(3 in r.zero and len(r.zero) == 1 and r.dp == r.gpus and r.gpus >= 64 for r in ROWS), \
        "an FSDP / ZeRO-3 run on 64 or more GPUs"
    assert any(r.hardware.startswith("H100") for r in ROWS)
    assert not any("fp8" in r.table.precision.lower() for r in ROWS)
    assert SKIPPED and all(s.reason for s in SKIPPED)


def test_every_row_has_its_own_key():
    """A key names one row (the README and results cite rows by it): a table listing two configurations of
    one run (Korthikanti's full recompute and SP + selective) keys them apart by their variant."""
    keys = [published.row_key(r) for r in ROWS]
    assert len(set(keys)) == len(keys), sorted(k for k in keys if keys.count(k) > 1)


def test_compiled_runs_are_priced_compiled_and_keyed_apart_from_their_eager_run():
    keys = [published.row_key(r) for r in ROWS]
    compiled = [r for r in ROWS if r.table.kernels == "compiled"]
    assert all(keys.count(published.row_key(r)) == 1 for r in compiled)
    assert compiled and all(published.published_space(r).kernels == "compiled" for r in compiled)
    assert all(published.published_space(r).kernels == "eager" for r in ROWS if r.table.kernels == "eager")
    assert all(published.row_key(r).endswith("/compiled") for r in compiled)
    # where the source also measured the eager run (fms-fsdp, torchtitan 2024-12), only the suffix tells them apart;
    # other compiled runs (torchtitan's async TP, NeMo AutoModel) were measured compiled only
    assert any(published.row_key(r).removesuffix("/compiled") in keys for r in compiled)


@pytest.mark.parametrize("row", list({published.row_key(r): r for r in ROWS + FIRST_CONTACT_ROWS}.values()),
                         ids=published.row_key)
def test_every_row_is_a_consistent_published_configuration(row):
    assert row.tp * row.pp * row.dp * row.cp == row.gpus
    assert row.dp % row.ep == 0 and (row.cp == 1 or row.seq % (2 * row.cp) == 0)
    assert row.global_batch % row.dp == 0
    local = row.global_batch // row.dp
    if row.micro_batch is not None:
        assert local % row.micro_batch == 0  # fewer micro-batches than stages is legal (the bubble is priced)
    if row.stage_layers is not None:  # a pinned split: one count per stage, every layer placed once
        assert len(row.stage_layers) == row.pp and sum(row.stage_layers) == row.model.layers and min(row.stage_layers) > 0
    assert row.table.metric in METRICS and row.value > 0 and row.table.citation
    assert row.hardware in DEVICES and (row.gpus % 8 == 0 or row.gpus < 8)  # whole 8-GPU nodes, or one node
    # at dp = 1 nothing shards: ZeRO-0, or a distributed optimizer over one rank, priced as ZeRO-0 (zero_for)
    assert row.zero and set(row.zero) <= {0, 1, 2, 3} and (row.dp * row.cp > 1 or published.zero_for(row) == (0,))
    assert row.recompute and set(row.recompute) <= set(RECOMPUTE)
    assert row.schedule in ("1F1B", "Interleaved1F1B", "auto")
    assert row.pp > 1 or row.virtual_stages == 1
    assert row.model.hidden % row.model.heads == 0 and row.seq > 0
    assert row.model.family in ("gpt", "llama") or row.model.string.startswith(f"{row.model.family}:")
    assert not row.sequence_parallel or row.tp > 1


def test_model_string_spells_out_the_published_dimensions():
    m = Model(name="x", family="llama", layers=2, hidden=64, heads=4, kv_heads=2, vocab=256, ffn=172)
    assert published.model_string(m, 32) == "llama:layers=2,hidden=64,heads=4,vocab=256,seq=32,ffn=172,kv_heads=2"
    g = Model(name="y", family="gpt", layers=2, hidden=64, heads=4, vocab=256, attention="math", dropout=0.1)
    spec = published.model_spec(g, 32)
    assert spec.config["attention"] == "math" and spec.config["dropout"] == 0.1 and spec.config["ffn"] == 256
    assert spec.seq_len == 32 and spec.config["layers"] == 2


def test_a_model_string_is_used_as_given_at_the_row_sequence():
    m = Model(name="z", family="hf", layers=2, hidden=64, heads=4, vocab=256,
              string="hf:llama:num_hidden_layers=2,hidden_size=64,num_attention_heads=4,vocab_size=256")
    assert published.model_string(m, 128).endswith(",seq=128") and published.model_spec(m, 128).seq_len == 128


def test_hardware_over_model_is_table1s_conversion():
    from benchmarks.table1 import hardware_over_model
    m = next(r.model for r in ROWS if r.model.name == "megatron-1.7b")
    assert published.hardware_over_model(m, 2048) == pytest.approx(hardware_over_model("megatron-1.7b"))
    assert published.hardware_over_model(m, 2048) == pytest.approx(1 / 0.76, rel=0.02)  # REFERENCE.md


def _cheapest_fsdp_row() -> Row:
    fsdp = [r for r in ROWS if r.zero == (3,) and r.tp == r.pp == 1 and r.micro_batch is not None]
    return min(fsdp, key=lambda r: (r.model.layers * r.model.hidden ** 2, r.seq, r.gpus))


def _assert_priced_as_published(row: Row, out: dict):
    assert out["error"] is not None, out.get("not_priced")
    plan = out["plan"]
    assert (plan["tp"], plan["pp"], plan["dp"]) == (row.tp, row.pp, row.dp)
    assert plan["zero"] in row.zero
    if row.micro_batch is not None:
        assert plan["micro_batch"] == row.micro_batch
    if row.virtual_stages is not None:
        assert plan["virtual_stages"] == row.virtual_stages
    if row.sequence_parallel is not None:
        assert plan["sequence_parallel"] == row.sequence_parallel
    assert set(plan["recompute_layers"]) <= set(row.recompute)
    assert out["predicted"]["metric"] == out["measured"]["metric"] == row.table.metric
    assert math.isfinite(out["error"]) and out["error"] == pytest.approx(
        out["predicted"]["value"] / row.value - 1)


def test_pricing_a_published_fsdp_row_keeps_its_configuration_and_metric():
    row = _cheapest_fsdp_row()
    out = published.price(row)
    _assert_priced_as_published(row, out)
    assert row.table.metric == TOKENS
    bd = out["breakdown"]
    assert out["predicted"]["value"] == pytest.approx(row.global_batch * row.seq / bd["step_time_s"] / row.gpus)


def test_pricing_a_pipelined_tensor_parallel_row_on_a_tiny_model():
    tiny = Model(name="tiny", family="gpt", layers=4, hidden=64, heads=4, vocab=256, attention="math", dropout=0.1)
    table = Table(source="test", citation="synthetic", metric=HARDWARE_TFLOPS, stack="megatron-2021")
    row = Row(table=table, model=tiny, seq=32, hardware="A100-80GB", gpus=16, tp=2, pp=2, dp=4, zero=(1,),
              micro_batch=2, global_batch=64, recompute=("full",), schedule="Interleaved1F1B", virtual_stages=2,
              sequence_parallel=True, value=100.0)
    out = published.price(row)
    _assert_priced_as_published(row, out)
    assert out["plan"]["schedule"] == "Interleaved1F1B"
    assert out["plan"]["recompute_layers"] == {"full": 4}


def test_a_1f1b_run_with_fewer_micro_batches_than_stages_is_priced_with_its_pinned_split_and_bubble():
    """Megatron's 1F1B ran m < pp (Zero Bubble PP's Table 12); torch's Schedule1F1B refuses it, so such a row is
    priced as GPipe, the same critical path: at equal stages a step of (m + pp - 1) forward-backward slots."""
    tiny = Model(name="tiny", family="gpt", layers=6, hidden=64, heads=4, vocab=256, attention="math", dropout=0.1)
    table = Table(source="test", citation="synthetic", metric=TOKENS, stack="megatron-2021")

    def row(m: int, split=(1, 2, 2, 1)) -> Row:
        return Row(table=table, model=tiny, seq=32, hardware="A100-80GB", gpus=4, pp=4, dp=1, zero=(0,),
                   micro_batch=2, global_batch=2 * m, recompute=NONE, stage_layers=split, value=100.0)

    few, many = row(2), row(8)
    assert published.schedule_for(few) == "GPipe" and published.schedule_for(many) == "1F1B"
    out = {m: published.price(r) for m, r in ((2, few), (8, many))}
    assert out[2]["plan"]["schedule"] == "GPipe" and out[8]["plan"]["schedule"] == "1F1B"
    step = {m: o["breakdown"]["step_time_s"] for m, o in out.items()}
    # 2 micro-batches fill 2 of 5 slots, 8 fill 8 of 11: the step grows by 11/5, not by 8/2
    assert 1.6 < step[8] / step[2] < 2.9, step
    # the split is the published one, not the search's: 3 layers on the first stage make it the slowest
    lopsided = published.price(row(8, split=(3, 1, 1, 1)))["breakdown"]["step_time_s"]
    assert lopsided > 1.2 * step[8], (lopsided, step)


def test_a_distributed_optimizer_over_one_data_parallel_rank_is_priced_as_zero_0():
    """FlagPerf's Megatron runs at dp = 1 pass --use-distributed-optimizer: one shard, the whole buffer. The planner
    refuses ZeRO-1 at dp = 1, so such a row is priced as ZeRO-0 -- and priced at all; at dp > 1 it stays ZeRO-1."""
    tiny = Model(name="tiny", family="gpt", layers=4, hidden=64, heads=4, vocab=256)
    table = Table(source="test", citation="synthetic", metric=TOKENS, stack="megatron-2021")

    def row(pp: int, dp: int) -> Row:
        return Row(table=table, model=tiny, seq=32, hardware="A100-80GB", gpus=pp * dp, pp=pp, dp=dp, zero=(1,),
                   micro_batch=1, global_batch=8, recompute=NONE, value=100.0)

    alone, shared = row(2, 1), row(1, 2)
    assert published.zero_for(alone) == (0,) and published.zero_for(shared) == (1,)
    assert published.price(alone)["plan"]["zero"] == 0 and published.price(shared)["plan"]["zero"] == 1


def test_a_megatron_pipeline_without_a_stated_split_is_priced_on_megatrons_even_split():
    """Megatron-LM puts num_layers / pp layers on every stage (one chunk each); the search alone would move layers off
    the stage that holds the head (FlagPerf's pp 8 row: 5/5/5/4/4/3/3/3, 35% more memory on stage 0 than ran)."""
    row = next(r for r in ROWS if r.table.source == "flagperf" and r.pp == 8)
    assert published.stage_layers_for(row) == (4,) * 8
    assert published.published_space(row).stage_layers == (4,) * 8
    assert published.stage_layers_for(dataclasses.replace(row, virtual_stages=None)) is None  # interleaving searched
    other = next(r for r in ROWS if r.pp > 1 and not r.table.framework.startswith("Megatron-LM") and r.stage_layers is None)
    assert published.stage_layers_for(other) is None


def test_device_overrides_change_only_the_published_fields():
    row = next(r for r in ROWS if r.device_overrides)
    cluster = published.cluster_for(row)
    preset = gpu_device(row.hardware, row.table.stack)  # the GPU with its stack's kernel constants
    for field, value in row.device_overrides:
        assert getattr(cluster.device, field) == value
    # (and no allocator headroom: the published runs are checked against what fit, published.cluster_for; the
    # preset would leave the allocator's predicted cache)
    assert cluster.device.allocator_headroom == 0 and preset.charges_allocator_cache
    same = {f.name for f in dataclasses.fields(preset)} - {f for f, _ in row.device_overrides} - {"allocator_headroom"}
    assert all(getattr(cluster.device, f) == getattr(preset, f) for f in same)
    assert cluster.num_devices == row.gpus


def test_summary_statistics_and_counts():
    rows = [{"source": "a", "stack": "pytorch", "error": 0.1, "speed_error": 0.1, "key": "a1", "model_string": "m1",
             "measured": {}, "predicted": {}, "plan": {}, "breakdown": {}},
            {"source": "a", "stack": "pytorch", "error": -0.3, "speed_error": 0.4, "key": "a2", "model_string": "m1",
             "measured": {}, "predicted": {}, "plan": {}, "breakdown": {}},
            {"source": "b", "stack": "te-2024", "error": None, "speed_error": None, "key": "b1", "model_string": "m2",
             "not_priced": "does not fit"}]
    s = published.summarize(rows, wall_s=1.0)
    assert s["rows"] == 3 and s["priced"] == 2 and s["count_per_source"] == {"a": 2, "b": 1}
    assert s["median_abs_error"] == pytest.approx(0.2) and s["max_abs_error"] == pytest.approx(0.3)
    assert s["worst"][0]["key"] == "a2" and s["not_priced"] == [{"key": "b1", "reason": "does not fit"}]
    assert s["targets"]["met"] is False and s["captures"] == 2  # no held-out errors for these rows
    assert s["per_source"]["a"]["stacks"] == ["pytorch"] and s["p95_abs_error"] == pytest.approx(0.3)


def test_partitas_own_gpu_runs_are_priced_under_the_autocast_they_ran_with():
    """The H200 runs trained under CUDA autocast over fp32 masters (Table.autocast). Captured without the
    autocast records they were priced as a pure bf16 model: 113 GiB against the 129.78 GiB the GPU
    allocated, and a step 7% faster than the planner predicts for the same plan."""
    row = next(r for r in ROWS if r.table.source == "gpu-h200-2026" and r.variant == "no-recompute")
    assert row.table.autocast
    out = published.price(row)
    assert out["measured_memory"]["error"] == pytest.approx(0.0, abs=0.02)


def test_a_reserved_reading_is_set_against_the_allocated_peak_plus_the_predicted_cache():
    """torchtitan logs torch.cuda's peak reserved bytes (the allocator's cache included): set against partita's
    peak of allocated bytes alone it read 16.5% low; the allocator's predicted cache belongs beside it."""
    row = next(r for r in ROWS if r.table.source == "torchtitan" and r.memory_gib and r.gpus == 8
               and r.table.kernels == "eager")
    assert row.memory_kind == "reserved"
    out = published.price(row)
    mem, allocated = out["measured_memory"], out["breakdown"]["peak_memory_gib"]
    assert mem["kind"] == "reserved" and mem["predicted_peak_gib"] > allocated + 1.0
    assert mem["error"] == pytest.approx(mem["predicted_peak_gib"] / row.memory_gib - 1)
    own = next(r for r in ROWS if r.table.source == "gpu-h200-2026" and r.memory_gib)  # read as allocated
    assert own.memory_kind == "allocated"


def test_llm_foundry_rows_run_the_attention_their_scripts_passed():
    """sweep.py made the large-scale H100 table (>= 128 GPUs) with --attn_impl flash for 1b, 3b, 7b and 70b and
    triton for 13b and 30b; the other tables' sweep.sh left submit_benchmarks.py's default, triton."""
    foundry = [r for r in ROWS if r.table.source == "llm-foundry"]
    large = {r.model.name: r.table.stack for r in foundry if r.hardware == "H100-80GB" and r.gpus >= 128}
    assert large == {"mpt-1b": "flash-2023", "mpt-3b": "flash-2023", "mpt-7b": "flash-2023", "mpt-70b": "flash-2023",
                     "mpt-13b": "triton-2023", "mpt-30b": "triton-2023"}
    assert {r.table.stack for r in foundry if r.gpus < 128} == {"triton-2023"}

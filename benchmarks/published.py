"""partita's cost model against every published LLM-training measurement we could find, each priced in
its exact published configuration (benchmarks.published_data: sources, citations, what was skipped).

For every row: build the model as a `gpt:` / `llama:` family string, capture it once (bf16, fake
tensors; cached per model string), and search a SearchSpace restricted to the published choices -- tp,
pp, dp, ZeRO stage, micro-batch, virtual stages, recompute policy, sequence parallelism, no offload --
on f"{nodes}x8x{GPU}" with the costmodel.hardware preset (plus any hardware fact the source publishes
for its GPU, `Row.device_overrides`). Where the source leaves a choice out, the search picks it (the
row's notes say which), unless the framework fixes it: `stage_layers_for` (Megatron's even pipeline split),
`zero_for` (a distributed optimizer over one rank is ZeRO-0), `schedule_for` (Megatron's 1F1B with fewer
micro-batches than stages is GPipe's critical path). The prediction is converted to the published metric:

    tokens_per_s_per_gpu     global batch x seq / predicted step time / GPUs
    model_tflops_per_gpu     planner.estimate.build.predicted's tflops_per_device (model FLOPs of the graph)
    hardware_tflops_per_gpu  the same x 96 (1 + s/6h + V/16lh) / (72 (1 + s/6h + V/12lh)), Megatron's
                             full-recompute count over model FLOPs (REFERENCE.md; as benchmarks.table1)
    iteration_s              predicted step time

error = predicted / measured - 1, published whatever it is; no per-row or per-model factor exists.
`speed_error` puts every row on one scale: predicted speed / measured speed - 1 (positive: the cost
model is optimistic).

    python -m benchmarks.published                   # writes benchmarks/results/published.json and .png
    python -m benchmarks.published --source torchtitan --source bloom-176b    # a subset, printed only
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections import Counter

from benchmarks.common import hardware_over_model as common_ratio, p95, pyplot, save_figure, try_plot, write
from benchmarks.published_data import (HARDWARE_TFLOPS, ITERATION, MODEL_TFLOPS, ROWS, SKIPPED, TOKENS, Model, Row)
from partita.costmodel.errors import PartitaError
from partita.costmodel.capture.graph import OpGraph
from partita.costmodel.hardware import Cluster, GiB, gpu_device, parse_cluster
from partita.costmodel.models import resolve_model
from partita.costmodel.capture import capture
from partita.planner.estimate.build import predicted
from partita.planner.estimate.terms import stage_terms
from partita.planner.search import SearchResult, explain_infeasible, search
from partita.planner.enumerate.space import SearchSpace, TrainConfig

TARGET_MEDIAN, TARGET_P95, TARGET_MAX = 0.10, 0.20, 0.25
"""Targets for the cost model (not for this benchmark to force): median and p95 |error| on rows the fit did
not see (leave-one-source-out, benchmarks.fit); max |error| in-sample, reported beside them."""
NEEDED_SPACE_FIELDS = ("dp", "micro_batch", "virtual_stages", "full_recompute_layers")
UNBOUNDED_MEMORY = 1e15
"""Device bytes for the memory-lifted diagnostic of rows the memory model rejects (`_unbounded`)."""


# ------------------------------------------------------------------------------------ model and cluster

def model_string(model: Model, seq: int) -> str:
    """The MODEL string of `model` at `seq` tokens, every GPTConfig field spelled out (or its own string)."""
    if model.string:
        return f"{model.string},seq={seq}"
    fields = {"layers": model.layers, "hidden": model.hidden, "heads": model.heads, "vocab": model.vocab, "seq": seq,
              "ffn": model.ffn or 4 * model.hidden}
    if model.family == "llama" or model.kv_heads:
        fields["kv_heads"] = model.kv_heads or model.heads
    extra = {"attention": model.attention} if model.attention != "sdpa" else {}
    extra |= {"dropout": model.dropout} if model.dropout else {}
    extra |= {"loss": model.loss} if model.loss != "plain" else {}
    return f"{model.family}:" + ",".join(f"{k}={v}" for k, v in {**fields, **extra}.items())


def model_spec(model: Model, seq: int):
    """The ModelSpec of `model` at `seq` tokens, through its MODEL string (what a user would type)."""
    return resolve_model(model_string(model, seq))


def cluster_for(row: Row, kernels: dict | None = None) -> Cluster:
    """The row's cluster: its GPU with the kernel constants of the software stack it ran on
    (costmodel.hardware.stacks), or `kernels` (Device kernel fields, as benchmarks.fit tries them) instead."""
    if row.gpus % 8 and row.gpus > 8:
        raise PartitaError(f"{row.gpus} GPUs are not whole 8-GPU nodes")
    cluster = parse_cluster(f"{row.gpus // 8}x8x{row.hardware}" if row.gpus >= 8 else f"{row.gpus}x{row.hardware}")
    # the published runs fit as they ran: the memory model is checked against them without the planner's
    # allocator headroom (a margin for plans partita runs itself; costmodel.hardware.Device)
    device = dataclasses.replace(gpu_device(row.hardware, row.table.stack, kernels), **dict(row.device_overrides),
                                 allocator_headroom=0.0)
    return dataclasses.replace(cluster, device=device)


def published_space(row: Row) -> SearchSpace:
    """The search space of exactly the published configuration (None where the source is silent)."""
    missing = [f for f in NEEDED_SPACE_FIELDS if f not in SearchSpace.__dataclass_fields__]
    if missing:
        raise PartitaError(f"benchmarks.published needs SearchSpace fields {', '.join(missing)} (planner/enumerate/space.py) "
                           "to fix the published configuration; without them the rows cannot be priced as published")
    return SearchSpace(
        name="published", tp=(row.tp,), pp=(row.pp,), dp=(row.dp,), cp=(row.cp,), ep=(row.ep,), zero=zero_for(row),
        recompute=row.recompute, full_recompute_layers=row.full_recompute_layers,
        offload=False, sequence_parallel=(True, False) if row.sequence_parallel is None else (row.sequence_parallel,),
        micro_batch=None if row.micro_batch is None else (row.micro_batch,),
        virtual_stages=None if row.virtual_stages is None else (row.virtual_stages,),
        stage_layers=stage_layers_for(row),
        # every published ZeRO-3 run (FULL_SHARD, HSDP, fully_shard) reshards each layer after its forward
        keep_gathered=False,
        # Megatron-LM's pipeline sends use its scatter/gather (SC'21 §4.1), as Megatron-Core's (te-2024 stacks)
        # do; DeepSpeed's pipeline engine does not
        p2p_scatter_gather=row.table.framework.startswith("Megatron-LM") or row.table.stack.startswith("te-2024"),
        kernels=row.table.kernels,  # a torch.compile'd run is priced with fused kernels (costmodel.price.fusion)
        stack=row.table.stack,  # its overlaps and distributed optimizer as that stack runs them
        tp_comm_overlap=None if row.tp_comm_overlap is None else (row.tp_comm_overlap,))


def stage_layers_for(row: Row) -> tuple[int, ...] | None:
    """The row's pinned split of the repeated layers over its pipeline stages: the published one, or, for a Megatron-LM
    run with one model chunk per stage and no split stated, Megatron's own -- num_layers / pp on every stage
    (megatron/core/transformer/transformer_block.py get_num_layers divides evenly, the embedding and the head
    beside the first and last stages' layers); None: the search splits them."""
    if row.stage_layers is not None:
        return row.stage_layers
    if (row.table.framework.startswith("Megatron-LM") and row.pp > 1 and row.virtual_stages == 1
            and row.schedule in ("1F1B", "GPipe") and row.model.layers % row.pp == 0):
        return (row.model.layers // row.pp,) * row.pp
    return None


def zero_for(row: Row) -> tuple[int, ...]:
    """The row's ZeRO stages as partita's space takes them. A distributed optimizer (ZeRO-1) over one data-parallel
    rank shards nothing: every rank keeps its optimizer states whole, as ZeRO-0 does (Megatron-LM runs
    --use-distributed-optimizer at dp = 1 with one shard, the whole buffer), while the planner refuses ZeRO-1 at dp = 1 as
    meaningless; such a row is priced as ZeRO-0."""
    if row.dp * row.cp == 1:
        return tuple(sorted({0 if z == 1 else z for z in row.zero}))
    return row.zero


def schedule_for(row: Row) -> str:
    """The row's schedule as partita names it. A published 1F1B run with fewer micro-batches than stages ran
    (Megatron-LM's 1F1B takes min(pp - rank - 1, m) warm-up forwards, so every rank but the last runs all its
    forwards first) with GPipe's critical path, (m + pp - 1) x (forward + backward) for equal stages; torch's
    Schedule1F1B refuses m < pp (planner.plan.schedules), so such a row is priced as GPipe."""
    if row.schedule == "1F1B" and row.micro_batch and row.global_batch // (row.dp * row.micro_batch) < row.pp:
        return "GPipe"
    return row.schedule


def train_for(row: Row) -> TrainConfig:
    # the other frameworks' runs did not compute under partita's autocast: Megatron-LM trains a bf16 model with
    # fp32 main parameters, the FSDP runs on their mixed-precision policy's bf16 parameters; partita's own runs
    # (Table.autocast) did (TrainConfig.autocast)
    return TrainConfig(global_batch=row.global_batch, seq_len=row.seq, dtype="bf16", schedule=schedule_for(row),
                       autocast=row.table.autocast, master_weights=row.master_weights, fp32_grads=row.table.fp32_grads)


def hardware_over_model(model: Model, seq: int) -> float:
    """Megatron's full-recompute FLOPs over model FLOPs for `model` at `seq` tokens (benchmarks.common)."""
    return common_ratio(seq, model.hidden, model.layers, model.vocab)


# -------------------------------------------------------------------------------------------- pricing

def predicted_metric(row: Row, pred: dict) -> float:
    metric = row.table.metric
    if metric == TOKENS:
        return pred["tokens_per_s"] / row.gpus
    if metric == MODEL_TFLOPS:
        return pred["tflops_per_device"]
    if metric == HARDWARE_TFLOPS:
        return pred["tflops_per_device"] * hardware_over_model(row.model, row.seq)
    if metric == ITERATION:
        return pred["step_time_s"]
    raise PartitaError(f"unknown metric {metric!r}")


def row_key(row: Row) -> str:
    variant = f"/{row.variant}" if row.variant else ""
    compiled = "/compiled" if row.table.kernels != "eager" else ""
    return (f"{row.table.source}/{row.model.name}/s{row.seq}/{row.hardware}x{row.gpus}/gb{row.global_batch}"
            f"{variant}{compiled}")


def _config(row: Row) -> dict:
    return {"tp": row.tp, "pp": row.pp, "dp": row.dp, "cp": row.cp, "ep": row.ep, "zero": list(row.zero), "sharding": row.sharding,
            "micro_batch": row.micro_batch, "global_batch": row.global_batch, "seq": row.seq,
            "recompute": list(row.recompute),
            **({"full_recompute_layers": row.full_recompute_layers} if row.full_recompute_layers is not None else {}),
            "sequence_parallel": row.sequence_parallel, "schedule": row.schedule,
            "virtual_stages": row.virtual_stages,
            **({"stage_layers": list(row.stage_layers)} if row.stage_layers is not None else {}),
            "precision": row.table.precision, "framework": row.table.framework,
            "kernels": row.table.kernels,
            **({"device_overrides": dict(row.device_overrides)} if row.device_overrides else {})}


def _plan(result: SearchResult) -> dict:
    c = result.best
    per_option = c.solution.counts.sum(0)
    layers = Counter()
    for option, n in zip(c.options, per_option):
        layers[option.recompute] += int(round(float(n)))
    return {"tp": c.tp, "pp": c.pp, "dp": c.dp, "zero": c.zero, "micro_batch": c.micro_batch,
            "num_microbatches": c.num_microbatches, "schedule": c.schedule, "virtual_stages": c.virtual_stages,
            "sequence_parallel": c.sequence_parallel, "recompute_layers": dict(layers)}


def _errors(row: Row, value: float) -> tuple[float, float]:
    """(error on the published metric, speed error: predicted speed / measured speed - 1)."""
    error = value / row.value - 1
    return error, (row.value / value - 1) if row.table.metric == ITERATION else error


def _unbounded(row: Row, graph: OpGraph, kernels: dict | None = None) -> dict:
    """A diagnostic for a row the memory model rejects although it ran: its predicted time on the same
    cluster with device memory lifted (UNBOUNDED_MEMORY), so the time model is still checked. Never
    counted as "priced as published"."""
    cluster = cluster_for(row, kernels)
    cluster = dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, memory_bytes=UNBOUNDED_MEMORY))
    result = search(graph, cluster, train_for(row), space=published_space(row), raise_infeasible=False)
    if result.best is None:
        return {"value": None, "reason": "no configuration even without a memory limit"}
    pred = predicted(result, result.best)
    value = predicted_metric(row, pred)
    error, speed = _errors(row, value)
    return {"metric": row.table.metric, "value": value, "error": error, "speed_error": speed,
            "peak_memory_gib": pred["peak_memory_bytes"] / GiB,
            "capacity_gib": cluster_for(row).device.usable_memory() / GiB, "plan": _plan(result),
            "breakdown": {"step_time_s": pred["step_time_s"], **pred["breakdown"], "mfu": pred["mfu"]}}


def _no_candidate(row: Row, graph: OpGraph) -> str:
    """Why the published configuration admits no candidate at all (planner.enumerate.space.check_space's sentence)."""
    from partita.planner.enumerate.candidates import split_model
    from partita.planner.enumerate.space import check_space
    layers = split_model(graph)[1]
    try:
        check_space(cluster_for(row), train_for(row), published_space(row), max_pp=max(1, len(layers)),
                    layers=len(layers), seq=graph.seq_len)
    except PartitaError as e:
        return str(e)
    return "no candidate: the published mesh, batch and schedule admit no configuration"


MEMORY_KINDS = {
    "allocated": "the peak of allocated bytes (torch.cuda.max_memory_allocated)",
    "reserved": "allocated plus the caching allocator's predicted cache (torch.cuda's peak reserved bytes; "
                "planner.estimate.terms.stage_terms)",
    "device": "the reserved peak plus the device's reserve for the CUDA context and NCCL (Device.reserved_bytes): "
              "what nvidia-smi shows as used",
}
"""What a published peak memory figure is set against, by Row.memory_kind."""


def predicted_memory(row: Row, result: SearchResult, allocated: float) -> float:
    """partita's prediction of what `row`'s published memory figure reads (MEMORY_KINDS), bytes; `allocated`: the
    chosen plan's peak of allocated bytes."""
    if row.memory_kind not in MEMORY_KINDS:
        raise PartitaError(f"{row_key(row)}: memory_kind {row.memory_kind!r} is not one of {', '.join(MEMORY_KINDS)}")
    if row.memory_kind == "allocated":
        return allocated
    reserved = stage_terms(result)["reserved"]
    return reserved + (result.cluster.device.reserved_bytes if row.memory_kind == "device" else 0.0)


def price(row: Row, graphs: dict[tuple, OpGraph] | None = None, kernels: dict | None = None) -> dict:
    """Price one published row; `graphs` caches captures per (model string, autocast) across rows; `kernels` replaces
    the stack's fitted kernel constants (benchmarks.fit)."""
    t0 = time.perf_counter()
    graphs = {} if graphs is None else graphs
    name = model_string(row.model, row.seq)
    # partita's own runs (Table.autocast) ran under CUDA autocast over fp32 masters: captured with its records
    # (fp32 logits and loss, cast copies), as the planner captures a plan for a GPU (planner.api); the other
    # frameworks' runs computed in bf16 throughout (train_for)
    autocast = "cuda" if row.table.autocast else None
    if (name, autocast) not in graphs:
        graphs[(name, autocast)] = capture(model_spec(row.model, row.seq), dtype="bf16", autocast=autocast)
    graph = graphs[(name, autocast)]
    notes = [n for n in (row.table.notes, row.model.notes, row.notes) if n]
    out = {"key": row_key(row), "source": row.table.source, "stack": row.table.stack,
           "citation": row.table.citation, "model": row.model.name,
           "model_string": name, "hardware": row.hardware, "gpus": row.gpus, "config": _config(row),
           "measured": {"metric": row.table.metric, "value": row.value}, "predicted": None, "error": None,
           "speed_error": None, "notes": notes}
    if row.memory_gib is not None:
        out["measured_memory"] = {"gib": row.memory_gib, "reading": row.memory_reading}
    t1 = time.perf_counter()
    result = search(graph, cluster_for(row, kernels), train_for(row), space=published_space(row),
                    raise_infeasible=False)
    out["search_s"] = time.perf_counter() - t1
    if result.best is None:
        out["not_priced"] = explain_infeasible(result) if result.candidates else _no_candidate(row, graph)
        if result.candidates:  # the run did fit on the real GPU: price its time with the memory limit lifted
            out["predicted_if_memory_unbounded"] = _unbounded(row, graph, kernels)
        out["price_s"] = time.perf_counter() - t0
        return out
    pred = predicted(result, result.best)
    value = predicted_metric(row, pred)
    out["predicted"] = {"metric": row.table.metric, "value": value}
    out["error"], out["speed_error"] = _errors(row, value)
    out["plan"] = _plan(result)
    out["breakdown"] = {"step_time_s": pred["step_time_s"], **pred["breakdown"], "mfu": pred["mfu"],
                        "peak_memory_gib": pred["peak_memory_bytes"] / GiB,
                        "memory_capacity_gib": pred["memory_capacity_bytes"] / GiB}
    if row.memory_gib is not None:  # set against what the source read (MEMORY_KINDS)
        peak = predicted_memory(row, result, pred["peak_memory_bytes"])
        out["measured_memory"] |= {"kind": row.memory_kind, "predicted_peak_gib": peak / GiB,
                                   "error": peak / GiB / row.memory_gib - 1}
    out["price_s"] = time.perf_counter() - t0
    return out


# -------------------------------------------------------------------------------------------- summary

def _stats(errors: list[float]) -> dict:
    a = [abs(e) for e in errors]
    return {"median_abs_error": statistics.median(a) if a else None, "p95_abs_error": p95(a),
            "max_abs_error": max(a) if a else None,
            "within_10pct": sum(x <= 0.10 for x in a) / len(a) if a else None,
            "within_25pct": sum(x <= 0.25 for x in a) / len(a) if a else None}


def held_out(rows: list[dict]) -> dict | None:
    """Attach to each row its leave-one-source-out error from benchmarks.fit's results (results/fit.json),
    when they were computed for the constants in force; returns how they were had, or None (no such file,
    or a stale one: rerun `python -m benchmarks.fit`)."""
    import json
    from benchmarks.common import RESULTS
    from benchmarks.fit import constants_digest
    from partita.costmodel.hardware import fitted_constants
    path = RESULTS / "fit.json"
    if not path.exists():
        return None
    fit = json.loads(path.read_text())
    if fit.get("digest") != constants_digest(fitted_constants()["groups"]) or not fit.get("loso"):
        return {"stale": True, "commit": fit.get("commit")}
    for r in rows:
        loso = fit["loso"].get(r["key"]) or {}
        r["loso_error"] = loso.get("error")
        r["loso_unseen"] = loso.get("fold_unseen") or []
    return {"stale": False, "commit": fit.get("commit"), "digest": fit["digest"]}


def _median_of(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def first_contact_summary() -> dict:
    """The ledger's first-contact figures (benchmarks.first_contact.summary)."""
    from benchmarks.first_contact import summary
    return summary()


def summarize(rows: list[dict], wall_s: float) -> dict:
    priced = [r for r in rows if r["error"] is not None]
    loso = held_out(rows)
    per_source = {}
    for source in dict.fromkeys(r["source"] for r in rows):
        mine = [r for r in rows if r["source"] == source]
        ok = [r for r in mine if r["error"] is not None]
        per_source[source] = {"count": len(mine), "priced": len(ok), **_stats([r["error"] for r in ok]),
                              "stacks": sorted({r["stack"] for r in mine}),
                              "median_speed_error": statistics.median(r["speed_error"] for r in ok) if ok else None}
        held = [r["loso_error"] for r in mine if r.get("loso_error") is not None]
        if held:
            unseen = sorted({u for r in mine for u in r.get("loso_unseen", [])})
            per_source[source]["held_out"] = {"priced": len(held), **_stats(held), **({"unseen": unseen} if unseen else {})}
    overall = {**_stats([r["error"] for r in priced]),
               "median_of_source_medians": _median_of([v["median_abs_error"] for v in per_source.values()])}
    held = [r["loso_error"] for r in rows if r.get("loso_error") is not None]
    held_stats = {"priced": len(held), **_stats(held), "median_of_source_medians": _median_of(
        [(v.get("held_out") or {}).get("median_abs_error") for v in per_source.values()])} if held else None
    first = first_contact_summary()
    for source, v in first["per_source"].items():
        if source in per_source:
            per_source[source]["first_contact"] = v
    seen = [r["loso_error"] for r in rows if r.get("loso_error") is not None and not r.get("loso_unseen")]
    if held and seen:  # the rows whose every fitted constant some other source measures too
        held_stats["seen"] = {"priced": len(seen), **_stats(seen)}
    lifted = [r["predicted_if_memory_unbounded"] for r in rows
              if (r.get("predicted_if_memory_unbounded") or {}).get("error") is not None]
    worst = sorted(priced, key=lambda r: -abs(r["error"]))[:8]
    return {
        "rows": len(rows), "priced": len(priced), "sources": len(per_source), **overall,
        "median_speed_error": statistics.median(r["speed_error"] for r in priced) if priced else None,
        "count_per_source": {s: v["count"] for s, v in per_source.items()},
        "per_source": per_source,
        "held_out": {**(loso or {"stale": None}), **({"all": held_stats} if held_stats else {}),
                     "note": "leave-one-source-out (benchmarks.fit): each source's rows priced with constants "
                             "fitted without them"},
        "first_contact": {**first, "note": "each row of a source added since the ledger began, priced before the "
                                           "fit saw it, at the commit its ledger line names (benchmarks.first_contact)"},
        "targets": {"median_abs_error": TARGET_MEDIAN, "p95_abs_error": TARGET_P95,
                    "judged_on": "held-out (leave-one-source-out) errors of the priced rows",
                    "met": bool(held_stats) and held_stats["median_abs_error"] <= TARGET_MEDIAN
                    and held_stats["p95_abs_error"] <= TARGET_P95,
                    "all_rows_priced": len(priced) == len(rows),
                    "max_abs_error_in_sample": overall["max_abs_error"], "former_max_target": TARGET_MAX},
        "worst": [{"key": r["key"], "error": r["error"], "measured": r["measured"], "predicted": r["predicted"],
                   "plan": r["plan"], "breakdown": r["breakdown"]} for r in worst],
        "not_priced": [{"key": r["key"], "reason": r["not_priced"]} for r in rows if r["error"] is None],
        "memory": {
            "note": "rows whose source publishes peak memory: partita's predicted peak (allocated bytes, the "
                    "allocator's peak) against the published reading; error = predicted / measured - 1",
            "rows": [{"key": r["key"], **r["measured_memory"]} for r in rows if r.get("measured_memory")]},
        "time_model_with_memory_lifted": {
            "note": "rows the memory model rejects although they ran, re-priced with device memory lifted; with "
                    "the priced rows, this checks the time model alone (not the headline)",
            "rows": len(priced) + len(lifted), "lifted": len(lifted),
            **_stats([r["error"] for r in priced] + [x["error"] for x in lifted])},
        "skipped": [dataclasses.asdict(s) for s in SKIPPED],
        "sign": "error = predicted / measured - 1 on the published metric; speed_error = predicted speed / "
                "measured speed - 1 (positive: predicted faster than measured)",
        "wall_s": wall_s, "captures": len({r["model_string"] for r in rows}),
    }


# ------------------------------------------------------------------------------------------------ main

def _config_text(r: dict) -> str:
    c, p = r["config"], r.get("plan") or {}
    mb = c["micro_batch"] if c["micro_batch"] is not None else f"({p.get('micro_batch', '?')})"
    rc = "/".join(c["recompute"]) if len(c["recompute"]) < 3 else "(search)"
    if c.get("full_recompute_layers") is not None:
        rc = f"full x{c['full_recompute_layers']}/" + "/".join(r for r in c["recompute"] if r != "full")
    sp = " SP" if c["sequence_parallel"] else (" (SP)" if c["sequence_parallel"] is None and p.get("sequence_parallel")
                                              else "")
    extra = "".join(f" {k}{c[k]}" for k in ("cp", "ep") if c.get(k, 1) > 1)
    compiled = " compiled" if c.get("kernels", "eager") != "eager" else ""
    return f"tp{c['tp']} pp{c['pp']} dp{c['dp']}{extra} Z{'|'.join(map(str, c['zero']))} mb{mb} {rc}{sp}{compiled}"


def _print_row(r: dict) -> None:
    pred = r["predicted"]["value"] if r["predicted"] else float("nan")
    err = f"{100 * r['error']:+6.1f}%" if r["error"] is not None else "  n/a  "
    print(f"{r['source']:<16} {r['model']:<14} s{r['config']['seq']:<6} {r['hardware']:<9} x{r['gpus']:<5} "
          f"{_config_text(r):<38} {r['measured']['metric']:<23} {r['measured']['value']:>9.4g} {pred:>9.4g} {err}"
          + (_not_priced_text(r) if r["error"] is None else ""), flush=True)


def _not_priced_text(r: dict) -> str:
    lifted = r.get("predicted_if_memory_unbounded") or {}
    also = ""
    if lifted.get("error") is not None:
        also = (f" [memory lifted: {lifted['value']:.4g}, {100 * lifted['error']:+.1f}%, needs "
                f"{lifted['peak_memory_gib']:.0f} of {lifted['capacity_gib']:.0f} GiB]")
    return f"  NOT PRICED{also}: {r['not_priced'][:90]}"


def _num(x, fmt: str = ".3f") -> str:
    return "n/a" if x is None else format(x, fmt)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.published", description=__doc__.split("\n")[0])
    ap.add_argument("--source", action="append", help="price only rows of this source (repeatable); prints, "
                                                      "writes nothing")
    args = ap.parse_args(argv)
    selected = [r for r in ROWS if not args.source or r.table.source in args.source]
    if not selected:
        ap.error(f"no rows for {args.source}; sources: {', '.join(dict.fromkeys(r.table.source for r in ROWS))}")
    t0 = time.perf_counter()
    graphs: dict[tuple, OpGraph] = {}
    print(f"{'source':<16} {'model':<14} {'seq':<7} {'GPU':<9} {'GPUs':<6} {'config (published; (searched))':<38} "
          f"{'metric':<23} {'measured':>9} {'predicted':>9}  error")
    rows = []
    for row in selected:
        rows.append(price(row, graphs))
        _print_row(rows[-1])
    summary = summarize(rows, time.perf_counter() - t0)
    fc = summary["first_contact"]
    if fc["rows"]:
        print(f"first contact (benchmarks/data/first_contact.jsonl): {fc['priced']} of {fc['rows']} rows from "
              f"{fc['sources']} sources priced before the fit saw them, median |error| {_num(fc['median_abs_error'])}, "
              f"p95 {_num(fc['p95_abs_error'])}; median of per-source medians {_num(fc['median_of_source_medians'])}")
    held = summary["held_out"]
    if held.get("all"):
        a = held["all"]
        print(f"held out (leave-one-source-out, benchmarks.fit): {a['priced']} rows, median |error| "
              f"{_num(a['median_abs_error'])}, p95 {_num(a['p95_abs_error'])} (targets {TARGET_MEDIAN}, {TARGET_P95}); "
              f"median of per-source medians {_num(a.get('median_of_source_medians'))}")
    else:
        print("held out: no current leave-one-source-out errors (run `python -m benchmarks.fit` for the constants "
              "in force)")
    print(f"in-sample: rows {summary['rows']} (priced {summary['priced']}) from {summary['sources']} sources; median "
          f"|error| {_num(summary['median_abs_error'])}, p95 {_num(summary['p95_abs_error'])}, max "
          f"{_num(summary['max_abs_error'])}; {summary['wall_s']:.0f} s")
    t = summary["time_model_with_memory_lifted"]
    print(f"time model alone ({t['rows']} rows, {t['lifted']} of them with memory lifted): median |error| "
          f"{_num(t['median_abs_error'])}, max {_num(t['max_abs_error'])}")
    for s, v in summary["per_source"].items():
        held_s = (v.get("held_out") or {}).get("median_abs_error")
        print(f"  {s:<18} {v['count']:>4} rows  median |error| {_num(v['median_abs_error'])} (held out "
              f"{_num(held_s)})  max {_num(v['max_abs_error'])}  median speed error "
              f"{_num(v['median_speed_error'], '+.3f')}  not priced {v['count'] - v['priced']}  {','.join(v['stacks'])}")
    if args.source:
        return 0
    path = write("published", {"rows": rows, "summary": summary})
    print(f"wrote {path}")
    try_plot(_plot, rows)
    return 0


def _plot(rows: list[dict]) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(11, 4.5))
    sources = list(dict.fromkeys(r["source"] for r in rows))
    x = 0
    for i, s in enumerate(sources):
        mine = [r for r in rows if r["source"] == s]
        priced = [(j, 1 + r["speed_error"]) for j, r in enumerate(mine) if r["speed_error"] is not None]
        lifted = [(j, 1 + r["predicted_if_memory_unbounded"]["speed_error"]) for j, r in enumerate(mine)
                  if (r.get("predicted_if_memory_unbounded") or {}).get("speed_error") is not None]
        ax.scatter([x + j for j, _ in priced], [v for _, v in priced], s=10, color=f"C{i}",
                   label=f"{s} ({len(priced)}/{len(mine)})")
        ax.scatter([x + j for j, _ in lifted], [v for _, v in lifted], s=12, facecolors="none", edgecolors=f"C{i}",
                   lw=0.6)
        x += len(mine) + 3
    ax.scatter([], [], s=12, facecolors="none", edgecolors="k", lw=0.6,
               label="not priced (memory model rejects): time with memory lifted")
    for lo, hi, a in ((0.9, 1.1, 0.18), (0.75, 1.25, 0.08)):
        ax.axhspan(lo, hi, color="grey", alpha=a, lw=0)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([])
    ax.set_ylabel("predicted speed / measured speed")
    ax.set_title("partita's cost model on published training runs, priced as published (bands: +-10%, +-25%; "
                 "legend: priced/rows)", fontsize=10)
    ax.legend(fontsize=7, ncol=3, loc="lower left")
    save_figure(fig, "published", dpi=110)


if __name__ == "__main__":
    sys.exit(main())

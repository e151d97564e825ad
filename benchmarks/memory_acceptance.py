"""Memory that accepts what ran (issue 45, item 3): every published or first-contact row the memory model refuses
although it ran, and every row whose source states its peak memory, priced as published, with the stage's peak
split into the terms a framework allocates (planner.estimate.terms: parameters, gradients, optimizer state,
activations, transients, and the allocator cache beside them).

    python -m benchmarks.memory_acceptance           # writes benchmarks/results/memory_acceptance.json
    python -m benchmarks.memory_acceptance --all     # every row, to find refusals a fresh data set brings (minutes)
    python -m benchmarks.memory_acceptance --key torchtitan --key nemotron   # a subset, printed only

Which rows, without pricing them all (benchmarks.published takes minutes): the rows with a stated peak
(`Row.memory_gib`), the rows benchmarks/results/published.json last found refused on memory ("no plan fits"), and
the first-contact ledger's lines that were refused (benchmarks/data/first_contact.jsonl, `memory_lifted`).

A published run is priced as benchmarks.published prices it (`cluster_for`: no flat headroom, the run ran), so the
capacity is the device's memory less its reserve. The stated figure is compared with what it reads: a caching
allocator's peak *reserved* bytes against the predicted allocated peak plus the allocator's predicted cache
(costmodel.hardware.Device.allocator_cache_bytes), a peak *allocated* against the allocated peak alone;
error = predicted / stated - 1. A refused row is priced again with memory lifted (benchmarks.published
`UNBOUNDED_MEMORY`) to show the terms of the plan the search would run.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from pathlib import Path

from benchmarks.common import write
from benchmarks.published import (UNBOUNDED_MEMORY, _config_text, _plan, cluster_for, model_spec, model_string,
                                  predicted_memory, published_space, row_key, train_for)
from benchmarks.published_data import ROWS, Row
from partita.costmodel.capture import capture
from partita.costmodel.hardware import GiB
from partita.planner.estimate.terms import stage_terms
from partita.planner.search import search

TARGET = 0.10
"""Issue 45's bound on |predicted / stated - 1| for every stated peak."""
PUBLISHED_JSON = Path(__file__).resolve().parent / "results" / "published.json"
"""benchmarks.published's last full run, committed: which rows it found refused on memory."""
TERMS = ("parameters", "gradients", "optimizer_state", "activations", "transients", "allocated", "allocator_cache",
         "reserved")


def all_rows() -> list[Row]:
    """Every published row, and the first-contact rows not yet admitted to the fit."""
    from benchmarks.published_data_first_contact import FIRST_CONTACT_ROWS
    keys = {row_key(r) for r in ROWS}
    return list(ROWS) + [r for r in FIRST_CONTACT_ROWS if row_key(r) not in keys]


def refused_keys() -> set[str]:
    """Keys last found refused on memory: benchmarks.published's results and the first-contact ledger."""
    from benchmarks.first_contact import read
    out = set()
    path = PUBLISHED_JSON
    if path.exists():
        summary = json.loads(path.read_text())["summary"]
        out |= {r["key"] for r in summary["not_priced"] if r["reason"].startswith("no plan fits")}
    out |= {e["key"] for e in read() if e.get("error") is None and e.get("memory_lifted")}
    return out


def select(rows: list[Row], keys: list[str] | None, everything: bool) -> list[Row]:
    if keys:
        return [r for r in rows if any(k in row_key(r) for k in keys)]
    if everything:
        return rows
    refused = refused_keys()
    return [r for r in rows if r.memory_gib is not None or row_key(r) in refused]


def _gib(terms: dict) -> dict:
    return {k: (v / GiB if k in TERMS else v) for k, v in terms.items()}


def check(row: Row, graphs: dict) -> dict:
    """One row: refused or not, its predicted peak by term, and the stated peak beside it (module docstring)."""
    name = model_string(row.model, row.seq)
    autocast = "cuda" if row.table.autocast else None
    if (name, autocast) not in graphs:
        graphs[(name, autocast)] = capture(model_spec(row.model, row.seq), dtype="bf16", autocast=autocast)
    graph, cluster = graphs[(name, autocast)], cluster_for(row)
    out = {"key": row_key(row), "source": row.table.source, "stack": row.table.stack,
           "framework": row.table.framework, "config": _config_text({"config": _config_of(row), "plan": {}}),
           "notes": [n for n in (row.table.notes, row.model.notes, row.notes) if n],
           "capacity_gib": cluster.device.usable_memory() / GiB}
    result = search(graph, cluster, train_for(row), space=published_space(row), raise_infeasible=False)
    out["refused"] = result.best is None
    if result.best is None:
        if not result.candidates:
            out["no_candidate"] = True
            return out
        lifted = dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, memory_bytes=UNBOUNDED_MEMORY))
        result = search(graph, lifted, train_for(row), space=published_space(row), raise_infeasible=False)
        if result.best is None:
            out["no_candidate"] = True
            return out
    out["plan"] = _plan(result)
    terms = stage_terms(result)
    out["terms_gib"] = _gib(terms)
    if row.memory_gib is not None:
        predicted = predicted_memory(row, result, terms["allocated"]) / GiB
        out["stated"] = {"gib": row.memory_gib, "reading": row.memory_reading,
                         "compared": row.memory_kind, "predicted_gib": predicted,
                         "error": predicted / row.memory_gib - 1}
    return out


def _config_of(row: Row) -> dict:
    from benchmarks.published import _config
    return _config(row)


def summarize(rows: list[dict], wall_s: float) -> dict:
    stated = [r for r in rows if r.get("stated")]
    errors = [abs(r["stated"]["error"]) for r in stated]
    return {"rows": len(rows), "refused": [r["key"] for r in rows if r.get("refused")],
            "stated": len(stated), "within_10pct": sum(e <= TARGET for e in errors),
            "max_abs_error": max(errors) if errors else None,
            "met": not any(r.get("refused") for r in rows) and all(e <= TARGET for e in errors),
            "target": f"no refusal; |predicted / stated - 1| <= {TARGET} for every stated peak",
            "wall_s": wall_s}


def _print(r: dict) -> None:
    t = r.get("terms_gib")
    status = "REFUSED" if r.get("refused") else "fits"
    if t is None:
        print(f"{r['key']:<72} {status}: no candidate")
        return
    stated = ""
    if r.get("stated"):
        s = r["stated"]
        stated = f"  stated {s['gib']:.1f} ({s['compared']}) vs {s['predicted_gib']:.1f}: {100 * s['error']:+.1f}%"
    print(f"{r['key']:<72} {status:<7} {t['allocated']:6.1f} of {r['capacity_gib']:.1f} GiB: params "
          f"{t['parameters']:.1f} grads {t['gradients']:.1f} optim {t['optimizer_state']:.1f} act "
          f"{t['activations']:.1f} (x{t['in_flight']:.2f}) transients {t['transients']:.1f} cache "
          f"{t['allocator_cache']:.1f} [stage {t['stage']}, {t['phase']}]{stated}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.memory_acceptance", description=__doc__.split("\n")[0])
    ap.add_argument("--all", action="store_true", help="check every row (minutes)")
    ap.add_argument("--key", action="append", help="only rows whose key contains this (repeatable); printed only")
    args = ap.parse_args(argv)
    t0, graphs = time.perf_counter(), {}
    rows = []
    for row in select(all_rows(), args.key, args.all):
        rows.append(check(row, graphs))
        _print(rows[-1])
    summary = summarize(rows, time.perf_counter() - t0)
    print(f"{summary['rows']} rows: {len(summary['refused'])} refused on memory; {summary['stated']} state a peak, "
          f"{summary['within_10pct']} within {TARGET:.0%} (max |error| "
          f"{'n/a' if summary['max_abs_error'] is None else format(summary['max_abs_error'], '.3f')})")
    if args.key:
        return 0
    print(f"wrote {write('memory_acceptance', {'rows': rows, 'summary': summary})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

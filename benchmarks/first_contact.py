"""The first-contact ledger: every published source added from now on is priced before the fit sees it, and that
prediction is committed, append-only, with the commit it was priced at.

    python -m benchmarks.first_contact add SOURCE   # price SOURCE's rows, append them to the ledger (commit it)
    python -m benchmarks.first_contact verify       # the hash chain, the git history and the rows' identity
    python -m benchmarks.first_contact show         # the first-contact figures

How a source enters (benchmarks/published_data_first_contact.py):
1. Its rows are written with their citation and the facts of the run (`Table.run`); the stack is the one
   benchmarks.stack_rule assigns to those facts. Commit.
2. `add SOURCE` prices every row at HEAD -- the cost model and fitted constants in force, exactly as a stranger's
   run would be priced -- and appends one line per row to `LEDGER`. It refuses to run with uncommitted changes
   to tracked files (the commit it records would not be what priced the rows), for a source the fit already
   holds, and for a source already in the ledger. Commit the ledger.
3. Only then the source's name goes into ADMITTED, and the fit (`python -m benchmarks.fit`) reads its rows.

A line holds the row's identity (key, model string, configuration, GPU, measured metric and value, and their
digest), the stack and the rule that chose it, the first-contact prediction and error (or why it was not
priced), the commit it was priced at and the digest of the fitted constants in force, and `prev` / `hash`:
sha256 over the previous line's hash and this line's canonical JSON, so an edited line breaks the chain. What
the chain alone cannot catch (a rewrite that recomputes every hash), the repository's history does:
`history_problems` checks that every commit touching the ledger only appended to it, that each line's pricing
commit is an ancestor of the commit that added the line, that the constants in force there are those the line
names, and that the fit of that commit had not seen the row. tests/benchmarks/test_first_contact.py runs both.

The figures (`summary`): over the first line of every key, median, p95 and max |error|, per source, and the
median of the per-source medians (each source weighed once). benchmarks.published reports them beside the
held-out (leave-one-source-out) and in-sample errors.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEDGER_PATH = "benchmarks/data/first_contact.jsonl"
LEDGER = ROOT / LEDGER_PATH
LEGACY_SOURCES = frozenset({
    "megatron-sc21", "korthikanti-2022", "llm-foundry", "fms-fsdp", "torchtitan", "llama3-paper", "bloom-176b",
    "mt-nlg-530b", "nemo-automodel", "megatron-lm-h100", "dgxc-benchmarking", "flash-attention", "gpu-h200-2026"})
"""The sources the fit held before the ledger existed (2026-11-29); every other source enters through it."""


class LedgerError(Exception):
    """A refusal of `add`, one line."""


# ------------------------------------------------------------------------------------------------ lines

def canonical(entry: dict) -> str:
    return json.dumps(entry, sort_keys=True, separators=(",", ":"))


def chain_hash(prev: str, entry: dict) -> str:
    """sha256 over the previous line's hash and this line's canonical JSON without its own hash."""
    body = {k: v for k, v in entry.items() if k != "hash"}
    return hashlib.sha256((prev + canonical(body)).encode()).hexdigest()


def parse(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def read(path: Path = LEDGER) -> list[dict]:
    return parse(path.read_text()) if path.exists() else []


def chain_problems(entries: list[dict]) -> list[str]:
    """Where the hash chain breaks: a line edited, removed or reordered after the lines after it were written."""
    out, prev = [], ""
    for i, e in enumerate(entries):
        if e.get("prev") != prev:
            out.append(f"line {i + 1} ({e.get('key')}): prev does not name the line before it")
        if e.get("hash") != chain_hash(e.get("prev", ""), e):
            out.append(f"line {i + 1} ({e.get('key')}): its content does not hash to its recorded hash (edited)")
        prev = e.get("hash", "")
    return out


def identity(row) -> dict:
    """What a row is: everything that decides its pricing and its measured value."""
    from benchmarks.published import _config, model_string, row_key
    return {"key": row_key(row), "model_string": model_string(row.model, row.seq), "hardware": row.hardware,
            "gpus": row.gpus, "config": _config(row), "device_overrides": [list(p) for p in row.device_overrides],
            "autocast": row.table.autocast, "fp32_grads": row.table.fp32_grads,
            "measured": {"metric": row.table.metric, "value": row.value}}


def identity_changes(entry: dict, row) -> list[str]:
    """The identity fields of `row` that differ from what its ledger line recorded. A field the line does not
    record (a configuration field added to the data model since) is not a change: the line's row ran without it."""
    now, out = identity(row), []
    for field, recorded in entry.items():
        if field not in now:
            continue
        if field == "config":
            out += [f"config.{k}" for k, v in recorded.items() if json.loads(json.dumps(now["config"].get(k))) != v]
        elif json.loads(json.dumps(now[field])) != recorded:
            out.append(field)
    return out


def identity_digest(row) -> str:
    return hashlib.sha256(canonical(identity(row)).encode()).hexdigest()[:16]


def entry_for(row, priced: dict, commit: str, digest: str, date: str) -> dict:
    """The ledger line of one priced row (without prev / hash)."""
    from benchmarks.stack_rule import rule_for
    run = row.table.run
    rule_index, rule = rule_for(run)
    lifted = priced.get("predicted_if_memory_unbounded") or {}
    return {**identity(row), "identity": identity_digest(row), "source": row.table.source,
            "citation": row.table.citation, "stack": row.table.stack, "run": dataclasses.asdict(run),
            "rule": rule_index, "rule_stack": rule.stack,
            "predicted": (priced.get("predicted") or {}).get("value"), "error": priced.get("error"),
            "speed_error": priced.get("speed_error"), "plan": priced.get("plan"),
            "not_priced": priced.get("not_priced"),
            "memory_lifted": ({"value": lifted.get("value"), "error": lifted.get("error")} if lifted else None),
            "commit": commit, "constants_digest": digest, "date": date}


def append(entries: list[dict], new: list[dict], path: Path = LEDGER) -> list[dict]:
    """Chain `new` onto `entries` and append them to the file; returns the chained lines."""
    prev = entries[-1]["hash"] if entries else ""
    out = []
    for e in new:
        e = {**e, "prev": prev}
        e["hash"] = prev = chain_hash(prev, e)
        out.append(e)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for e in out:
            f.write(canonical(e) + "\n")
    return out


# -------------------------------------------------------------------------------------------------- git

def git(*args: str, cwd: Path = ROOT, check: bool = True) -> str:
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if check and r.returncode:
        raise LedgerError(f"git {' '.join(args)} failed: {r.stderr.strip()[:200]}")
    return r.stdout


def head_commit(cwd: Path = ROOT) -> str:
    return git("rev-parse", "HEAD", cwd=cwd).strip()


def uncommitted(cwd: Path = ROOT, ledger_path: str = LEDGER_PATH) -> list[str]:
    """Tracked files with uncommitted changes, the ledger itself aside."""
    lines = git("status", "--porcelain", "--untracked-files=no", cwd=cwd).splitlines()
    return [ln[3:] for ln in lines if ln[3:] != ledger_path]


def show(commit: str, path: str, cwd: Path = ROOT) -> str | None:
    r = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=cwd, capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def history_problems(cwd: Path = ROOT, ledger_path: str = LEDGER_PATH, fit_checks: bool = True) -> list[str]:
    """What the repository's history says against the ledger (module docstring); [] when it holds."""
    out = []
    commits = git("rev-list", "--reverse", "HEAD", "--", ledger_path, cwd=cwd).split()
    added_in: list[str] = []  # the commit that first held line i
    for c in commits:
        text = show(c, ledger_path, cwd) or ""
        parents = git("rev-list", "--parents", "-n", "1", c, cwd=cwd).split()[1:]
        for p in parents:
            before = show(p, ledger_path, cwd) or ""
            if not text.startswith(before):
                out.append(f"commit {c[:10]} changes lines of {ledger_path} that {p[:10]} had (append only)")
        n = len(parse(text))
        added_in += [c] * max(0, n - len(added_in))
    head = show("HEAD", ledger_path, cwd) or ""
    path = cwd / ledger_path
    if path.exists() and not path.read_text().startswith(head):
        out.append(f"the working copy of {ledger_path} changes committed lines (append only)")
    for i, e in enumerate(parse(head)):
        c = e.get("commit", "")
        where = f"line {i + 1} ({e.get('key')})"
        if subprocess.run(["git", "cat-file", "-e", f"{c}^{{commit}}"], cwd=cwd, capture_output=True).returncode:
            out.append(f"{where}: its pricing commit {c[:10]} is not in the history")
            continue
        if i < len(added_in) and (c == added_in[i] or subprocess.run(
                ["git", "merge-base", "--is-ancestor", c, added_in[i]], cwd=cwd).returncode):
            out.append(f"{where}: priced at {c[:10]}, which does not precede the commit that added it")
        if fit_checks:
            out += [f"{where}: {p}" for p in _fit_at(c, e, cwd)]
    return out


_FIT_CACHE: dict = {}


def constants_paths() -> list[str]:
    """Where costmodel/fitted_constants.json lives in the repository, now and in earlier commits (it moves with
    costmodel.hardware)."""
    from partita.costmodel.hardware import FITTED_CONSTANTS
    try:
        now = [str(Path(FITTED_CONSTANTS).resolve().relative_to(ROOT.resolve()))]
    except ValueError:  # an installed partita: not in this checkout
        now = []
    return list(dict.fromkeys(now + ["costmodel/fitted_constants.json", "costmodel/hardware/fitted_constants.json"]))


def _fit_at(commit: str, entry: dict, cwd: Path) -> list[str]:
    """The constants in force at `commit` are the line's, and the fit that made them had not seen the row."""
    if commit not in _FIT_CACHE:
        constants = next((json.loads(text) for path in constants_paths() if (text := show(commit, path, cwd))), {})
        fit = json.loads(show(commit, "benchmarks/results/fit.json", cwd) or "{}")
        _FIT_CACHE[commit] = (constants.get("digest"), fit.get("digest"), set(fit.get("in_sample") or {}))
    digest, fit_digest, seen = _FIT_CACHE[commit]
    out = []
    if digest != entry.get("constants_digest"):
        out.append(f"the fitted constants at {commit[:10]} are {digest}, not the {entry.get('constants_digest')} "
                   "the line names")
    if fit_digest != digest:
        out.append(f"benchmarks/results/fit.json at {commit[:10]} is not the fit of its constants")
    if entry.get("key") in seen:
        out.append(f"the fit at {commit[:10]} had already seen the row")
    return out


# ---------------------------------------------------------------------------------------------------- add

def pending_rows(source: str) -> list:
    from benchmarks.published_data_first_contact import FIRST_CONTACT_ROWS
    return [r for r in FIRST_CONTACT_ROWS if r.table.source == source]


def check_can_add(source: str, entries: list[dict]) -> list:
    """The rows `add` would price; LedgerError saying why not."""
    from benchmarks.published import row_key
    from benchmarks.published_data import ROWS
    from benchmarks.published_data_first_contact import FIRST_CONTACT_ROWS
    from benchmarks.stack_rule import stack_for
    rows = pending_rows(source)
    if not rows:
        known = sorted({r.table.source for r in FIRST_CONTACT_ROWS})
        raise LedgerError(f"no rows of source {source!r} in benchmarks/published_data_first_contact.py "
                          f"(its sources: {', '.join(known) or 'none'}); write them there and commit first")
    fitted = {row_key(r) for r in ROWS}
    if source in {r.table.source for r in ROWS} or fitted & {row_key(r) for r in rows}:
        raise LedgerError(f"source {source!r} is already in the fit's data: its first contact is past")
    if any(e["source"] == source for e in entries):
        raise LedgerError(f"source {source!r} is already in {LEDGER_PATH}")
    for r in rows:
        if r.table.run is None or r.table.stack != stack_for(r.table.run):
            raise LedgerError(f"{row_key(r)}: its stack must be the one benchmarks.stack_rule assigns to its run facts")
    return rows


def add(source: str, path: Path = LEDGER, cwd: Path = ROOT) -> list[dict]:
    """Price `source`'s rows at HEAD and append them to the ledger (module docstring, step 2)."""
    from benchmarks.published import price
    from partita.costmodel.hardware import fitted_constants
    entries = read(path)
    problems = chain_problems(entries)
    if problems:
        raise LedgerError(f"{LEDGER_PATH} is broken ({problems[0]}); restore it from git before adding")
    rows = check_can_add(source, entries)
    dirty = uncommitted(cwd)
    if dirty:
        raise LedgerError(f"uncommitted changes to {', '.join(dirty[:3])}: commit them first, so the recorded "
                          "commit is what priced the rows")
    commit, digest, date = head_commit(cwd), fitted_constants()["digest"], time.strftime("%Y-%m-%d")
    graphs: dict = {}
    new = []
    for r in rows:
        new.append(entry_for(r, price(r, graphs), commit, digest, date))
        e = new[-1]
        err = "not priced" if e["error"] is None else f"{100 * e['error']:+.1f}%"
        print(f"  {e['key']:<70} measured {r.value:.4g}, predicted {e['predicted'] or float('nan'):.4g} ({err})",
              flush=True)
    return append(entries, new, path)


# ------------------------------------------------------------------------------------------------ figures

def first_lines(entries: list[dict]) -> list[dict]:
    """The first line of every key: its first contact."""
    seen, out = set(), []
    for e in entries:
        if e["key"] not in seen:
            seen.add(e["key"])
            out.append(e)
    return out


def _stats(errors: list[float]) -> dict:
    from benchmarks.common import p95
    a = sorted(abs(x) for x in errors)
    return {"priced": len(a), "median_abs_error": statistics.median(a) if a else None, "p95_abs_error": p95(a),
            "max_abs_error": a[-1] if a else None}


def summary(entries: list[dict] | None = None) -> dict:
    """The first-contact figures (module docstring)."""
    entries = first_lines(read() if entries is None else entries)
    by_source = defaultdict(list)
    for e in entries:
        by_source[e["source"]].append(e)
    per_source = {s: {"rows": len(es), **_stats([e["error"] for e in es if e["error"] is not None]),
                      "stacks": sorted({e["stack"] for e in es}), "commits": sorted({e["commit"][:10] for e in es}),
                      "dates": sorted({e["date"] for e in es})}
                  for s, es in by_source.items()}
    medians = [v["median_abs_error"] for v in per_source.values() if v["median_abs_error"] is not None]
    return {"rows": len(entries), "sources": len(per_source),
            **_stats([e["error"] for e in entries if e["error"] is not None]),
            "median_of_source_medians": statistics.median(medians) if medians else None,
            "not_priced": [{"key": e["key"], "reason": e["not_priced"], "memory_lifted": e["memory_lifted"]}
                           for e in entries if e["error"] is None],
            "per_source": per_source, "ledger": LEDGER_PATH}


# --------------------------------------------------------------------------------------------------- main

def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.first_contact", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    a = sub.add_parser("add", help="price a new source's rows and append them to the ledger")
    a.add_argument("source")
    sub.add_parser("verify", help="check the hash chain, the git history and the rows' identity")
    sub.add_parser("show", help="print the first-contact figures")
    args = ap.parse_args(argv)
    try:
        if args.command == "add":
            added = add(args.source)
            print(f"appended {len(added)} lines to {LEDGER_PATH}; commit it before admitting {args.source} to the fit")
            return 0
        if args.command == "verify":
            problems = chain_problems(read()) + history_problems() + identity_problems()
            for p in problems:
                print(p)
            print(f"{LEDGER_PATH}: {'OK' if not problems else f'{len(problems)} problems'}")
            return 1 if problems else 0
    except LedgerError as e:
        ap.exit(2, f"{ap.prog}: error: {e}\n")
    s = summary()
    print(f"first contact: {s['rows']} rows from {s['sources']} sources, {s['priced']} priced: median |error| "
          f"{_pct(s['median_abs_error'])}, p95 {_pct(s['p95_abs_error'])}, max {_pct(s['max_abs_error'])}; median "
          f"of per-source medians {_pct(s['median_of_source_medians'])}")
    for src, v in s["per_source"].items():
        print(f"  {src:<24} {v['rows']:>3} rows ({v['priced']} priced) median {_pct(v['median_abs_error'])}, "
              f"p95 {_pct(v['p95_abs_error'])}, max {_pct(v['max_abs_error'])}  {','.join(v['stacks'])}  "
              f"priced at {','.join(v['commits'])}")
    return 0


def identity_problems(entries: list[dict] | None = None) -> list[str]:
    """Rows whose configuration or measured value changed after their first contact, and rows of sources outside
    LEGACY_SOURCES that the fit reads without a ledger line."""
    from benchmarks.published import row_key
    from benchmarks.published_data import ROWS
    from benchmarks.published_data_first_contact import FIRST_CONTACT_ROWS
    entries = read() if entries is None else entries
    latest = {e["key"]: e for e in entries}
    out = []
    for r in FIRST_CONTACT_ROWS:
        e = latest.get(row_key(r))
        changed = identity_changes(e, r) if e is not None else []
        if changed:
            out.append(f"{row_key(r)}: its {', '.join(changed)} differ from its first-contact line")
    for r in ROWS:
        if r.table.source not in LEGACY_SOURCES and row_key(r) not in latest:
            out.append(f"{row_key(r)}: in the fit's data without a first-contact line ({LEDGER_PATH})")
    return out


if __name__ == "__main__":
    sys.exit(main())

"""benchmarks.first_contact: every new source is priced before the fit sees it, and what it was priced at stays
as committed.

The ledger in the repository is checked as it stands (its hash chain, the history of every commit that touched it,
the rows it records against the data); the machinery is checked on a throw-away git repository, where an edited
line must be caught."""
import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from benchmarks import first_contact as fc
from benchmarks import published_data_first_contact as pending
from benchmarks.published import row_key
from benchmarks.published_data import ROWS, TOKENS, Model, Row
from benchmarks.stack_rule import RunFacts

ROOT = Path(__file__).resolve().parents[2]


def _history_available() -> bool:
    r = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True)
    return r.returncode == 0 and r.stdout.strip() == "false"


# ------------------------------------------------------------------------------------ the committed ledger

def test_the_ledger_holds_the_first_contact_of_three_new_sources():
    entries = fc.read()
    assert fc.chain_problems(entries) == []
    first = fc.first_lines(entries)
    sources = {e["source"] for e in first}
    assert len(first) >= 40 and len(sources - fc.LEGACY_SOURCES) >= 3
    for e in first:
        assert e["stack"] == e["rule_stack"] and len(e["commit"]) == 40 and e["constants_digest"]
        assert (e["error"] is None) == (e["predicted"] is None)
        assert e["error"] is None or e["error"] == pytest.approx(e["predicted"] / e["measured"]["value"] - 1)


@pytest.mark.skipif(not _history_available(), reason="needs the repository's full git history (a shallow clone)")
def test_no_committed_line_of_the_ledger_was_edited_and_each_was_priced_before_the_fit_saw_it():
    assert fc.history_problems() == []


def test_every_row_the_fit_reads_outside_the_legacy_sources_was_priced_first_as_it_stands():
    assert fc.identity_problems() == []
    admitted = {r.table.source for r in ROWS} - fc.LEGACY_SOURCES
    assert admitted <= set(pending.ADMITTED)


def test_the_published_summary_reports_first_contact_beside_the_fits_errors():
    s = fc.summary()
    assert s["rows"] >= 40 and s["sources"] >= 3
    medians = sorted(v["median_abs_error"] for v in s["per_source"].values() if v["median_abs_error"] is not None)
    assert s["median_of_source_medians"] == pytest.approx(medians[len(medians) // 2] if len(medians) % 2
                                                          else (medians[len(medians) // 2 - 1] + medians[len(medians) // 2]) / 2)


# ------------------------------------------------------------------------ the machinery, on a scratch repo

TINY = Model(name="fc-tiny", family="gpt", layers=2, hidden=64, heads=4, vocab=256, attention="math")
RUN = RunFacts(framework="test", elementwise="fused", attention="math", torch="1.12")


def _tiny_rows(source: str = "fc-test") -> list[Row]:
    table = pending.ruled_table(RUN, source=source, citation="synthetic", metric=TOKENS)
    return [Row(table=table, model=TINY, seq=32, hardware="A100-80GB", gpus=8, dp=8, zero=(0,), micro_batch=2,
                global_batch=16 * (1 + i), recompute=("none",), value=1e5) for i in range(2)]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A git repository with one commit, and a source of two tiny rows waiting for first contact."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@t")
    _git(repo, "config", "user.name", "t")
    (repo / "data.txt").write_text("rows\n")
    _git(repo, "add", "data.txt")
    _git(repo, "commit", "-qm", "rows")
    monkeypatch.setattr(pending, "FIRST_CONTACT_ROWS", _tiny_rows())
    return repo


def test_add_prices_each_row_at_the_head_commit_and_chains_the_lines(scratch):
    ledger = scratch / fc.LEDGER_PATH
    added = fc.add("fc-test", path=ledger, cwd=scratch)
    assert [e["key"] for e in added] == [row_key(r) for r in pending.FIRST_CONTACT_ROWS]
    head = _git(scratch, "rev-parse", "HEAD").strip()
    for e in added:
        assert e["commit"] == head and e["stack"] == "megatron-2021" and e["rule_stack"] == "megatron-2021"
        assert e["error"] == pytest.approx(e["predicted"] / 1e5 - 1)
        assert e["identity"] == fc.identity_digest(next(r for r in pending.FIRST_CONTACT_ROWS
                                                        if row_key(r) == e["key"]))
    assert fc.chain_problems(fc.read(ledger)) == []
    # a second add of the same source is refused; so is a source with no rows
    with pytest.raises(fc.LedgerError, match="already in"):
        fc.add("fc-test", path=ledger, cwd=scratch)
    with pytest.raises(fc.LedgerError, match="no rows"):
        fc.add("no-such-source", path=ledger, cwd=scratch)


def test_add_refuses_to_price_what_head_does_not_hold(scratch):
    (scratch / "data.txt").write_text("rows edited, not committed\n")
    with pytest.raises(fc.LedgerError, match="uncommitted"):
        fc.add("fc-test", path=scratch / fc.LEDGER_PATH, cwd=scratch)


def test_add_refuses_a_source_the_fit_already_holds(monkeypatch):
    legacy = [dataclasses.replace(r, table=dataclasses.replace(r.table, run=RUN, stack="megatron-2021"))
              for r in ROWS if r.table.source == "megatron-sc21"]
    monkeypatch.setattr(pending, "FIRST_CONTACT_ROWS", legacy)
    with pytest.raises(fc.LedgerError, match="already in the fit"):
        fc.check_can_add("megatron-sc21", [])


def test_an_edited_error_breaks_the_chain_and_the_history(scratch):
    ledger = scratch / fc.LEDGER_PATH
    fc.add("fc-test", path=ledger, cwd=scratch)
    _git(scratch, "add", fc.LEDGER_PATH)
    _git(scratch, "commit", "-qm", "first contact")
    assert fc.history_problems(cwd=scratch, fit_checks=False) == []
    lines = ledger.read_text().splitlines()
    edited = json.loads(lines[0])
    edited["error"] = 0.01  # a kinder first contact
    ledger.write_text("\n".join([fc.canonical(edited)] + lines[1:]) + "\n")
    assert any("edited" in p for p in fc.chain_problems(fc.read(ledger)))
    assert any("working copy" in p for p in fc.history_problems(cwd=scratch, fit_checks=False))
    # rewriting every hash makes the chain whole again; the commit that does it is still caught
    entries = fc.read(ledger)
    ledger.write_text("")
    fc.append([], [{k: v for k, v in e.items() if k not in ("prev", "hash")} for e in entries], path=ledger)
    assert fc.chain_problems(fc.read(ledger)) == []
    _git(scratch, "commit", "-qam", "rechain")
    assert any("append only" in p for p in fc.history_problems(cwd=scratch, fit_checks=False))


def test_a_line_whose_pricing_commit_does_not_precede_it_is_not_first_contact(scratch):
    ledger = scratch / fc.LEDGER_PATH
    fc.add("fc-test", path=ledger, cwd=scratch)
    _git(scratch, "add", fc.LEDGER_PATH)
    _git(scratch, "commit", "-qm", "first contact")
    assert fc.history_problems(cwd=scratch, fit_checks=False) == []  # priced at the parent of the commit adding it
    # a commit on another branch (say, one where the rows were already fitted) named as the pricing commit
    main = _git(scratch, "rev-parse", "--abbrev-ref", "HEAD").strip()
    _git(scratch, "checkout", "-qb", "elsewhere")
    (scratch / "data.txt").write_text("fitted\n")
    _git(scratch, "commit", "-qam", "elsewhere")
    other = _git(scratch, "rev-parse", "HEAD").strip()
    _git(scratch, "checkout", "-q", main)
    late = _tiny_rows("fc-late")
    entries = [fc.entry_for(late[0], {"predicted": {"value": 1.0}, "error": 0.0}, other, "d", "2026-01-01"),
               fc.entry_for(late[1], {"predicted": {"value": 1.0}, "error": 0.0}, "0" * 40, "d", "2026-01-01")]
    fc.append(fc.read(ledger), entries, path=ledger)
    _git(scratch, "commit", "-qam", "late")
    problems = fc.history_problems(cwd=scratch, fit_checks=False)
    assert any("does not precede" in p for p in problems) and any("not in the history" in p for p in problems)
    assert fc.chain_problems(fc.read(ledger)) == []  # the chain alone cannot tell


def test_a_row_changed_after_its_first_contact_is_named(scratch, monkeypatch):
    ledger = scratch / fc.LEDGER_PATH
    entries = fc.add("fc-test", path=ledger, cwd=scratch)
    assert not any("differ" in p for p in fc.identity_problems(entries))
    changed = [dataclasses.replace(pending.FIRST_CONTACT_ROWS[0], value=2e5)] + pending.FIRST_CONTACT_ROWS[1:]
    monkeypatch.setattr(pending, "FIRST_CONTACT_ROWS", changed)
    assert any("measured differ from its first-contact line" in p for p in fc.identity_problems(entries))
    # a configuration field the data model gains later is not a change of the row
    entries[1]["config"].pop("schedule")
    monkeypatch.setattr(pending, "FIRST_CONTACT_ROWS", changed[1:])
    assert not any("differ" in p for p in fc.identity_problems(entries))
    # but a recorded field that changes is
    monkeypatch.setattr(pending, "FIRST_CONTACT_ROWS", [dataclasses.replace(changed[1], micro_batch=1)])
    assert any("config.micro_batch" in p for p in fc.identity_problems(entries))


def test_a_refused_add_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        fc.main(["add", "no-such-source"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err and err.startswith("python -m benchmarks.first_contact: error: no rows")

"""The READMEs' benchmark figures are what benchmarks/results/*.json render (`python -m benchmarks.report`):
a number typed into a generated section, or a results file rewritten without rerunning the report, fails
here. No benchmark runs; this reads the JSON files only."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import report  # noqa: E402


def test_readmes_match_the_results_files():
    found = report.problems(ROOT, report.load(ROOT / "benchmarks" / "results"))
    assert not found, "; ".join(found) + " -- run python -m benchmarks.report"


def _published(error: float) -> dict:
    row = {"key": "src-x/model-y", "source": "src-x", "model": "model-y", "hardware": "H100-80GB", "gpus": 8,
           "config": {}, "measured": {"metric": "tokens_per_s_per_gpu", "value": 1000.0},
           "predicted": {"metric": "tokens_per_s_per_gpu", "value": 1000.0 * (1 + error)}, "error": error}
    unpriced = {**row, "key": "src-x/too-big", "predicted": None, "error": None, "predicted_if_memory_unbounded": {}}
    return {"commit": "abc1234", "machine": {"date": "2026-01-02", "cpus": 2}, "rows": [row, unpriced],
            "summary": {"targets": {"median_abs_error": 0.10, "max_abs_error": 0.25, "met": False}}}


def test_the_renderer_puts_the_results_values_into_the_section():
    text = report.render("published", {"published": _published(0.1234)})
    assert "| src-x |  | 1 / 2 |  | n/a | 12.3% / 12.3% |" in text  # per-source row, computed where the summary lacks it
    assert "`src-x/model-y`: measured 1000 tokens/s per GPU, predicted 1123 (+12.3%)" in text
    assert "1 of the 2 rows" in text and "not priced" in text and "commit abc1234" in text
    assert "No held-out errors" in text  # no benchmarks.fit results for these constants
    assert report.render("published", {"published": None}).startswith("No results yet")


def test_the_headline_is_the_held_out_error_and_its_verdicts():
    d = _published(0.05)
    held = {"priced": 1, "median_abs_error": 0.083, "p95_abs_error": 0.214, "max_abs_error": 0.214}
    d["summary"] = {"targets": {"median_abs_error": 0.10, "p95_abs_error": 0.20}, "held_out": {"all": held},
                    "per_source": {"src-x": {"count": 2, "priced": 1, "median_abs_error": 0.05, "max_abs_error": 0.05,
                                             "stacks": ["te-2024"], "held_out": held}},
                    "rows": 2, "priced": 1, "median_abs_error": 0.05, "max_abs_error": 0.05}
    text = report.render("published", {"published": d})
    assert "| src-x | te-2024 | 1 / 2 |  | 8.3% / 21.4% / 21.4% | 5.0% / 5.0% |" in text
    text = " ".join(text.split())  # paragraphs are wrapped
    assert "Held out, over 1 rows" in text and "median |error| 8.3% (target <= 10%: met)" in text
    assert "p95 21.4% (target <= 20%: not met)" in text and "In-sample (constants fitted with every source)" in text
    assert "derived by the fit's stated rules" not in text  # every constant of src-x was fitted in its fold
    held["unseen"] = ["e_attn:ampere/triton-2023", "h_seq:ampere/flash_triton"]
    text = " ".join(report.render("published", {"published": d}).split())
    assert "not fitted: src-x: e_attn:ampere/triton-2023, h_seq:ampere/flash_triton." in text
    held["seen"] = {"priced": 1, "median_abs_error": 0.031, "p95_abs_error": 0.072, "max_abs_error": 0.09}
    text = " ".join(report.render("published", {"published": d}).split())
    assert ("Over the 1 rows priced only with constants that other sources measure too, the held-out median "
            "|error| is 3.1%, p95 7.2%, max 9.0%.") in text


def test_the_readme_leads_with_first_contact_beside_held_out_and_in_sample_per_row_and_per_source():
    d = _published(0.05)
    held = {"priced": 1, "median_abs_error": 0.083, "p95_abs_error": 0.214, "max_abs_error": 0.214,
            "median_of_source_medians": 0.07}
    first = {"rows": 3, "priced": 3, "sources": 2, "median_abs_error": 0.047, "p95_abs_error": 0.275,
             "max_abs_error": 0.29, "median_of_source_medians": 0.061, "ledger": "benchmarks/data/first_contact.jsonl",
             "per_source": {"src-x": {"rows": 2, "priced": 2, "median_abs_error": 0.041, "max_abs_error": 0.1,
                                      "stacks": ["flash1-2022"], "commits": ["cba07c9efd"]},
                            "src-new": {"rows": 1, "priced": 1, "median_abs_error": 0.098, "max_abs_error": 0.098,
                                        "stacks": ["megatron-2021"], "commits": ["cba07c9efd"]}}}
    d["summary"] = {"held_out": {"all": held}, "first_contact": first, "rows": 2, "priced": 1, "sources": 2,
                    "median_abs_error": 0.05, "p95_abs_error": 0.05, "max_abs_error": 0.05,
                    "median_of_source_medians": 0.05,
                    "per_source": {"src-x": {"count": 2, "priced": 1, "median_abs_error": 0.05, "max_abs_error": 0.05,
                                             "stacks": ["flash1-2022"], "held_out": held,
                                             "first_contact": first["per_source"]["src-x"]}}}
    text = report.render("published", {"published": d})
    lines = text.splitlines()
    first_table = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    assert lines[first_table + 2].startswith("| **first contact**") and "| 3 / 2 | 4.7% | 27.5% | 6.1% |" in text
    assert "| held out (leave-one-source-out, all sources) | 1 / 2 | 8.3% | 21.4% | 7.0% |" in text
    assert "| src-x | flash1-2022 | 1 / 2 | 4.1% / 10.0% | 8.3% / 21.4% / 21.4% | 5.0% / 5.0% |" in text
    assert "src-new 9.8% over 1 row (megatron-2021, priced at cba07c9efd)" in " ".join(text.split())


def test_the_fits_convergence_and_defects_are_reported():
    d = {"commit": "abc1234", "machine": {"date": "2026-01-02"},
         "convergence": {"converged": True, "iterations": 6, "tolerance": 0.005, "largest_move": 0.0031,
                         "moved": "e_attn:hopper/te-2024-flash2"},
         "defects": {"band": [0.5, 1.2], "defects": [
             {"param": "e_attn:hopper/te-2024-flash2", "value": 0.154, "kind": "outside what kernel timings allow",
              "kernel": "hopper/flash2", "measured": [{"level": 0.345, "measured_by": "h200"}, {"level": 0.398,
                                                                                               "measured_by": "chart"}],
              "allowed": [0.1725, 0.4776], "fitted_by": ["dgxc-benchmarking"]},
             {"param": "h_seq:ampere/flash1", "value": 1.0, "kind": "at the fit's bound", "bound": 1.0,
              "fitted_by": ["published kernel charts"]}],
             "unbounded": [{"param": "e_gemm:ampere/megatron-2021", "value": 0.66, "kernel": "ampere/gemm"}]}}
    text = " ".join(report.render("kernels", {"fit": d}).split())
    assert "converged in 6 iterations" in text and "more than 0.31% (e_attn:hopper/te-2024-flash2" in text
    assert ("`e_attn:hopper/te-2024-flash2` = 0.154: allowed 0.172-0.478 (hopper/flash2 measured 0.345, 0.398); "
            "fitted by dgxc-benchmarking") in text
    assert "`h_seq:ampere/flash1` = 1.000: at the bound 1" in text
    assert "nothing bounds them: `e_gemm:ampere/megatron-2021` = 0.660" in text


def test_a_memory_miss_is_listed_with_the_time_model_error_when_memory_is_lifted():
    d = _published(0.05)
    d["rows"][1]["predicted_if_memory_unbounded"] = {"metric": "tokens_per_s_per_gpu", "value": 870.0,
                                                     "error": -0.13, "peak_memory_gib": 150.2,
                                                     "capacity_gib": 77.6}
    text = report.render("published", {"published": d})
    assert ("`src-x/too-big`: with memory lifted its fastest plan peaks at 150 of 78 GiB; measured 1000 "
            "tokens/s per GPU, predicted 870 (-13.0%)") in text
    assert "memory model rejects" not in report.render("published", {"published": _published(0.05)})


def test_a_published_peak_memory_is_set_beside_the_predicted_one():
    d = _published(0.05)
    d["rows"][0]["measured_memory"] = {"gib": 67.0, "reading": "peak reserved bytes", "kind": "reserved",
                                       "predicted_peak_gib": 56.55, "error": 56.55 / 67.0 - 1}
    text = report.render("published", {"published": d})
    assert "the published figure reads peak reserved bytes" in " ".join(text.split())
    assert "`src-x/model-y`: measured 67.0 GiB reserved, predicted 56.5 GiB (-15.6%)" in text
    assert "Peak memory" not in report.render("published", {"published": _published(0.05)})


def test_a_compiled_row_is_set_beside_its_eager_run_with_both_gains():
    d = _published(0.05)
    compiled = {**d["rows"][0], "key": "src-x/model-y/compiled", "config": {"kernels": "compiled"},
                "measured": {"metric": "tokens_per_s_per_gpu", "value": 1200.0},
                "predicted": {"metric": "tokens_per_s_per_gpu", "value": 1150.0}, "error": 1150.0 / 1200.0 - 1}
    d["rows"].append(compiled)
    text = report.render("published", {"published": d})
    assert ("`src-x/model-y/compiled`: measured 1200, predicted 1150 (-4.2%); over the eager run, measured "
            "+20.0%, predicted +9.5%") in text
    assert "torch.compile" not in report.render("published", {"published": _published(0.05)})


def test_table1_quotes_the_plans_exposed_communication():
    d = report.load(ROOT / "benchmarks" / "results")["table1"]
    shares = [r["plan"]["exposed_comm_s"] / r["plan"]["step_time_s"] for r in d["rows"]]
    text = report.render("table1", {"table1": d})
    assert (f"exposed communication is {report.pct(min(shares))}-{report.pct(max(shares))} of the plans' "
            "predicted") in " ".join(text.split())
    assert "fully overlapped" not in text


def test_check_names_a_section_whose_number_was_retyped(tmp_path, monkeypatch, capsys):
    for readme in report.READMES:
        (tmp_path / readme).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / readme, tmp_path / readme)
    readme = tmp_path / "docs" / "benchmarks.md"
    body = report.sections(readme.read_text())["runtime_overhead"]
    readme.write_text(readme.read_text().replace(body, body.replace("Target <=", "Target <= 9", 1)))
    monkeypatch.setattr(report, "ROOT", tmp_path)
    assert report.main(["--check"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "docs/benchmarks.md: section runtime_overhead differs" in err
    assert report.main([]) == 0 and report.main(["--check"]) == 0  # rewriting restores it
    assert readme.read_text() == (ROOT / "docs" / "benchmarks.md").read_text()


def test_a_missing_or_repeated_marker_is_reported(tmp_path):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "docs").mkdir()
    block = f"{report.START.format('run_all')}\nx\n{report.END.format('run_all')}\n"
    (tmp_path / "README.md").write_text("no markers\n")
    for page in ("benchmarks.md", "plans.md", "clusters.md", "sync-modes.md"):
        (tmp_path / "docs" / page).write_text("no markers\n")
    (tmp_path / "benchmarks" / "README.md").write_text(block + block)
    found = report.problems(tmp_path, {})
    assert any("docs/benchmarks.md: section table1 has no markers" in p for p in found)
    assert any("section run_all appears twice" in p for p in found)


@pytest.mark.parametrize("name", list(report.RENDERERS))
def test_every_section_renders_from_the_results_files(name):
    assert report.render(name, report.load(ROOT / "benchmarks" / "results")).strip()


def test_the_published_kernel_timings_show_their_in_sample_and_held_out_errors():
    s = lambda m: {"priced": 24, "median_abs_error": m, "p95_abs_error": 2 * m, "max_abs_error": 3 * m}  # noqa: E731
    fit = {"commit": "abc1234", "kernel_rows": {}, "published_kernels": {"summary": {
        "in_sample": {"all": s(0.05), "per_group": {"ampere/triton-2023": s(0.05)}},
        "loso": {"all": s(0.4), "per_group": {"ampere/triton-2023": s(0.4)}}}}}
    text = report.kernels({"fit": fit})
    assert "| ampere/triton-2023 | 24 | 5.0% / 15.0% | 40.0% / 80.0% / 120.0% |" in text
    assert "in-sample median |error| 5.0%, max 15.0%" in text and "alone" in text and "median 40.0%, max 120.0%" in text
    assert "Published attention-kernel timings" not in report.kernels({"fit": {**fit, "published_kernels": {}}})

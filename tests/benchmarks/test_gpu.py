"""benchmarks.gpu on a machine without a GPU: the set it plans for a GPU (an H200: the driver is faked, the
planner and solver are real), the shipped plans, the rows it writes from real `partita run` output on this
CPU (a tiny plan that runs; a plan that runs out of memory under a memory limit), and its one line without
CUDA."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import common, gpu, report  # noqa: E402
from benchmarks.gpu_plans import CASES, LLAMA3_8B_SHAPE, PRESETS, UNSEEN, Case, Planned, plan_case, read_plans  # noqa: E402
from partita.costmodel.errors import InfeasibleError  # noqa: E402
from partita.costmodel.hardware import DEVICES, gpu_preset  # noqa: E402

TINY = Case("tiny", "a tiny GPT", "gpt:layers=2,hidden=64,heads=2,seq=32,vocab=256", 4)


def test_without_cuda_it_says_so_in_one_line(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu.main([]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("benchmarks.gpu: no CUDA device here") and out.out.count("\n") == 1 and not out.err


def test_it_plans_the_set_for_the_local_h200(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index=0: SimpleNamespace(total_memory=143771 * 2**20))
    preset = gpu_preset(*gpu.local_gpu())
    assert preset == "H200-141GB"
    planned, plans = gpu.plans_for(preset)  # the solver is installed here: planned afresh
    assert plans["source"] == "made here"
    by = {p.case.name: p.plan for p in planned}
    assert list(by) == [c.name for c in CASES + UNSEEN] + ["largest"]
    # llama3-8b trained under autocast keeps 16 bytes of fp32 model states a parameter (120 GiB): beside the
    # allocator's headroom its activations fit only by going to host memory (the plan once chosen without
    # the headroom ran out of memory on a real H200, GPU-MEASUREMENTS.md)
    assert any(b.offload_activations for b in by["llama3-8b-auto"].blocks)
    assert all(by.values())
    for p in by.values():
        assert p.cluster["device"] == preset and p.mesh.world_size == 1 and p.train["dtype"] == "bf16"
    layers = lambda p: [b for b in p.blocks if b.fqn.startswith("blocks.")]  # noqa: E731
    assert {b.recompute for b in layers(by["m1-no-recompute"])} == {"none"}
    assert {b.recompute for b in layers(by["m1-full-recompute"])} == {"full"}
    assert by["m1-micro-batch-2"].schedule.micro_batch_size == 2
    assert by["m1-compiled"].kernels == "compiled" and by["m1-auto"].kernels == "eager"
    # the largest: llama3-8b's layers, as many as fit on an H200 (more than its 32: offloading activations to
    # host memory), and one layer more does not
    largest = next(p.case for p in planned if p.case.name == "largest")
    n = by["largest"].model["config"]["layers"]
    assert 32 <= n < 64 and largest.model == LLAMA3_8B_SHAPE.format(layers=n)
    with pytest.raises(InfeasibleError):
        plan_case(Case("more", "", LLAMA3_8B_SHAPE.format(layers=n + 1), 4), preset)


def test_the_shipped_plans_are_the_set():
    """What a GPU machine without the solver runs: every case of CASES (and the largest), for each lent GPU."""
    for preset in PRESETS:
        planned, index = read_plans(preset)
        assert index["preset"] == preset and index["commit"]
        assert [p.case for p in planned[:len(CASES)]] == list(CASES) and planned[-1].case.name == "largest"
        for p in planned:
            assert (p.plan is None) == bool(p.infeasible)
            if p.plan is not None:
                assert p.plan.cluster["device"] == preset
                pred = p.plan.predicted  # each stage's peak within what the allocator's predicted cache leaves
                assert all(row["total"] <= cap < DEVICES[preset].usable_memory() for row, cap in
                           zip(pred["memory_per_stage"], pred["memory_capacity_per_stage"]))
    # 8B parameters of Adam states under autocast (120 GiB) do not fit one 80 GB GPU; on a 141 GB one they do. M1 at
    # 32k tokens does not either: its logits (32,768 x 128,256 in bf16, 7.8 GiB) leave the allocator a cache of that
    # size beside a peak that already holds them in fp32 and their gradient
    refused = {preset: [p.case.name for p in read_plans(preset)[0] if p.plan is None] for preset in PRESETS}
    assert refused == {"H100-80GB": ["m1-seq-32k", "llama3-8b-auto"], "H200-141GB": []}
    # what a lent machine's torch cannot run is never shipped (benchmarks.gpu_plans.LENT_TORCH)
    for preset in PRESETS:
        assert not any(b.offload_activations and b.recompute in ("selective", "op")
                       for p in read_plans(preset)[0] if p.plan is not None for b in p.plan.blocks)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny plan for one CPU rank, run by run_case: `partita run` in a subprocess, as on a GPU."""
    work = tmp_path_factory.mktemp("gpu")
    planned = Planned(TINY, plan_case(TINY, "cpu"))
    row = gpu.run_case(planned, steps=3, workdir=work)
    return planned, row, json.loads((work / "tiny.out.json").read_text())


def test_a_run_becomes_its_row(tiny_run):
    planned, row, out = tiny_run
    assert row["returncode"] == 0 and row["oom"] is False and row["error"] is None, row
    m, pred = row["measured"], planned.plan.predicted
    # the run takes a 4th step under the profiler: left out of the mean (steps 2-3), its operators kept
    assert len(out["step_times_s"]) == 4 and m["step_times_s"] == out["step_times_s"][:3]
    assert m["step_time_s"] == pytest.approx(sum(out["step_times_s"][1:3]) / 2)
    assert m["peak_allocated_bytes"] == out["peak_memory_bytes"] and m["losses"] == out["losses"]
    prof = row["profile"]
    assert prof["time"] == "cpu" and 0 < len(prof["ops"]) <= gpu.PROFILE_TOP
    assert any(o["name"] in ("aten::mm", "aten::addmm") and o["calls"] > 0 for o in prof["ops"])
    assert "peak_reserved_bytes" in out and m["peak_reserved_bytes"] is None  # the runtime's figure: CUDA only
    assert row["predicted"]["step_time_s"] == pred["step_time_s"]
    assert row["predicted"]["peak_memory_bytes"] == pred["peak_memory_bytes"]
    assert row["step_time_error"] == pytest.approx((pred["step_time_s"] - m["step_time_s"]) / m["step_time_s"])
    assert row["memory_error"] == pytest.approx((pred["peak_memory_bytes"] - out["peak_memory_bytes"])
                                                / out["peak_memory_bytes"])
    assert row["plan"]["mesh"]["tp"] == 1 and row["plan"]["micro_batch"] * row["plan"]["num_microbatches"] == 4


def test_the_rows_are_written_and_rendered(tiny_run, tmp_path, monkeypatch):
    _, row, _ = tiny_run
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    path = gpu.write_results([row], {"name": "a CPU", "memory_bytes": 2**30, "preset": "cpu"},
                             {"source": "made here", "commit": "abc1234"}, steps=3)
    d = json.loads(path.read_text())
    assert path.name == "gpu.json" and d["rows"] == [json.loads(json.dumps(row))] and d["steps"] == 3
    assert d["summary"]["ran"] == 1 and d["summary"]["oom"] == 0
    text = report.render("gpu", {"gpu": d, report.GPU_SHARED: report.load()[report.GPU_SHARED]})
    assert "| `tiny` | no | a tiny GPT |" in text and f"{row['measured']['step_time_s']:.3f} s" in text
    assert "GPU-MEASUREMENTS" not in text  # a run's own results replace the shared measurements
    assert "one step more under the profiler (`partita run --profile-out`), left out of the mean" in " ".join(text.split())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="bash's ulimit -v limits the address space on Linux")
def test_an_out_of_memory_run_is_an_oom_row(tmp_path):
    """A run that cannot allocate its model: `partita run` under a 1.6 GB address-space limit (torch imports
    in ~0.8 GB), on a model whose embedding alone takes 2 GB. result_row reads the run's real output."""
    case = Case("oom", "a 2M-token vocabulary", "gpt:layers=1,hidden=256,heads=2,seq=16,vocab=2000000", 2)
    planned = Planned(case, plan_case(case, "H200-141GB"))
    planned.plan.save(tmp_path / "plan.json")
    run = (f"ulimit -v 1600000; exec {sys.executable} -m partita.cli run {tmp_path / 'plan.json'} "
           f"--model {case.model} --steps 2 --losses-out {tmp_path / 'out.json'}")
    proc = subprocess.run(["bash", "-c", run], capture_output=True, text=True, cwd=ROOT, timeout=300)
    row = gpu.result_row(planned, proc.returncode, proc.stdout + proc.stderr, None)
    assert row["oom"] is True and row["measured"] is None, proc.stderr
    assert row["error"].startswith("partita: error: rank 0:") and "can't allocate memory" in row["error"]
    assert row["error"] in row["output_tail"]  # the run's last words are kept (a run that timed out: how far it got)
    assert row["predicted"]["peak_memory_bytes"] == planned.plan.predicted["peak_memory_bytes"]


def test_reprice_predicts_the_same_plan_again_and_names_a_changed_choice(tiny_run):
    """`--reprice` plans each measured case again at this commit: the same choices give a new prediction
    against the same measurement; a different choice is named and not priced (a new plan was not run)."""
    planned, row, _ = tiny_run
    row = json.loads(json.dumps({**row, "model": TINY.model}))
    moved = json.loads(json.dumps(row))
    moved["name"], moved["plan"]["micro_batch"] = "moved", row["plan"]["micro_batch"] + 7
    result = gpu.reprice({"gpu": {"preset": "cpu"}, "rows": [row, moved]})
    same, other = (r["repriced"] for r in result["rows"])
    assert same["same_plan"] and same["changed"] is None
    assert same["step_time_s"] == pytest.approx(row["predicted"]["step_time_s"], rel=1e-6)
    assert same["step_time_error"] == pytest.approx(row["step_time_error"], rel=1e-6, abs=1e-9)
    assert not other["same_plan"] and other["changed"] == "micro_batch" and "step_time_s" not in other


def test_rerunning_some_cases_keeps_the_other_cases_rows_of_the_same_gpu():
    earlier = {"gpu": {"preset": "H200-141GB"}, "commit": "abc1234", "machine": {"date": "2026-11-26"}, "steps": 6,
               "rows": [{"name": "a", "step_time_error": 0.1}, {"name": "b", "step_time_error": 0.2}]}
    new = [{"name": "b", "step_time_error": 0.05}]
    got = gpu.with_earlier_rows(new, earlier, "H200-141GB", ["a", "b", "c"])
    assert [r["name"] for r in got] == ["a", "b"] and got[1] is new[0] and "earlier_run" not in got[1]
    assert got[0]["earlier_run"] == {"commit": "abc1234", "date": "2026-11-26", "plans_commit": None}
    assert got[0]["step_time_error"] == 0.1
    assert got[0]["steps"] == 6  # the earlier run's, whatever this run's --steps
    assert gpu.with_earlier_rows(new, earlier, "H100-80GB", ["a", "b"]) == new  # another GPU's rows are not kept
    assert gpu.with_earlier_rows(new, None, "H200-141GB", ["a", "b"]) == new


def test_a_plan_that_runs_alike_an_earlier_case_is_measured_once():
    """M1's own choice is no recompute: its two plan files differ only in the solver's record, so the second
    case takes the first's measurement, says so, and keeps its own case and plan summary."""
    by = {p.case.name: p for p in read_plans("H200-141GB")[0]}
    auto, none, full = by["m1-auto"], by["m1-no-recompute"], by["m1-full-recompute"]
    assert gpu.same_run(auto.plan, none.plan) and not gpu.same_run(auto.plan, full.plan)
    assert not gpu.same_run(auto.plan, None)
    ran = {**gpu.result_row(auto, 0, "", None), "measured": {"step_time_s": 0.7}, "step_time_error": 0.01,
           "returncode": 0, "error": None}
    row = gpu.measured_as(ran, none)
    assert row["name"] == "m1-no-recompute" and row["measured_with"] == "m1-auto"
    assert row["measured"] == {"step_time_s": 0.7} and row["step_time_error"] == 0.01
    assert gpu._line(row).endswith("the same plan as m1-auto: measured once")


def test_a_budget_starts_no_case_the_time_left_cannot_hold(tmp_path, monkeypatch, capsys):
    """--budget-s: cases of 100 s each (a stood-in run and clock) under 250 s: two run, the third is left and named
    in the line that runs it; the file holds the two rows that ran."""
    by = {p.case.name: p for p in read_plans("H200-141GB")[0]}
    planned = [by[n] for n in ("m1-auto", "m1-full-recompute", "m1-micro-batch-2")]
    clock = [0.0]
    monkeypatch.setattr(gpu.time, "perf_counter", lambda: clock[0])

    def run_case(p, steps, workdir, timeout):
        clock[0] += 100.0
        return {**gpu.result_row(p, 1, "partita: error: stood in", None), "steps": steps}
    monkeypatch.setattr(gpu, "run_case", run_case)
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    args = SimpleNamespace(only=None, budget_s=250.0, steps=6, timeout=300.0)
    path = gpu.run_set(planned, args, None, {"name": "H200", "memory_bytes": 1.0, "preset": "H200-141GB"},
                       {"source": "test"})
    assert [r["name"] for r in json.loads(path.read_text())["rows"]] == ["m1-auto", "m1-full-recompute"]
    assert capsys.readouterr().out.strip().endswith("python -m benchmarks.gpu --only m1-micro-batch-2")

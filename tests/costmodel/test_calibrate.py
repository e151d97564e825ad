"""`partita calibrate`: a quick run on 2 gloo ranks writes a resource list that parse_cluster loads, and
its all-reduce figures agree with a direct timing of dist.all_reduce taken here."""
import contextlib
import dataclasses
import io
import json
import os
import statistics
import tempfile
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from partita.costmodel import calibrate

from partita.costmodel.calibrate import fit as calibrate_fit, links as calibrate_links

from partita.costmodel.price import comm
from partita.costmodel.hardware import parse_cluster
from tests.runtime.spawned import teardown

SIZES = (2**20, 2**22, 2**24)  # 1-16 MiB: milliseconds, steadier than tiny messages on a busy machine


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("cal") / "cluster.json")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        # (--force: the suite's other workers keep the machine busy; the refusal is tested below)
        assert calibrate.main(["--out", path, "--ranks", "2", "--quick", "--force"]) == 0
    return path, out.getvalue()


def _direct_worker(rank, world, init_file, sizes, result_path):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(init_file, world), rank=rank, world_size=world)
    medians = []
    for nbytes in sizes:
        x = torch.ones(nbytes // 4)
        dist.all_reduce(x)
        rounds = []
        for _ in range(3):  # the least of 3 medians: a busy machine only ever adds time (one median each, in a CI
            times = []      # run beside other work: 7.9 ms for 1 MiB and 4 MiB alike, the median ratio 0.32 < 1/3)
            for _ in range(8):
                dist.barrier()  # both ranks start together: the time is the collective's, not the skew's
                t0 = time.perf_counter()
                dist.all_reduce(x)
                times.append(time.perf_counter() - t0)
            rounds.append(statistics.median(times))
        medians.append(min(rounds))
    t = torch.tensor(medians, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump(t.tolist(), f)
    teardown()  # every rank's collectives done before any tears down


def _direct_all_reduce_seconds(sizes) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "t.json")
        old = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"
        try:
            mp.start_processes(_direct_worker, args=(2, os.path.join(tmp, "store"), list(sizes), result), nprocs=2,
                               join=True, start_method="spawn")
        finally:
            os.environ.pop("OMP_NUM_THREADS") if old is None else os.environ.__setitem__("OMP_NUM_THREADS", old)
        with open(result) as f:
            return json.load(f)


def test_quick_calibration_writes_a_loadable_resource_list(calibrated):
    path, printed = calibrated
    cluster = parse_cluster(path)
    assert (cluster.nodes, cluster.devices_per_node, cluster.num_devices) == (1, 2, 2)
    d = cluster.device
    assert d.name == "cpu" and d.peak("fp32") > 1e9 and d.peak("bf16") > 1e8
    assert 0 < d.matmul_efficiency <= 1 and d.mem_bandwidth > 1e8 and d.intra_node_bw > 1e6
    assert 0 <= d.intra_node_latency < 0.1 and d.usable_memory() > 0
    raw = json.loads(open(path).read())
    m = raw["measurements"]
    assert m["backend"] == "gloo" and m["ranks"] == 2 and m["quick"] is True
    assert {"matmul", "memory_copy", "collectives", "fits"} <= set(m)
    assert set(m["collectives"]) == {*calibrate_links.COLLECTIVES, "p2p"}
    # the in-step and DTensor overheads (benchmarks/fidelity.py): measured, and on this CPU not negligible
    assert 0 < d.sync_latency < 0.1 and 0 < d.sharded_op_latency < 0.1
    assert 0 <= d.sharded_param_latency < 0.1 and 0 <= d.redistribute_latency < 0.1
    rows = m["in_step_collectives"]
    assert {r["ranks"] for r in rows["all_reduce"]} == {2} and len(rows["p2p"]) == 1
    # one timing is a difference of two loops' wall times and may be ~0 under load: calibrate retries, and
    # what it records is a positive cost or None (too noisy), never an impossible negative figure
    timed = [r["in_step_s"] for kind_rows in rows.values() if isinstance(kind_rows, list) for r in kind_rows]
    assert len(timed) > len(rows["all_reduce"]) + len(rows["p2p"])  # the warning counts every kind's rows
    assert all(t is None or t > 0 for t in timed)
    # how many are too noisy depends on the machine's load (all of them at a load of 5, once): never silently
    assert ("too noisy to measure" in printed) == (None in timed), printed
    assert d.sync_latency == pytest.approx(calibrate_fit.sync_latency(rows, m["fits"]))
    assert {"op_latency_s", "param_latency_s", "redistribute_latency_s", "redistribute"} <= set(m["dtensor"])
    assert m["wall_time_s"] > 0  # recorded; how long a quick calibration takes is benchmarks' to time (no
    # timed assertion in a unit test: it failed at 30.8 s under a load of 4, issue 44)
    assert "matmul fp32" in printed and "all_reduce" in printed and path in printed


def test_measured_all_reduce_agrees_with_a_direct_timing(calibrated):
    path, _ = calibrated
    cluster = parse_cluster(path)
    measured = {p["bytes"]: p["seconds"] for p in json.loads(open(path).read())["measurements"]["collectives"]
                ["all_reduce"] if p["ranks"] == 2}
    direct = _direct_all_reduce_seconds(SIZES)
    # the median ratio over three sizes, so that one disturbed timing on a shared machine does not decide
    ratios = sorted(measured[b] / t for b, t in zip(SIZES, direct))
    assert 1 / 3 < ratios[1] < 3, (ratios, direct)
    # the fitted device predicts them through the cost model as well (back to back, as timed here: the
    # in-step sync_latency aside)
    cluster = dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, sync_latency=0.0))
    group = comm.group_for(cluster, 2, 1)
    ratios = sorted(comm.all_reduce(cluster, group, b) / t for b, t in zip(SIZES, direct))
    assert 1 / 3 < ratios[1] < 3, (ratios, direct)


def test_fit_recovers_alpha_and_beta():
    alpha, beta = 50e-6, 2e9
    pts = [{"ranks": k, "bytes": b, "seconds": 2 * (k - 1) * alpha + 2 * (k - 1) / k * b / beta}
           for k in (2, 3, 4) for b in (1e3, 1e5, 1e7)]
    f = calibrate_fit.fit_alpha_beta("all_reduce", pts)
    assert f["alpha_s"] == pytest.approx(alpha) and f["beta_bytes_per_s"] == pytest.approx(beta)
    assert f["rel_rms_error"] < 1e-9
    # latency-free data: alpha clamps at 0, not negative
    f = calibrate_fit.fit_alpha_beta("p2p", [{"ranks": 2, "bytes": b, "seconds": b / beta * (1.1 if b > 1e4 else 0.9)}
                                         for b in (1e3, 1e5, 1e7)])
    assert f["alpha_s"] >= 0 and f["beta_bytes_per_s"] > 0


def test_too_few_ranks_is_a_user_error(tmp_path, capsys):
    assert calibrate.main(["--out", str(tmp_path / "c.json"), "--ranks", "1"]) == 2
    assert "at least 2 ranks" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()


def test_default_ranks():
    assert 2 <= calibrate.default_ranks() <= 4


def test_the_summary_says_why_the_written_peak_is_below_the_printed_one():
    """Issue 30 item 12: the summary printed a 179 GFLOP/s peak and the file held 31 without a word; the file's
    figure is each rank's share when all ranks compute at once."""
    m = {"matmul": {"fp32": [{"n": 256, "flops_per_s": 1.2e11}, {"n": 512, "flops_per_s": 1.79e11}]},
         "compute_share_per_rank": 0.175, "ranks": 4, "concurrent_matmul": {"n": 512, "flops_per_s": 3.1e10}}
    dev = {"peak_flops": {"fp32": 1.79e11 * 0.175, "bf16": 1e10}}
    assert calibrate.peak_line(m, dev) == (
        "  written peak_flops fp32: 31.3 GFLOP/s per rank = the one-rank peak 179.0 x 0.17, each rank's share when "
        "all 4 ranks compute at once (measured: 31.0 GFLOP/s per rank side by side)")


def test_quick_promises_no_duration_it_cannot_keep(capsys):
    """It said ~5 s (partita calibrate --help) and ~20 s (python -m partita.costmodel.calibrate) and took 59 s."""
    from partita.cli import build_parser
    helps = [a.help for p in (build_parser()._subparsers._group_actions[0].choices["calibrate"],)
             for a in p._actions if "--quick" in a.option_strings]
    with pytest.raises(SystemExit):
        calibrate.main(["--help"])
    helps.append(capsys.readouterr().out)
    assert all("the summary says how long it took" in " ".join(h.split()) for h in helps)
    assert not any(s in h for h in helps for s in ("~5 s", "~20 s"))


def test_a_busy_machine_is_refused_before_measuring_and_leaves_the_file(tmp_path, capsys, monkeypatch):
    """Other work above BUSY_LOAD_PER_CPU per CPU: one line, exit 2, nothing measured or written."""
    out = tmp_path / "cluster.json"
    out.write_text("earlier figures")
    cpus = os.cpu_count() or 1
    monkeypatch.setattr(calibrate, "machine_load", lambda: 2.0 * cpus)
    monkeypatch.setattr(calibrate, "measure_local", lambda *a, **k: pytest.fail("measured on a busy machine"))
    assert calibrate.main(["--out", str(out), "--ranks", "2", "--quick"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "busy before calibrating" in err and "--force" in err
    assert out.read_text() == "earlier figures"


def test_the_busy_verdict_counts_calibrates_own_ranks_as_its_own():
    cpus = os.cpu_count() or 1
    quiet = calibrate.BUSY_LOAD_PER_CPU * cpus
    assert calibrate.busy(quiet, 0, "now") is None
    assert "busy now" in calibrate.busy(quiet + 1, 0, "now")
    assert calibrate.busy(quiet + 2, 2, "while calibrating") is None  # its own two ranks ran
    assert "busy while calibrating" in calibrate.busy(quiet + 3, 2, "while calibrating")


def test_forced_figures_record_the_load_they_were_measured_at(calibrated):
    path, _ = calibrated
    load = json.load(open(path))["measurements"]["load_average_1min"]
    assert load["forced"] is True and load["cpus"] == (os.cpu_count() or 1)
    assert load["before"] >= 0 and load["after"] >= 0

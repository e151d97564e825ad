"""`partita calibrate` on GPU hosts, checked here without a GPU: the driver is faked (torch.cuda says 0, 1 or 4
GPUs of a given name and memory) so that calibrate takes the ranks and the path a GPU host would take, while
everything it measures is measured for real on this CPU, at tiny shapes. No rank process may start where none
should: `torch.multiprocessing.start_processes` is replaced by a recorder that stops the run."""
import os
import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp

from partita.costmodel import calibrate
from partita.costmodel.calibrate.device import Gpu, links_preset
from partita.costmodel.calibrate.links import measure_collectives, rank_device
from partita.costmodel.errors import PartitaError
from partita.costmodel.hardware import DEVICES, parse_cluster

ROOT = Path(__file__).resolve().parents[2]
TINY = dataclasses.replace(calibrate.SETTINGS["quick"], matmul_sizes=(32, 64), matmul_budget_s=0.01, copy_bytes=2**20,
                           gemm_shapes=((64, 32, 48), (128, 64, 32)), attention_shapes=((1, 2, 64, 16),), kernel_reps=2)
LINK_FIELDS = ("intra_node_bw", "inter_node_bw", "intra_node_latency", "inter_node_latency", "intra_link_efficiency",
               "inter_link_efficiency", "host_bw")
MiB = 2**20


class Launched(Exception):
    """Raised by the fake start_processes: calibrate got as far as starting rank processes."""


@pytest.fixture
def fake_gpus(monkeypatch):
    """fake_gpus(count, name, mib, capability) -> the list of rank launches calibrate attempts."""
    def install(count, name="NVIDIA H200", mib=143771, capability=(9, 0)):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: name)
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda index=0: SimpleNamespace(total_memory=mib * MiB))
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: capability)
        launches = []

        def start_processes(fn, args=(), nprocs=1, **kwargs):
            launches.append({"nprocs": nprocs, "gpus": args[-1]})
            raise Launched
        monkeypatch.setattr(mp, "start_processes", start_processes)
        return launches
    return install


def test_rank_choice_for_0_1_and_4_gpus():
    # no GPU: the CPU host's ranks, at least 2, as before
    assert calibrate.choose_ranks(None, 0) == calibrate.default_ranks()
    assert calibrate.choose_ranks(3, 0) == 3
    with pytest.raises(PartitaError, match="at least 2 ranks"):
        calibrate.choose_ranks(1, 0)
    # one GPU: one rank (no collectives), never two on it
    assert calibrate.choose_ranks(None, 1) == 1
    with pytest.raises(PartitaError, match=r"--ranks 2: this machine has 1 GPU\(s\), and NCCL runs one rank per GPU"):
        calibrate.choose_ranks(2, 1)
    # four GPUs: a rank on each by default, fewer on request, never more
    assert calibrate.choose_ranks(None, 4) == 4 and calibrate.choose_ranks(2, 4) == 2
    with pytest.raises(PartitaError, match="give --ranks 1 to 4"):
        calibrate.choose_ranks(5, 4)
    assert [rank_device(r, 4) for r in range(4)] == [torch.device("cuda", r) for r in range(4)]
    assert rank_device(3, 0) == torch.device("cpu")


def test_one_gpu_measures_its_kernels_and_keeps_its_presets_links(tmp_path, fake_gpus):
    launches = fake_gpus(1)
    path = str(tmp_path / "cluster.json")
    d = calibrate.calibrate(path, settings=TINY, device=torch.device("cpu"), force=True)
    assert launches == []  # one GPU: no rank processes, so no NCCL group on one device
    cluster = parse_cluster(path)
    assert (cluster.nodes, cluster.devices_per_node) == (1, 1)
    dev, preset = cluster.device, DEVICES["H200-141GB"]
    assert dev.name == "NVIDIA H200" and dev.memory_bytes == 143771 * MiB
    assert {f: getattr(dev, f) for f in LINK_FIELDS} == {f: getattr(preset, f) for f in LINK_FIELDS}
    m = json.loads(Path(path).read_text())["measurements"]
    assert m["ranks"] == 1 and m["backend"] is None and "collectives" not in m
    assert m["links"]["source"] == "preset" and m["links"]["preset"] == "H200-141GB"
    # the kernel rows the fit reads: every GEMM shape, and each attention shape causal and not
    rows = json.loads(Path(path).read_text())["kernels"]
    gemm = [r for r in rows if r["kind"] == "gemm"]
    assert [r["mkn"] for r in gemm] == [list(s) for s in TINY.gemm_shapes]
    assert all(r["fwd_s"] > 0 and r["fwd_bwd_s"] > 0 and r["tflops"] > 0 for r in gemm)
    sdpa = [r for r in rows if r["kind"] == "sdpa"]
    assert [(r["shape"], r["causal"]) for r in sdpa] == [([1, 2, 64, 16], True), ([1, 2, 64, 16], False)]
    assert all(r["fwd_s"] > 0 and r["fwd_bwd_s"] > 0 and r["backend"] in ("FLASH_ATTENTION", "MATH") for r in sdpa)
    # the one line about links, and nothing about collectives
    lines = calibrate.summary(d, path).splitlines()
    links = [line for line in lines if "links" in line]
    assert len(links) == 1 and "H200-141GB's" in links[0] and "no peer" in links[0], lines
    assert "one GPU: no collectives to time" in lines[0] and not any("alpha" in line for line in lines)
    assert any(line.startswith("  GEMM sweep") for line in lines) and any("attention (causal" in line for line in lines)


def test_four_gpus_start_one_rank_per_gpu(tmp_path, fake_gpus):
    launches = fake_gpus(4)
    with pytest.raises(Launched):
        calibrate.calibrate(str(tmp_path / "c.json"), settings=TINY, device=torch.device("cpu"), force=True)
    assert launches == [{"nprocs": 4, "gpus": 4}]


def test_more_ranks_than_gpus_is_one_line(tmp_path, fake_gpus, capsys):
    launches = fake_gpus(1)
    assert calibrate.main(["--out", str(tmp_path / "c.json"), "--ranks", "4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("partita: error: --ranks 4: this machine has 1 GPU(s)") and err.count("\n") == 1
    assert launches == [] and not (tmp_path / "c.json").exists()


def test_a_gpu_without_a_preset_keeps_its_generations_links():
    h100 = Gpu("NVIDIA H100 80GB HBM3", 81559 * MiB, (9, 0), 1)
    assert links_preset(h100) == ("H100-80GB", "NVIDIA H100 80GB HBM3's preset")
    preset, why = links_preset(Gpu("NVIDIA GeForce RTX 4090", 24564 * MiB, (8, 9), 1))
    assert preset == "A100-80GB"
    assert why == "no preset is a NVIDIA GeForce RTX 4090: the preset of its generation (sm_89)"
    # a GH200 (96 GB) is not the 141 GB H200 preset
    assert links_preset(Gpu("NVIDIA GH200 480GB", 97871 * MiB, (9, 0), 1))[0] == "H100-80GB"


def test_a_failing_rank_is_one_line():
    """A rank that raises (here: measure_in_step given an argument it does not take) ends calibrate with one
    line naming the rank and its error, not the ranks' tracebacks."""
    with pytest.raises(PartitaError, match=r"^calibration rank \d of 2 failed: TypeError: .*unexpected keyword "
                                           r"argument 'bogus'$"):
        measure_collectives(2, [1024], 1, {"in_step": {"bogus": 1}})


def test_a_resource_list_written_before_kernels_still_loads():
    cluster = parse_cluster(str(ROOT / "benchmarks/results/fidelity_cluster_2ranks.json"))
    assert cluster.num_devices == 2 and cluster.device.name == "cpu"


def _h200_calibration():
    """`partita calibrate --quick` as it ran on one H200 (torch 2.11, 2026-11-26; benchmarks/data)."""
    c = json.loads((ROOT / "benchmarks" / "data" / "calibrate_h200_quick_torch2.11.json").read_text())
    m = c["measurements"]
    local = {"matmul": m["matmul"], "copy": m["memory_copy"], "op_latency_s": m["op_latency_alone_s"],
             "kernels": c["kernels"]}
    return local, Gpu("NVIDIA H200", 143771 * MiB, (9, 0), 1)


def test_a_real_h200_calibration_keeps_the_datasheet_peak_and_prices_what_it_measured():
    """On the H200 the quick probe's largest square matmul (n = 1024) ran at 78 TFLOP/s, launch-bound; taken
    as the peak it priced that GPU's GEMMs and attention 3-9x too slow. The efficiencies are fractions of the
    datasheet peak, as the presets' are, and the calibrated device prices the kernels it timed."""
    from partita.costmodel.calibrate.device import gpu_device
    from partita.costmodel.hardware.kernel_fit import errors, usable
    local, gpu = _h200_calibration()
    assert max(r["flops_per_s"] for r in local["matmul"]["bf16"]) < 0.1 * DEVICES["H200-141GB"].peak_flops["bf16"]
    dev, how = gpu_device(local, None, gpu)
    assert dev.peak_flops["bf16"] == DEVICES["H200-141GB"].peak_flops["bf16"]
    assert 0.5 < dev.matmul_efficiency < 0.95 and 0.5 < dev.attention_efficiency < 0.95
    judged = errors(usable(local["kernels"]), dev)
    assert len(judged) >= 20
    misses = [(e["row"].get("mkn") or e["row"].get("shape"), e["key"], round(e["error"], 3)) for e in judged
              if abs(e["error"]) > 0.2]
    assert not misses


def test_a_gpu_without_a_preset_takes_its_fastest_measured_rate_as_peak():
    from partita.costmodel.calibrate.device import gpu_peaks
    local, _ = _h200_calibration()
    peak = gpu_peaks(local, Gpu("NVIDIA H999", 100 * 2**30, (9, 0), 1))
    fastest = max(r["tflops"] for r in local["kernels"] if r["kind"] == "gemm" and "tflops" in r) * 1e12
    assert peak["bf16"] == pytest.approx(fastest)


def test_work_that_starts_during_a_calibration_keeps_its_figures_out_of_the_file(tmp_path, fake_gpus, monkeypatch):
    """Quiet before, busy after (other work beyond calibrate's own ranks): PartitaError, the file as it was."""
    fake_gpus(1)
    path = tmp_path / "cluster.json"
    path.write_text("earlier figures")
    loads = iter([0.0, 3.0 * (os.cpu_count() or 1)])
    monkeypatch.setattr(calibrate, "machine_load", lambda: next(loads))
    with pytest.raises(PartitaError, match=r"busy while calibrating.*cluster\.json was not written"):
        calibrate.calibrate(str(path), settings=TINY, device=torch.device("cpu"))
    assert path.read_text() == "earlier figures"

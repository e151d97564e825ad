"""`partita calibrate`: the Device of the resource list, from what was measured (costmodel.calibrate's module
docstring says what each field comes from).

`local` is one device's measurements ({"matmul", "copy", "op_latency_s"}, and on a GPU "kernels", the
calibrate_kernels rows); `links` what the ranks measured (`link_measurements`), or None where one GPU ran
alone and the links are its preset's.
"""
from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

from partita.costmodel.calibrate.fit import fit_alpha_beta, fit_gemm_curve, sync_latency
from partita.costmodel.calibrate.local import physical_memory
from partita.costmodel.hardware.kernel_fit import fit_kernel_constants, usable
from partita.costmodel.hardware import DEVICES, GPU_OVERLAP_SLOWDOWN, Device, generation_preset, gpu_preset

GiB = 2**30


@dataclass(frozen=True)
class Gpu:
    """What the driver says of one local GPU."""

    name: str
    memory_bytes: float
    capability: tuple[int, int]
    count: int
    """GPUs on this host (their host memory is shared among them)."""


def local_gpu(index: int = 0) -> Gpu:
    import torch
    return Gpu(name=torch.cuda.get_device_name(index),
               memory_bytes=float(torch.cuda.get_device_properties(index).total_memory),
               capability=tuple(torch.cuda.get_device_capability(index)), count=torch.cuda.device_count())


def link_measurements(collectives: dict) -> dict:
    """calibrate_links.measure_collectives' result, its parts named, with the alpha-beta fit of each kind."""
    results = dict(collectives["results"])
    concurrent, in_step, dtensor = (results.pop(k) for k in ("concurrent_matmul", "in_step", "dtensor"))
    return {"backend": collectives["backend"], "results": results, "concurrent": concurrent[0],
            "in_step": in_step, "dtensor": dtensor,
            "fits": {kind: fit_alpha_beta(kind, pts) for kind, pts in results.items() if pts}}


def compute_share(matmul: dict, links: dict | None) -> float:
    """A rank's share of its device when every rank computes at once (below 1 when ranks outnumber cores): the
    concurrent matmul rate over the same size timed alone; 1 with no ranks."""
    if links is None:
        return 1.0
    concurrent = links["concurrent"]
    best = max(r["flops_per_s"] for r in matmul["fp32"])
    alone = next((r["flops_per_s"] for r in matmul["fp32"] if r["n"] == concurrent["n"]), best)
    return min(1.0, concurrent["flops_per_s"] / alone)


def _peaks(matmul: dict, share: float) -> dict:
    return {dt: max(r["flops_per_s"] for r in matmul[dt]) * share for dt in ("bf16", "fp32")}


def gpu_peaks(local: dict, gpu: Gpu, share: float = 1.0) -> dict:
    """The peak FLOP/s a GPU's kernel efficiencies are fractions of: its preset's datasheet peak, as for the
    presets (costmodel.hardware), so a calibrated efficiency reads like a preset's. Never the fastest
    probe: the probe's square matmuls (n <= 1024 in --quick) are launch-bound on a GPU (78 TFLOP/s measured
    on an H200 whose bf16 GEMMs run at 790), and a peak taken from them priced that H200's GEMMs 7-9x too
    slow. A GPU without a preset of its own takes the fastest rate it measured, GEMM sweep included, and a
    measured rate above the datasheet raises the datasheet's."""
    measured = _peaks(local["matmul"], share)
    gemm = [r["tflops"] * 1e12 * share for r in local.get("kernels") or [] if r.get("kind") == "gemm" and "tflops" in r]
    measured["bf16"] = max([measured["bf16"], *gemm])
    exact = gpu_preset(gpu.name, gpu.memory_bytes)
    if exact is None:
        return measured
    sheet = DEVICES[exact].peak_flops
    return {dt: max(sheet.get(dt, 0.0), measured[dt]) for dt in measured}


def _measured_links(links: dict) -> dict:
    """Device link fields from the all-reduce fit (the collective the planner uses most). One host is one
    node: the off-node figures repeat the loopback ones (unused for a one-node cluster)."""
    ar = links["fits"]["all_reduce"]
    return {"intra_node_bw": ar["beta_bytes_per_s"], "inter_node_bw": ar["beta_bytes_per_s"],
            "intra_node_latency": ar["alpha_s"], "inter_node_latency": ar["alpha_s"]}


def cpu_device(local: dict, links: dict, ranks: int) -> Device:
    """One rank process of this CPU host."""
    share = compute_share(local["matmul"], links)
    peak = _peaks(local["matmul"], share)
    memory = physical_memory() / ranks
    dtensor = links["dtensor"]
    return Device(name="cpu", peak_flops=peak, memory_bytes=memory, mem_bandwidth=local["copy"]["bytes_per_s"],
                  # one efficiency for every GEMM (a CPU's curve is not a GPU's)
                  matmul_efficiency=min(1.0, statistics.mean(r["flops_per_s"] / peak["fp32"]
                                                             for r in local["matmul"]["fp32"])),
                  overlap_slowdown=1.0,  # gloo's threads share the cores that compute
                  host_bw=local["copy"]["bytes_per_s"], host_memory_bytes=0.0,  # nothing to offload to
                  reserved_bytes=min(DEVICES["cpu"].reserved_bytes, memory / 4),
                  op_latency=local["op_latency_s"] / share, sync_latency=sync_latency(links["in_step"], links["fits"]),
                  sharded_op_latency=dtensor["op_latency_s"], sharded_param_latency=dtensor["param_latency_s"],
                  redistribute_latency=dtensor["redistribute_latency_s"], **_measured_links(links))


def links_preset(gpu: Gpu) -> tuple[str, str]:
    """The preset whose links and host a GPU keeps when they cannot be measured, and why (one phrase)."""
    preset = gpu_preset(gpu.name, gpu.memory_bytes)
    if preset is not None:
        return preset, f"{gpu.name}'s preset"
    major, minor = gpu.capability
    preset = generation_preset(gpu.capability)
    return preset, f"no preset is a {gpu.name}: the preset of its generation (sm_{major}{minor})"


def gpu_kernel_constants(local: dict, peak: dict, preset: Device) -> dict:
    """The Device fields of a GPU's kernels, from `local` (its measurements): the kernel rows of
    calibrate_kernels fitted by costmodel.hardware.kernel_fit (the GEMM curve, the attention curve of the kernel
    torch dispatched, as for the presets), on the generation and stack of the GPU's `preset`; without
    kernel rows, the square bf16 matmuls fitted to the older per-dimension curve (fit_gemm_curve). The
    presets' published overlap_slowdown either way (not measured)."""
    rows = usable(local.get("kernels") or [])
    if rows:
        probe = dataclasses.replace(preset, peak_flops=peak, mem_bandwidth=local["copy"]["bytes_per_s"],
                                    mem_efficiency=1.0)
        fitted = fit_kernel_constants(rows, probe)
        return {**fitted, "generation": preset.generation, "stack": preset.stack,
                "overlap_slowdown": GPU_OVERLAP_SLOWDOWN}
    fit = fit_gemm_curve(local["matmul"]["bf16"], peak["bf16"])
    return {"matmul_efficiency": min(1.0, fit["matmul_efficiency_of_measured_peak"]),
            "gemm_half_dim": fit["gemm_half_dim"], "overlap_slowdown": GPU_OVERLAP_SLOWDOWN,
            "generation": preset.generation, "stack": preset.stack}


def gpu_device(local: dict, links: dict | None, gpu: Gpu) -> tuple[Device, dict]:
    """One GPU of this host, and how its links were had: {"source": "measured" | "preset", "preset", "line"}
    (`line`: one sentence for the user). Measured where ranks timed them (NCCL, one rank per GPU); with one GPU
    there is no peer to time them with, and the links, link efficiencies and host link are the preset's
    (`links_preset`). The host link is the preset's either way (a GPU's PCIe share; not measured)."""
    share = compute_share(local["matmul"], links)
    name, why = links_preset(gpu)
    preset = DEVICES[name]
    peak = gpu_peaks(local, gpu, share)
    if links is None:
        link_fields = {k: getattr(preset, k) for k in ("intra_node_bw", "inter_node_bw", "intra_node_latency",
                                                       "inter_node_latency", "intra_link_efficiency",
                                                       "inter_link_efficiency")}
        how = {"source": "preset", "preset": name,
               "line": f"links: {name}'s ({why}): NVLink {preset.intra_node_bw / 1e9:.0f} GB/s and network "
                       f"{preset.inter_node_bw / 1e9:.0f} GB/s per GPU, host {preset.host_bw / 1e9:.0f} GB/s; one "
                       f"GPU has no peer to time them with"}
    else:
        link_fields = _measured_links(links)
        how = {"source": "measured", "preset": name,
               "line": f"links: measured ({links['backend']}, one rank per GPU); off-node links repeat them (one "
                       f"host); host link {preset.host_bw / 1e9:.0f} GB/s, {name}'s ({why})"}
    memory = gpu.memory_bytes
    # a launch's cost: the eager dispatch measured, unless the kernel fit gave the kernels' own (per launch)
    kernels = {"op_latency": local["op_latency_s"] / share, **gpu_kernel_constants(local, peak, preset)}
    dev = Device(name=gpu.name, peak_flops=peak, memory_bytes=memory, mem_bandwidth=local["copy"]["bytes_per_s"],
                 reserved_bytes=2 * GiB if memory > 4 * GiB else memory / 4, host_bw=preset.host_bw,
                 host_memory_bytes=physical_memory() / max(1, gpu.count),  # offload room per GPU
                 # hidden behind queued kernels on a GPU (costmodel.hardware.Device): kept as measurements only
                 sync_latency=0.0, sharded_op_latency=0.0, sharded_param_latency=0.0, redistribute_latency=0.0,
                 **kernels, **link_fields)
    return dev, how

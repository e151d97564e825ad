"""`partita calibrate`: measure this machine and write a resource list (costmodel.hardware.resources) for it.

    python -m partita.costmodel.calibrate --out cluster.json [--ranks N] [--quick]

Ranks (`choose_ranks`): on a CPU host, 2..N rank processes share the host (default min(4, cores)); on a GPU
host one rank per GPU, all of them by default -- NCCL refuses two ranks on one GPU ("Duplicate GPU
detected"), so never more ranks than GPUs. With one GPU (or --ranks 1) no collective can be timed: the
device keeps its preset's links (calibrate_device.links_preset: the GPU's own preset, or its generation's),
and the command says so in one line.

What is measured, and how it becomes the device of the resource list (one device = one rank process,
run as the runtime runs ranks: OMP_NUM_THREADS=1; the pieces: calibrate_local, calibrate_kernels,
calibrate_links, calibrate_dtensor, calibrate_fit, calibrate_device):

- matmul: n x n @ n x n for a few n, fp32 and bf16 (CUDA: on the GPU), median of repeats, 2 n^3 FLOPs.
  A CPU has no datasheet peak to hold against, so `peak_flops[dtype]` is the best rate measured and
  `matmul_efficiency` the mean over sizes of fp32 rate / fp32 peak: peak x efficiency is then the
  typical measured rate, which is what the cost model charges (`partita.planner.enumerate.strategies.node_seconds`).
  On a GPU the bf16 sizes are fitted to costmodel.price.kernels' GEMM curve instead (`fit_gemm_curve`:
  matmul_efficiency and gemm_half_dim), and overlap_slowdown keeps the published default; on a CPU
  overlap_slowdown is 1 (gloo's threads compute-share the cores: overlapped traffic is not free).
- kernels (GPU only, calibrate_kernels): bf16 GEMMs over a sweep of (M, K, N) and fused attention (SDPA,
  causal and not, the backend torch dispatches) over sequence lengths, forward and forward + backward.
  Written as the resource list's `kernels` rows, for costmodel's kernel-constant fit
  (calibrate_device.gpu_kernel_constants is where that fit is to be called).
- memory bandwidth: a large copy, counted as read + write (2 x bytes / seconds), best of a few.
  On CPU the same figure is `host_bw` (offload is a copy within host memory); on a GPU host_bw is its
  preset's (the GPU's share of a PCIe link; not measured).
- collectives over gloo (NCCL, one rank per GPU, on a GPU host) among 2..N local ranks (spawned with
  torch.multiprocessing, rendezvous through a FileStore): all-reduce, all-gather, reduce-scatter,
  all-to-all, broadcast and a point-to-point ping-pong, at a few message sizes; each time is the median
  over repeats, the slowest rank's. alpha and beta are fitted by least squares on relative error (so
  small and large messages weigh alike; alpha >= 0, beta > 0) to the forms of costmodel.price.comm, e.g.
  all-reduce t = 2 (k-1) alpha + 2 (k-1)/k B / beta over every group size k at once. The all-reduce
  fit gives the device's intra-node latency and bandwidth (the collective the planner uses most);
  the other fits are kept under "measurements".
- memory: physical memory / N ranks (ranks share the host), less the cpu preset's reserve; a GPU's
  memory as the driver reports it, less 2 GiB.
- in-step collectives (`measure_in_step`): what one small all-reduce, all-gather, reduce-scatter (groups
  of every size k | N, all at once) and p2p transfer add to a loop of 20 ms compute bursts on every
  rank. A step issues its collectives between stretches of compute, and there each message step costs
  more than back to back (the peer's communication thread must be woken, with more ranks than cores
  scheduled): `sync_latency` fits that excess per message step (costmodel.price.comm: alpha + sync_latency).
- DTensor (`measure_dtensor`): forward + backward of Megatron MLPs split by ColwiseParallel /
  RowwiseParallel against the same plain modules (per launch: `sharded_op_latency`), an AdamW step over
  DTensor parameters against plain ones (per parameter: `sharded_param_latency`), and each of the three
  tensor-parallel redistributions against its bare collective (per collective: `redistribute_latency`).
  On a GPU these CPU overheads hide behind queued kernels: they are kept under "measurements" and the
  device's figures are 0, as for the GPU presets.

One host is one node: off-node links cannot be measured here, so inter_node_* repeat the loopback
figures (they are unused for a one-node cluster); edit them for a multi-host resource list.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, dataclass, field

from partita.costmodel.errors import PartitaError

GEMM_SHAPES = tuple((m, k, n) for m in (256, 1024, 4096, 16384)
                    for k, n in ((4096, 4096), (4096, 14336), (8192, 1024), (1024, 8192))) + ((16384, 4096, 32001),)
"""(M, K, N) of the GPU GEMM sweep (calibrate_kernels): GPU-MEASUREMENTS.md's sweep (kernels2.py) -- token
counts from a small micro-batch to 16k, Llama-3-8B's square, FFN and narrow (tensor-parallel shard) products --
and one head whose N is no multiple of 8 (a 32,000-token vocabulary plus a pad token), from which
costmodel.hardware.kernel_fit fits the device's unaligned-GEMM factors (costmodel.price.kernels, Alignment)."""
ATTENTION_SHAPES = tuple((16384 // s, 32, s, 128) for s in (512, 1024, 2048, 4096, 8192, 16384)) + ((8, 16, 1024, 64),)
"""(batch, heads, seq, head_dim) of the GPU attention sweep: 16k tokens at every sequence length from 512 to
16384 (the attention curve in the sequence length, costmodel.price.kernels), and one head_dim-64 shape."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    """How much `calibrate` measures (SETTINGS: "quick" or "full")."""

    matmul_sizes: tuple[int, ...]
    matmul_budget_s: float
    """Seconds of repeats per matmul size (median of them)."""
    copy_bytes: int
    message_bytes: tuple[int, ...]
    reps: int
    """Repeats per collective and message size (fewer for large messages)."""
    in_step: dict = field(default_factory=dict)
    """Keyword arguments of calibrate_links.measure_in_step."""
    dtensor: dict = field(default_factory=dict)
    """Keyword arguments of calibrate_dtensor.measure_dtensor."""
    gemm_shapes: tuple = GEMM_SHAPES
    attention_shapes: tuple = ATTENTION_SHAPES
    kernel_reps: int = 10
    """Timed calls per GPU kernel shape (calibrate_kernels)."""


SETTINGS = {
    "quick": Settings(matmul_sizes=(128, 256, 512, 1024), matmul_budget_s=0.08, copy_bytes=2**27,
                      message_bytes=(2**10, 2**14, 2**18, 2**20, 2**22, 2**24), reps=10,
                      in_step={"reps": 3, "iters": 6}, dtensor={"repeats": 5},
                      gemm_shapes=tuple(s for s in GEMM_SHAPES if s[0] in (1024, 16384)),
                      attention_shapes=ATTENTION_SHAPES[1::2], kernel_reps=5),
    "full": Settings(matmul_sizes=(128, 256, 512, 1024, 2048), matmul_budget_s=0.3, copy_bytes=2**29,
                     message_bytes=(2**10, 2**13, 2**16, 2**19, 2**20, 2**22, 2**24, 2**26), reps=25,
                     in_step={"reps": 5, "iters": 10}, dtensor={"repeats": 15}),
}


BUSY_LOAD_PER_CPU = 0.5
"""Other work beyond which a calibration is refused: a 1-minute load average, less calibrate's own ranks,
above this many runnable processes per CPU. Figures timed while other processes share the cores price every
plan for a slower, noisier machine: a calibration written beside a busy test suite mispredicted steps 14x
(issue 46). The load average lags by about a minute, so a machine that has just gone quiet is refused too:
wait a minute, or `--force`."""


def machine_load() -> float:
    """This machine's 1-minute load average (runnable processes, averaged); 0 where the OS has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def busy(load: float, own: int, when: str) -> str | None:
    """Why figures measured at 1-minute load `load`, `own` of it calibrate's own ranks, are not trusted; None
    when the other work is within BUSY_LOAD_PER_CPU per CPU."""
    cpus = os.cpu_count() or 1
    other = max(0.0, load - own)
    if other <= BUSY_LOAD_PER_CPU * cpus:
        return None
    return (f"the machine was busy {when}: 1-minute load {load:.1f} on {cpus} CPUs, {other:.1f} of it other work "
            f"than calibrate's own {own} rank(s), above {BUSY_LOAD_PER_CPU:g} per CPU; figures timed beside other "
            "work price plans for a slower machine. Stop the other work and run it again a minute later, or pass "
            "--force to write them anyway (the file records the load)")


def default_ranks() -> int:
    """Rank processes on a CPU host: min(4, cores), at least 2."""
    return max(2, min(4, os.cpu_count() or 2))


def visible_gpus() -> int:
    """CUDA devices this process sees (0 without CUDA)."""
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def choose_ranks(requested: int | None, gpus: int) -> int:
    """The rank processes that time the collectives (module docstring): on a CPU host `requested` or
    default_ranks(), at least 2; on a GPU host one per GPU, all of them unless fewer are `requested` (1: none,
    the one-GPU path). PartitaError, one line, for a number the machine cannot run."""
    if gpus == 0:
        ranks = default_ranks() if requested is None else requested
        if ranks < 2:
            raise PartitaError(f"--ranks {ranks}: calibration needs at least 2 ranks to time collectives")
        return ranks
    ranks = gpus if requested is None else requested
    if not 1 <= ranks <= gpus:
        raise PartitaError(f"--ranks {ranks}: this machine has {gpus} GPU(s), and NCCL runs one rank per GPU; "
                           f"give --ranks 1 to {gpus} (default: {gpus}, every GPU)")
    return ranks


def measure_local(device, s: Settings, kernels: bool) -> dict:
    """One device's measurements (calibrate_device's `local`): matmuls and a copy with one thread (a rank's
    share, as the ranks run), and on a GPU the kernel sweeps."""
    import torch
    from partita.costmodel.calibrate.kernels import measure_attention, measure_gemm
    from partita.costmodel.calibrate.local import measure_copy, measure_matmul
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        local = {"matmul": measure_matmul(s.matmul_sizes, budget_s=s.matmul_budget_s, device=device),
                 # a GPU's copy of 128 MiB takes 40 us, in which a launch and a sync are a fifth (3.5 TB/s
                 # on an H200 against 4.3 with 1 GiB): at least 1 GiB there, 0.5 ms
                 "copy": measure_copy(max(s.copy_bytes, 2**30) if device.type == "cuda" else s.copy_bytes,
                                      device=device)}
        if kernels:
            local["kernels"] = (measure_gemm(s.gemm_shapes, device, reps=s.kernel_reps)
                                + measure_attention(s.attention_shapes, device, reps=s.kernel_reps))
    finally:
        torch.set_num_threads(threads)
    return local


def calibrate(out_path, ranks: int | None = None, quick: bool = False, *, settings: Settings | None = None,
              device=None, force: bool = False) -> dict:
    """Measure this machine, write its resource list to `out_path` (JSON or YAML) and return it.

    `settings` overrides SETTINGS["quick" if quick else "full"]; `device` is where one device's kernels are
    timed (default: the first GPU, or the CPU). The load is checked before measuring and again before writing
    (`busy`): on a busy machine PartitaError, and `out_path` is left as it was, unless `force`."""
    import torch
    from partita.costmodel.calibrate.device import (compute_share, cpu_device, gpu_device, link_measurements,
                                                    local_gpu)
    from partita.costmodel.calibrate.links import measure_collectives
    from partita.costmodel.calibrate.local import measure_op_latency
    from partita.costmodel.hardware import Cluster
    from partita.costmodel.hardware.resources import cluster_to_dict, write_resources

    gpus = visible_gpus()
    ranks = choose_ranks(ranks, gpus)
    s = settings or SETTINGS["quick" if quick else "full"]
    load = {"before": machine_load(), "cpus": os.cpu_count() or 1, "forced": force}
    if (why := busy(load["before"], 0, "before calibrating")) and not force:
        raise PartitaError(why)
    started = time.perf_counter()
    if device is None:
        device = torch.device("cuda", 0) if gpus else torch.device("cpu")
    local = measure_local(device, s, kernels=gpus > 0)
    links = None
    if ranks > 1:
        links = link_measurements(measure_collectives(ranks, s.message_bytes, s.reps,
                                                      {"in_step": s.in_step, "dtensor": s.dtensor}, gpus=gpus))
    local["op_latency_s"] = measure_op_latency(device)
    if gpus:
        dev, how = gpu_device(local, links, local_gpu(0))
    else:
        dev, how = cpu_device(local, links, ranks), None
    host = os.uname().nodename if hasattr(os, "uname") else "host"
    measurements = {
        "host": host, "torch": str(torch.__version__), "backend": links["backend"] if links else None,
        "ranks": ranks, "gpus": gpus, "quick": quick, "threads_per_rank": 1, "wall_time_s": None,
        "matmul": local["matmul"], "memory_copy": local["copy"], "op_latency_alone_s": local["op_latency_s"],
        "settings": asdict(s),
    }
    if links:
        measurements.update(collectives=links["results"], fits=links["fits"], concurrent_matmul=links["concurrent"],
                            compute_share_per_rank=compute_share(local["matmul"], links),
                            in_step_collectives=links["in_step"], dtensor=links["dtensor"],
                            notes="inter_node_* repeat the loopback figures: one host, off-node links not measured")
    if how:
        measurements["links"] = how
    cluster = Cluster(nodes=1, devices_per_node=ranks, device=dev, spec=host)
    d = cluster_to_dict(cluster, name=f"calibrated {host}", measurements=measurements, kernels=local.get("kernels"))
    measurements["wall_time_s"] = time.perf_counter() - started
    load["after"] = machine_load()
    measurements["load_average_1min"] = load
    if (why := busy(load["after"], ranks if not gpus else 0, "while calibrating")) and not force:
        raise PartitaError(f"{why}; {out_path} was not written")
    write_resources(d, out_path)
    return d


def _kernel_lines(rows: list[dict]) -> list[str]:
    """The GPU kernel sweeps in a line per curve: the range of rates, and what failed."""
    lines = []
    gemm = [r for r in rows if r["kind"] == "gemm" and "error" not in r]
    if gemm:
        rates = [r["tflops"] for r in gemm]
        lines.append(f"  GEMM sweep (bf16, M x K x N): {min(rates):.3g}-{max(rates):.3g} TFLOP/s forward over "
                     f"{len(gemm)} shapes")
    for causal in (True, False):
        att = [r for r in rows if r["kind"] == "sdpa" and r["causal"] is causal and "error" not in r]
        if att:
            rates = [r["tflops_fwdbwd_full"] for r in att]
            seqs = sorted({r["shape"][2] for r in att})
            backends = ", ".join(sorted({r["backend"] for r in att}))
            lines.append(f"  attention ({'causal' if causal else 'non-causal'}, {backends}): "
                         f"{min(rates):.3g}-{max(rates):.3g} TFLOP/s "
                         f"forward + backward on the full s x s count, s = {seqs[0]}-{seqs[-1]}")
    failed = [r for r in rows if "error" in r]
    if failed:
        lines.append(f"  {len(failed)} kernel shape(s) could not run, e.g. {failed[0]['kind']} "
                     f"{failed[0].get('mkn') or failed[0].get('shape')}: {failed[0]['error']}")
    return lines


def _link_lines(m: dict, dev: dict) -> list[str]:
    lines = [f"  {kind:<15} alpha {f['alpha_s'] * 1e6:8.1f} us   beta {f['beta_bytes_per_s'] / 1e9:7.2f} GB/s"
             f"   (rel. rms error {f['rel_rms_error']:.0%})" for kind, f in m.get("fits", {}).items()]
    rows = [r for kind_rows in m.get("in_step_collectives", {}).values() if isinstance(kind_rows, list)
            for r in kind_rows]
    noisy = [r for r in rows if r["in_step_s"] is None]
    if noisy:
        lines.append(f"  warning: the machine was too noisy to measure {len(noisy)} of {len(rows)} in-step collective "
                     f"costs (their difference of wall times stayed <= 0); sync latency is the median of the rest "
                     f"({dev['sync_latency'] * 1e6:.0f} us). Re-run on a quieter machine for a firmer figure.")
    if "links" in m:
        lines.append("  " + m["links"]["line"])
    return lines


def peak_line(m: dict, dev: dict) -> str:
    """Why the peak written to the file is below the peak printed above it: each rank's share of the compute
    when all ranks run matmuls at once (`compute_share_per_rank`, from the concurrent matmul measurement)."""
    best = max(r["flops_per_s"] for r in m["matmul"]["fp32"])
    share, ranks = m["compute_share_per_rank"], m["ranks"]
    return (f"  written peak_flops fp32: {dev['peak_flops']['fp32'] / 1e9:.1f} GFLOP/s per rank = the one-rank peak "
            f"{best / 1e9:.1f} x {share:.2f}, each rank's share when all {ranks} ranks compute at once (measured: "
            f"{m['concurrent_matmul']['flops_per_s'] / 1e9:.1f} GFLOP/s per rank side by side)")


def summary(d: dict, out_path: str) -> str:
    m = d["measurements"]
    dev = d["groups"][0]["device"]
    how = f"{m['backend']}" if m["backend"] else "one GPU: no collectives to time"
    lines = [f"partita calibrate: {m['ranks']} rank{'s' if m['ranks'] > 1 else ''} on {m['host']} ({how}), "
             f"{m['wall_time_s']:.1f} s{' (quick)' if m['quick'] else ''}"]
    for dt in ("fp32", "bf16"):
        rows = m["matmul"][dt]
        best = max(rows, key=lambda r: r["flops_per_s"])
        lines.append(f"  matmul {dt}: peak {best['flops_per_s'] / 1e9:.1f} GFLOP/s (n={best['n']}), "
                     + ", ".join(f"n={r['n']} {r['flops_per_s'] / 1e9:.1f}" for r in rows))
    if m.get("gpus"):
        if dev.get("gemm_half_mn"):
            lines.append(f"  GEMM curve (bf16, costmodel.hardware.kernel_fit): {dev['matmul_efficiency']:.2f} of the peak on "
                         f"large shapes, halved at {dev['gemm_half_mn']:.3g} output elements")
        else:
            lines.append(f"  matmul efficiency (bf16 GEMM curve): {dev['matmul_efficiency']:.2f} of the best rate, "
                         f"halved at dimension {dev['gemm_half_dim']:.0f}")
        lines += _kernel_lines(d.get("kernels") or [])
    else:
        lines.append(peak_line(m, dev))
        lines.append(f"  matmul efficiency (fp32, mean over sizes): {dev['matmul_efficiency']:.2f}")
    lines.append(f"  memory bandwidth (copy): {m['memory_copy']['bytes_per_s'] / 1e9:.1f} GB/s")
    lines += _link_lines(m, dev)
    lines.append(f"  wrote {out_path}: {m['ranks']} x {dev['name']} "
                 f"(use it as: partita plan --cluster {out_path} ...)")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """calibrate's flags, defined once: `partita calibrate` (partita.cli_args) and `python -m
    partita.costmodel.calibrate` (`main`) both take them from here; `run` runs either's parsed arguments."""
    p.add_argument("--out", required=True, help="resource list to write (.json, .yaml or .yml)")
    p.add_argument("--ranks", type=int, default=None,
                   help=f"local ranks for the collectives: on a CPU host at least 2 (default min(4, cpu count): "
                        f"{default_ranks()}); on a GPU host one per GPU, at most the GPUs (default: every GPU; one "
                        "GPU: no collectives, its preset's links)")
    p.add_argument("--quick", action="store_true", help="fewer matrix and message sizes and repetitions than a "
                   "full calibration (the summary says how long it took)")
    p.add_argument("--force", action="store_true", help="write the figures even when other work kept the machine "
                   f"busy before or during the calibration (1-minute load above {BUSY_LOAD_PER_CPU:g} per CPU beyond "
                   "its own ranks; refused by default: they would price plans for a slower machine)")


def run(args: argparse.Namespace) -> int:
    """Calibrate as the parsed arguments of `add_arguments` say; the exit code (2: refused, in one line)."""
    try:
        d = calibrate(args.out, ranks=args.ranks, quick=args.quick, force=args.force)
    except PartitaError as e:
        print(f"partita: error: {e}", file=sys.stderr)
        return 2
    print(summary(d, args.out))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="partita calibrate",
                                description="Measure this machine's devices and links; write a resource list.")
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

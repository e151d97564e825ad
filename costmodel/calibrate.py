"""`partita calibrate`: measure this machine and write a resource list (costmodel.resources) for it.

    python -m partita.costmodel.calibrate --out cluster.json [--ranks N] [--quick]

What is measured, and how it becomes the device of the resource list (one device = one rank process,
run as the runtime runs ranks: OMP_NUM_THREADS=1):

- matmul: n x n @ n x n for a few n, fp32 and bf16 (CUDA: on the GPU), median of repeats, 2 n^3 FLOPs.
  A CPU has no datasheet peak to hold against, so `peak_flops[dtype]` is the best rate measured and
  `matmul_efficiency` the mean over sizes of fp32 rate / fp32 peak: peak x efficiency is then the
  typical measured rate, which is what the cost model charges (`partita.planner.strategies.node_seconds`).
  On a GPU the bf16 sizes are fitted to costmodel.kernels' GEMM curve instead (`fit_gemm_curve`:
  matmul_efficiency and gemm_half_dim), and overlap_slowdown keeps the published default; on a CPU
  overlap_slowdown is 1 (gloo's threads compute-share the cores: overlapped traffic is not free).
- memory bandwidth: a large copy, counted as read + write (2 x bytes / seconds), best of a few.
  On CPU the same figure is `host_bw` (offload is a copy within host memory).
- collectives over gloo (NCCL when torch.cuda.is_available()) among 2..N local ranks (spawned with
  torch.multiprocessing, rendezvous through a FileStore): all-reduce, all-gather, reduce-scatter,
  all-to-all, broadcast and a point-to-point ping-pong, at a few message sizes; each time is the median
  over repeats, the slowest rank's. alpha and beta are fitted by least squares on relative error (so
  small and large messages weigh alike; alpha >= 0, beta > 0) to the forms of costmodel.comm, e.g.
  all-reduce t = 2 (k-1) alpha + 2 (k-1)/k B / beta over every group size k at once. The all-reduce
  fit gives the device's intra-node latency and bandwidth (the collective the planner uses most);
  the other fits are kept under "measurements".
- memory: physical memory / N ranks (ranks share the host), less the cpu preset's reserve.
- in-step collectives (`measure_in_step`): what one small all-reduce, all-gather, reduce-scatter (groups
  of every size k | N, all at once) and p2p transfer add to a loop of 20 ms compute bursts on every
  rank. A step issues its collectives between stretches of compute, and there each message step costs
  more than back to back (the peer's communication thread must be woken, with more ranks than cores
  scheduled): `sync_latency` fits that excess per message step (costmodel.comm: alpha + sync_latency).
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
import statistics
import sys
import time

from partita.costmodel.calibrate_fit import fit_alpha_beta, fit_gemm_curve, sync_latency
from partita.costmodel.calibrate_links import measure_collectives
from partita.costmodel.calibrate_local import measure_copy, measure_matmul, measure_op_latency, physical_memory
from partita.costmodel.errors import PartitaError


def _settings(quick: bool) -> dict:
    if quick:
        return {"matmul_sizes": [128, 256, 512, 1024], "matmul_budget_s": 0.08, "copy_bytes": 2**27,
                "message_bytes": [2**10, 2**14, 2**18, 2**20, 2**22, 2**24], "reps": 10,
                "extra": {"in_step": {"reps": 3, "iters": 6}, "dtensor": {"repeats": 5}}}
    return {"matmul_sizes": [128, 256, 512, 1024, 2048], "matmul_budget_s": 0.3, "copy_bytes": 2**29,
            "message_bytes": [2**10, 2**13, 2**16, 2**19, 2**20, 2**22, 2**24, 2**26], "reps": 25,
            "extra": {"in_step": {"reps": 5, "iters": 10}, "dtensor": {"repeats": 15}}}



# --------------------------------------------------------------------------------------------- main

def calibrate(out_path, ranks: int | None = None, quick: bool = False) -> dict:
    """Measure this machine, write its resource list to `out_path` (JSON or YAML) and return it."""
    import torch
    from partita.costmodel.hardware import DEVICES, GPU_OVERLAP_SLOWDOWN, Cluster, Device
    from partita.costmodel.resources import cluster_to_dict, write_resources

    ranks = default_ranks() if ranks is None else ranks
    if ranks < 2:
        raise PartitaError(f"--ranks {ranks}: calibration needs at least 2 ranks to time collectives")
    s = _settings(quick)
    started = time.perf_counter()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda") if cuda else torch.device("cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a rank's share, as the ranks run
    try:
        matmul = measure_matmul(s["matmul_sizes"], budget_s=s["matmul_budget_s"], device=device)
        copy = measure_copy(s["copy_bytes"], device=device)
    finally:
        torch.set_num_threads(threads)
    coll = measure_collectives(ranks, s["message_bytes"], s["reps"], s["extra"])
    concurrent = coll["results"].pop("concurrent_matmul")[0]
    in_step = coll["results"].pop("in_step")
    dtensor = coll["results"].pop("dtensor")
    fits = {kind: fit_alpha_beta(kind, pts) for kind, pts in coll["results"].items() if pts}

    peak = {dt: max(r["flops_per_s"] for r in rows) for dt, rows in matmul.items()}
    # a rank's share when all ranks compute at once (below 1 when ranks outnumber cores)
    alone = next((r["flops_per_s"] for r in matmul["fp32"] if r["n"] == concurrent["n"]), peak["fp32"])
    share = min(1.0, concurrent["flops_per_s"] / alone)
    peak = {dt: v * share for dt, v in peak.items()}
    op_latency = measure_op_latency(device)
    efficiency = statistics.mean(r["flops_per_s"] / peak["fp32"] for r in matmul["fp32"])
    if cuda:  # the GEMM curve of costmodel.kernels, from the bf16 sizes measured on this GPU
        gemm_fit = fit_gemm_curve(matmul["bf16"], peak["bf16"])
        efficiency = gemm_fit.pop("matmul_efficiency_of_measured_peak")
        gemm_fit["overlap_slowdown"] = GPU_OVERLAP_SLOWDOWN  # the presets' published default; not measured
    else:  # one efficiency for every GEMM (a CPU's curve is not a GPU's); gloo's threads share the cores
        gemm_fit = {"overlap_slowdown": 1.0}
    ar = fits["all_reduce"]
    base = DEVICES["cpu"]
    if cuda:
        memory = float(torch.cuda.get_device_properties(0).total_memory)
        reserved = 2 * 2**30 if memory > 4 * 2**30 else memory / 4
        host_bw = base.host_bw
        host_memory = physical_memory() / max(1, torch.cuda.device_count())  # offload room per GPU
        name = torch.cuda.get_device_name(0)
    else:
        memory = physical_memory() / ranks
        reserved = min(base.reserved_bytes, memory / 4)
        host_bw = copy["bytes_per_s"]
        host_memory = 0.0  # a CPU's memory already is host memory: nothing to offload to
        name = "cpu"
    dev = Device(name=name, peak_flops={"bf16": peak["bf16"], "fp32": peak["fp32"]}, memory_bytes=memory,
                 mem_bandwidth=copy["bytes_per_s"], intra_node_bw=ar["beta_bytes_per_s"],
                 inter_node_bw=ar["beta_bytes_per_s"], matmul_efficiency=min(1.0, efficiency),
                 intra_node_latency=ar["alpha_s"], inter_node_latency=ar["alpha_s"], host_bw=host_bw,
                 reserved_bytes=reserved, host_memory_bytes=host_memory, op_latency=op_latency / share,
                 # on a GPU both hide behind queued kernels (costmodel.hardware.Device): kept as measurements
                 sync_latency=0.0 if cuda else sync_latency(in_step, fits),
                 sharded_op_latency=0.0 if cuda else dtensor["op_latency_s"],
                 sharded_param_latency=0.0 if cuda else dtensor["param_latency_s"],
                 redistribute_latency=0.0 if cuda else dtensor["redistribute_latency_s"],
                 **gemm_fit)
    host = os.uname().nodename if hasattr(os, "uname") else "host"
    cluster = Cluster(nodes=1, devices_per_node=ranks, device=dev, spec=host)
    measurements = {
        "host": host, "torch": str(torch.__version__), "backend": coll["backend"], "ranks": ranks,
        "quick": quick, "threads_per_rank": 1, "wall_time_s": None,
        "matmul": matmul, "memory_copy": copy, "collectives": coll["results"], "fits": fits,
        "concurrent_matmul": concurrent, "compute_share_per_rank": share, "op_latency_alone_s": op_latency,
        "in_step_collectives": in_step, "dtensor": dtensor,
        "notes": "inter_node_* repeat the loopback figures: one host, off-node links not measured",
    }
    d = cluster_to_dict(cluster, name=f"calibrated {host}", measurements=measurements)
    measurements["wall_time_s"] = time.perf_counter() - started
    write_resources(d, out_path)
    return d


def default_ranks() -> int:
    return max(2, min(4, os.cpu_count() or 2))


def summary(d: dict, out_path: str) -> str:
    m = d["measurements"]
    dev = d["groups"][0]["device"]
    lines = [f"partita calibrate: {m['ranks']} ranks on {m['host']} ({m['backend']}), "
             f"{m['wall_time_s']:.1f} s{' (quick)' if m['quick'] else ''}"]
    for dt in ("fp32", "bf16"):
        rows = m["matmul"][dt]
        best = max(rows, key=lambda r: r["flops_per_s"])
        lines.append(f"  matmul {dt}: peak {best['flops_per_s'] / 1e9:.1f} GFLOP/s (n={best['n']}), "
                     + ", ".join(f"n={r['n']} {r['flops_per_s'] / 1e9:.1f}" for r in rows))
    lines.append(f"  matmul efficiency (fp32, mean over sizes): {dev['matmul_efficiency']:.2f}")
    lines.append(f"  memory bandwidth (copy): {m['memory_copy']['bytes_per_s'] / 1e9:.1f} GB/s")
    for kind, f in m["fits"].items():
        lines.append(f"  {kind:<15} alpha {f['alpha_s'] * 1e6:8.1f} us   beta {f['beta_bytes_per_s'] / 1e9:7.2f} GB/s"
                     f"   (rel. rms error {f['rel_rms_error']:.0%})")
    rows = [r for kind_rows in m["in_step_collectives"].values() if isinstance(kind_rows, list) for r in kind_rows]
    noisy = [r for r in rows if r["in_step_s"] is None]
    if noisy:
        lines.append(f"  warning: the machine was too noisy to measure {len(noisy)} of {len(rows)} in-step collective "
                     f"costs (their difference of wall times stayed <= 0); sync latency is the median of the rest "
                     f"({dev['sync_latency'] * 1e6:.0f} us). Re-run on a quieter machine for a firmer figure.")
    lines.append(f"  wrote {out_path}: {m['ranks']} x {dev['name']} "
                 f"(use it as: partita plan --cluster {out_path} ...)")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="partita calibrate",
                                description="Measure this machine's devices and links; write a resource list.")
    p.add_argument("--out", default="cluster.json", help="resource list to write (.json, .yaml or .yml)")
    p.add_argument("--ranks", type=int, default=None,
                   help=f"local ranks for the collectives (default min(4, cpu count), at least 2: {default_ranks()})")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repeats (~20 s)")
    args = p.parse_args(argv)
    try:
        d = calibrate(args.out, ranks=args.ranks, quick=args.quick)
    except PartitaError as e:
        print(f"partita: error: {e}", file=sys.stderr)
        return 2
    print(summary(d, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

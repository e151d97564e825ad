"""`partita calibrate`: measure this machine and write a resource list (costmodel.resources) for it.

    python -m costmodel.calibrate --out cluster.json [--ranks N] [--quick]

What is measured, and how it becomes the device of the resource list (one device = one rank process,
run as the runtime runs ranks: OMP_NUM_THREADS=1):

- matmul: n x n @ n x n for a few n, fp32 and bf16 (CUDA: on the GPU), median of repeats, 2 n^3 FLOPs.
  A CPU has no datasheet peak to hold against, so `peak_flops[dtype]` is the best rate measured and
  `matmul_efficiency` the mean over sizes of fp32 rate / fp32 peak: peak x efficiency is then the
  typical measured rate, which is what the cost model charges (`planner.strategies.node_seconds`).
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

One host is one node: off-node links cannot be measured here, so inter_node_* repeat the loopback
figures (they are unused for a one-node cluster); edit them for a multi-host resource list.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from costmodel.errors import PartitaError

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
# (latency factor, bandwidth factor) of the ring forms in costmodel.comm, for k ranks and B bytes
_FORMS = {
    "all_reduce": lambda k: (2 * (k - 1), 2 * (k - 1) / k),
    "all_gather": lambda k: (k - 1, (k - 1) / k),
    "reduce_scatter": lambda k: (k - 1, (k - 1) / k),
    "all_to_all": lambda k: (k - 1, (k - 1) / k),
    "broadcast": lambda k: (k - 1, 1.0),   # pipelined ring
    "p2p": lambda k: (1, 1.0),
}


def _settings(quick: bool) -> dict:
    if quick:
        return {"matmul_sizes": [128, 256, 512, 1024], "matmul_budget_s": 0.08, "copy_bytes": 2**27,
                "message_bytes": [2**10, 2**14, 2**18, 2**20, 2**22, 2**24], "reps": 10}
    return {"matmul_sizes": [128, 256, 512, 1024, 2048], "matmul_budget_s": 0.3, "copy_bytes": 2**29,
            "message_bytes": [2**10, 2**13, 2**16, 2**19, 2**20, 2**22, 2**24, 2**26], "reps": 25}


def _reps(reps: int, nbytes: int) -> int:
    """Fewer repeats for large messages (their time is long and steady)."""
    return reps if nbytes <= 2**20 else max(5, reps * 2**20 // nbytes)


# ------------------------------------------------------------------------------------ local device

def _sync(device):
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_matmul(sizes, dtypes=("fp32", "bf16"), budget_s: float = 0.1, device=None) -> dict:
    """{dtype: [{"n", "seconds", "flops_per_s"}]}: median time of an n x n matmul."""
    import torch
    device = device or torch.device("cpu")
    out = {}
    for name in dtypes:
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[name]
        rows = []
        for n in sizes:
            a = torch.randn(n, n, device=device).to(dtype)
            b = torch.randn(n, n, device=device).to(dtype)
            torch.mm(a, b)
            _sync(device)
            times, start = [], time.perf_counter()
            while len(times) < 3 or (time.perf_counter() - start < budget_s and len(times) < 1000):
                t0 = time.perf_counter()
                torch.mm(a, b)
                _sync(device)
                times.append(time.perf_counter() - t0)
            t = statistics.median(times)
            rows.append({"n": n, "seconds": t, "flops_per_s": 2 * n**3 / t})
        out[name] = rows
    return out


def measure_op_latency(device=None, layers: int = 64, repeats: int = 5) -> float:
    """Seconds each operator of a training step costs beyond its arithmetic: forward and backward through
    a chain of tiny Linear + GELU modules (module call, dispatch, autograd engine), divided by the
    launches the cost model charges for them (planner.strategies: 1 forward + 2 backward per operator)."""
    import torch
    import torch.nn as nn
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(8, 8), nn.GELU())]).to(device)
    x = torch.ones(4, 8, device=device)
    times = []
    for _ in range(repeats + 1):
        _sync(device)
        t0 = time.perf_counter()
        model(x).sum().backward()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:]) / (2 * layers * 3)


def measure_copy(nbytes: int, device=None, repeats: int = 5) -> dict:
    """Memory bandwidth of a large copy, read + write: 2 * bytes / seconds (best of `repeats`)."""
    import torch
    device = device or torch.device("cpu")
    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    _sync(device)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return {"bytes": nbytes, "seconds": best, "bytes_per_s": 2 * nbytes / best}


def _physical_memory() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 8 * 2**30


# ------------------------------------------------------------------------------------- collectives

def _time_collective(fn, reps: int, device) -> float:
    fn()  # warm-up (connections, buffers)
    _sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _collective_fn(kind: str, k: int, nbytes: int, group, device):
    """A closure running one collective of `nbytes` (comm.py's B) over `group` of k ranks."""
    import torch
    import torch.distributed as dist
    numel = max(k, nbytes // 4 // k * k)
    full = torch.ones(numel, device=device)
    part = torch.ones(numel // k, device=device)
    if kind == "all_reduce":
        return lambda: dist.all_reduce(full, group=group)
    if kind == "all_gather":  # *_single: the names of torch >= 2.12, *_tensor before
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(full, part, group=group)
    if kind == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(part, full, group=group)
    if kind == "all_to_all":
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full, group=group)
    if kind == "broadcast":
        return lambda: dist.broadcast(full, group_src=0, group=group)
    raise AssertionError(kind)


def _worker(rank: int, world: int, init_file: str, message_bytes: list, reps: int, result_path: str):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.FileStore(init_file, world),
                            rank=rank, world_size=world)
    results: dict = {}
    # every rank multiplies at once: a rank's share of the host when all of them compute (ranks may
    # outnumber cores), the rate the planner should charge; the slowest rank's rate
    n = 512
    a = torch.randn(n, n, device=device)
    torch.mm(a, a)
    dist.barrier()
    # sustained over a window, not per matmul: a rank that waits for a core between matmuls loses that
    # time too (per-matmul medians credited 4 ranks on 2 cores with 0.74 of a core each)
    reps = 60
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        torch.mm(a, a)
    _sync(device)
    t = (time.perf_counter() - t0) / reps
    rate = torch.tensor([2 * n ** 3 / t], dtype=torch.float64, device=device)
    dist.all_reduce(rate, op=dist.ReduceOp.MIN)
    results["concurrent_matmul"] = [{"ranks": world, "n": n, "flops_per_s": float(rate.item())}]
    for k in range(2, world + 1):
        group = dist.new_group(list(range(k)))
        if rank < k:
            times = {kind: [_time_collective(_collective_fn(kind, k, b, group, device), _reps(reps, b), device)
                            for b in message_bytes] for kind in COLLECTIVES}
            flat = torch.tensor([t for kind in COLLECTIVES for t in times[kind]], dtype=torch.float64,
                                device=device)
            dist.all_reduce(flat, op=dist.ReduceOp.MAX, group=group)  # the slowest rank's time
            flat = flat.tolist()
            for i, kind in enumerate(COLLECTIVES):
                row = flat[i * len(message_bytes):(i + 1) * len(message_bytes)]
                results.setdefault(kind, []).extend(
                    {"ranks": k, "bytes": _effective_bytes(b, k), "seconds": t} for b, t in zip(message_bytes, row))
        dist.barrier()
    # point to point: ping-pong between ranks 0 and 1, half the round trip
    p2p = []
    for b in message_bytes:
        buf = torch.ones(max(1, b // 4), device=device)
        if rank == 0:
            def ping():
                dist.send(buf, dst=1)
                dist.recv(buf, src=1)
        elif rank == 1:
            def ping():
                dist.recv(buf, src=0)
                dist.send(buf, dst=0)
        if rank < 2:
            t = _time_collective(ping, _reps(reps, b), device) / 2
            p2p.append({"ranks": 2, "bytes": buf.numel() * 4, "seconds": t})
    results["p2p"] = p2p
    dist.barrier()
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump({"backend": dist.get_backend(), "results": results}, f)
    dist.destroy_process_group()


def _effective_bytes(nbytes: int, k: int) -> int:
    return max(k, nbytes // 4 // k * k) * 4


def measure_collectives(ranks: int, message_bytes, reps: int) -> dict:
    """Spawn `ranks` local processes and time the collectives among 2..ranks of them."""
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory(prefix="partita-calibrate-") as tmp:
        init_file, result_path = os.path.join(tmp, "store"), os.path.join(tmp, "result.json")
        old = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the spawned ranks
        try:
            mp.start_processes(_worker, args=(ranks, init_file, list(message_bytes), reps, result_path),
                               nprocs=ranks, join=True, start_method="spawn")
        finally:
            if old is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = old
        with open(result_path) as f:
            return json.load(f)


# ------------------------------------------------------------------------------------------ fitting

def fit_alpha_beta(kind: str, points: list[dict]) -> dict:
    """Least-squares alpha, beta of `kind`'s form over points {"ranks", "bytes", "seconds"}, on relative
    error, with alpha >= 0 and beta > 0. Returns alpha, beta and the fit's relative RMS error."""
    form = _FORMS[kind]
    a = np.array([[form(p["ranks"])[0], form(p["ranks"])[1] * p["bytes"]] for p in points], dtype=float)
    t = np.array([p["seconds"] for p in points], dtype=float)
    w = a / t[:, None]                       # rows scaled by 1/t: minimise sum ((pred - t) / t)^2
    ones = np.ones(len(t))
    coef, *_ = np.linalg.lstsq(w, ones, rcond=None)
    if coef[1] <= 0:                         # no bandwidth term left: fit latency only, beta huge
        coef = np.array([max(0.0, float(np.linalg.lstsq(w[:, :1], ones, rcond=None)[0][0])), 1e-15])
    elif coef[0] < 0:                        # negative latency: fit bandwidth only
        coef = np.array([0.0, float(np.linalg.lstsq(w[:, 1:], ones, rcond=None)[0][0])])
    pred = a @ coef
    rel_rms = float(np.sqrt(np.mean(((pred - t) / t) ** 2)))
    return {"alpha_s": float(coef[0]), "beta_bytes_per_s": float(1 / coef[1]), "rel_rms_error": rel_rms,
            "form": kind}


# --------------------------------------------------------------------------------------------- main

def calibrate(out_path, ranks: int | None = None, quick: bool = False) -> dict:
    """Measure this machine, write its resource list to `out_path` (JSON or YAML) and return it."""
    import torch
    from costmodel.hardware import DEVICES, Cluster, Device
    from costmodel.resources import cluster_to_dict, write_resources

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
    coll = measure_collectives(ranks, s["message_bytes"], s["reps"])
    concurrent = coll["results"].pop("concurrent_matmul")[0]
    fits = {kind: fit_alpha_beta(kind, pts) for kind, pts in coll["results"].items() if pts}

    peak = {dt: max(r["flops_per_s"] for r in rows) for dt, rows in matmul.items()}
    # a rank's share when all ranks compute at once (below 1 when ranks outnumber cores)
    alone = next((r["flops_per_s"] for r in matmul["fp32"] if r["n"] == concurrent["n"]), peak["fp32"])
    share = min(1.0, concurrent["flops_per_s"] / alone)
    peak = {dt: v * share for dt, v in peak.items()}
    op_latency = measure_op_latency(device)
    efficiency = statistics.mean(r["flops_per_s"] / peak["fp32"] for r in matmul["fp32"])
    ar = fits["all_reduce"]
    base = DEVICES["cpu"]
    if cuda:
        memory = float(torch.cuda.get_device_properties(0).total_memory)
        reserved = 2 * 2**30 if memory > 4 * 2**30 else memory / 4
        host_bw = base.host_bw
        host_memory = _physical_memory() / max(1, torch.cuda.device_count())  # offload room per GPU
        name = torch.cuda.get_device_name(0)
    else:
        memory = _physical_memory() / ranks
        reserved = min(base.reserved_bytes, memory / 4)
        host_bw = copy["bytes_per_s"]
        host_memory = 0.0  # a CPU's memory already is host memory: nothing to offload to
        name = "cpu"
    dev = Device(name=name, peak_flops={"bf16": peak["bf16"], "fp32": peak["fp32"]}, memory_bytes=memory,
                 mem_bandwidth=copy["bytes_per_s"], intra_node_bw=ar["beta_bytes_per_s"],
                 inter_node_bw=ar["beta_bytes_per_s"], matmul_efficiency=min(1.0, efficiency),
                 intra_node_latency=ar["alpha_s"], inter_node_latency=ar["alpha_s"], host_bw=host_bw,
                 reserved_bytes=reserved, host_memory_bytes=host_memory, op_latency=op_latency / share)
    host = os.uname().nodename if hasattr(os, "uname") else "host"
    cluster = Cluster(nodes=1, devices_per_node=ranks, device=dev, spec=host)
    measurements = {
        "host": host, "torch": str(torch.__version__), "backend": coll["backend"], "ranks": ranks,
        "quick": quick, "threads_per_rank": 1, "wall_time_s": None,
        "matmul": matmul, "memory_copy": copy, "collectives": coll["results"], "fits": fits,
        "concurrent_matmul": concurrent, "compute_share_per_rank": share, "op_latency_alone_s": op_latency,
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

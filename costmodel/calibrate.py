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
import json
import math
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from partita.costmodel.errors import PartitaError

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
                "message_bytes": [2**10, 2**14, 2**18, 2**20, 2**22, 2**24], "reps": 10,
                "extra": {"in_step": {"reps": 3, "iters": 6}, "dtensor": {"repeats": 5}}}
    return {"matmul_sizes": [128, 256, 512, 1024, 2048], "matmul_budget_s": 0.3, "copy_bytes": 2**29,
            "message_bytes": [2**10, 2**13, 2**16, 2**19, 2**20, 2**22, 2**24, 2**26], "reps": 25,
            "extra": {"in_step": {"reps": 5, "iters": 10}, "dtensor": {"repeats": 15}}}


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
    return statistics.median(times[1:]) / (2 * layers * LAUNCHES_PER_NODE)


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


def _worker(rank: int, world: int, init_file: str, message_bytes: list, reps: int, result_path: str,
            extra: dict | None = None):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    extra = extra or {}
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
    results["in_step"] = measure_in_step(rank, world, device, **extra.get("in_step", {}))
    dist.barrier()
    singles = [dist.new_group([i]) for i in range(world)]  # every rank creates every group
    pairs = [dist.new_group([i, i + 1]) for i in range(0, world - 1, 2)]
    results["dtensor"] = measure_dtensor(singles[rank], pairs[rank // 2] if rank // 2 < len(pairs) else None,
                                         device, **extra.get("dtensor", {}))
    dist.barrier()
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump({"backend": dist.get_backend(), "results": results}, f)
    dist.destroy_process_group()


def measure_in_step(rank: int, world: int, device, burst_s: float = 20e-3, reps: int = 5, iters: int = 12,
                    nbytes: int = 1024) -> dict:
    """What one small collective adds to a training step (for Device.sync_latency), on every rank at once.

    A step issues its collectives between stretches of compute, not back to back. Every rank runs
    `iters` compute bursts (matmuls taking about `burst_s` while all ranks compute), once alone and once
    with one collective of `nbytes` after each burst; the collective's in-step cost is the difference of
    the two loops' wall times over `iters` (median of `reps` alternating pairs, both loops between
    barriers, so it includes waiting for the slowest peer). Measured for an all-reduce in groups of k
    consecutive ranks for every k > 1 dividing the ranks (all groups at once: every rank busy, as in a
    tensor- or data-parallel step), likewise an all-gather and a reduce-scatter (sequence parallelism,
    FSDP), and for a one-way send/recv between rank pairs (pipeline p2p).
    Returns {"burst_s", "all_reduce": [...], "all_gather": [...], "reduce_scatter": [...], "p2p": [...]},
    each row with the in-step seconds and the same call's back-to-back median ("back_to_back_s");
    `sync_latency` turns them into the device figure.

    The burst is long (20 ms, a transformer layer's forward on a CPU core): with more ranks than cores
    the ranks drift apart by up to a scheduler time slice during a long stretch of compute, and the
    collective then waits for the last of them (measured on a 2-core host: 4 ranks' small all-reduce
    adds ~3 ms after 1-4 ms bursts, 5-10 ms after 10-40 ms bursts; 2 ranks ~2 ms either way)."""
    import torch
    import torch.distributed as dist
    n = 128
    a = torch.randn(n, n, device=device)
    for _ in range(20):
        torch.mm(a, a)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(100):
        torch.mm(a, a)
    _sync(device)
    per = torch.tensor([(time.perf_counter() - t0) / 100], dtype=torch.float64, device=device)
    dist.all_reduce(per, op=dist.ReduceOp.MAX)  # while all ranks compute: the slowest one's matmul
    mms = max(1, round(burst_s / float(per.item())))

    def loop(coll) -> float:
        dist.barrier()
        t = time.perf_counter()
        for _ in range(iters):
            for _ in range(mms):
                torch.mm(a, a)
            if coll is not None:
                coll()
        _sync(device)
        dist.barrier()
        return time.perf_counter() - t

    def in_step(coll) -> tuple[float | None, float]:
        # A difference of two wall times: under load the median can come out <= 0, an impossible cost.
        # Take more pairs (up to IN_STEP_ROUNDS rounds of `reps`) until the median is positive; if it
        # never is, the machine was too noisy to see this collective: None, never a negative figure.
        diffs = []
        for _ in range(IN_STEP_ROUNDS):
            for _ in range(reps):
                base = loop(None)
                diffs.append((loop(coll) - base) / iters)
            flag = torch.tensor([statistics.median(diffs)], dtype=torch.float64, device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # every rank takes the same decision
            if float(flag) > 0:
                break
        hot = _time_collective(coll, max(10, 2 * iters), device)
        pair = torch.tensor([statistics.median(diffs), hot], dtype=torch.float64, device=device)
        dist.all_reduce(pair, op=dist.ReduceOp.MAX)
        t = float(pair[0])
        return (t if t > 0 else None), float(pair[1])

    out: dict = {"burst_s": mms * float(per.item()), "matmuls_per_burst": mms, "bytes": nbytes,
                 "all_reduce": [], "p2p": []}
    for kind in ("all_reduce", "all_gather", "reduce_scatter"):
        out[kind] = []
    for k in range(2, world + 1):
        if world % k:
            continue
        groups = [dist.new_group(list(range(i, i + k))) for i in range(0, world, k)]
        mine = groups[rank // k]
        for kind in ("all_reduce", "all_gather", "reduce_scatter"):
            t, hot = in_step(_collective_fn(kind, k, nbytes, mine, device))
            out[kind].append({"ranks": k, "groups": world // k, "bytes": _effective_bytes(nbytes, k), "in_step_s": t,
                              "back_to_back_s": hot, "sync_s": None if t is None else max(0.0, t - hot)})
    buf = torch.ones(max(1, nbytes // 4), device=device)
    if world % 2 == 0:
        peer, turn = rank ^ 1, [0]

        def one_way():  # alternate the direction, so that each rank sends as often as it receives
            turn[0] += 1
            if (rank % 2 == 0) == (turn[0] % 2 == 0):
                dist.send(buf, dst=peer)
            else:
                dist.recv(buf, src=peer)
        t, hot = in_step(one_way)
        out["p2p"].append({"ranks": 2, "groups": world // 2, "bytes": buf.numel() * 4, "in_step_s": t,
                           "back_to_back_s": hot, "sync_s": None if t is None else max(0.0, t - hot)})
    return out


IN_STEP_ROUNDS = 3
"""Rounds of `reps` loop pairs measure_in_step takes at most before it calls a collective unmeasurable."""
DTENSOR_LAYERS = 8
LAUNCHES_PER_NODE = 3
"""Launches the planner counts per node and training step: 1 forward + planner.strategies.BACKWARD_LAUNCHES
(measure_op_latency and measure_dtensor divide by it; tests check that the two agree)."""
"""Column-parallel -> row-parallel Linear pairs in `measure_dtensor`'s model."""


def measure_dtensor(group, pair, device, repeats: int = 15, hidden: int = 16) -> dict:
    """DTensor's overheads, on every rank at once: per operator (Device.sharded_op_latency) and per
    parameter of an optimizer step (Device.sharded_param_latency) on a one-rank mesh (`group`, so no
    data moves and only the dispatch is timed), and per redistribution (Device.redistribute_latency)
    on a two-rank mesh (`pair`; None for a rank left without a partner).

    A stack of DTENSOR_LAYERS Megatron MLPs (Linear -> GELU -> Linear, tiny, so arithmetic is negligible)
    runs forward and backward, once as plain modules and once with the Linears split by torch's
    ColwiseParallel / RowwiseParallel (what the runtime's tensor parallelism applies); then AdamW
    (foreach=False, as runtime.recipe) steps over its parameters. With L = 2 DTENSOR_LAYERS sharded
    Linears and P parameters (weights and biases):

        sharded_op_latency    = (t_dtensor - t_plain)_{forward + backward} / (L LAUNCHES_PER_NODE)
        sharded_param_latency = (t_dtensor - t_plain)_{optimizer step} / P

    i.e. per launch as planner.strategies counts launches (one forward, BACKWARD_LAUNCHES backward per
    node), so the planner charges launches x (op_latency + sharded_op_latency) for a node run on DTensors.
    A one-rank mesh skips redistributions (they cost ~35 us there); on the two-rank mesh each of the
    three a tensor-parallel layer issues -- Shard(1) -> Replicate (all-gather), Partial -> Replicate
    (all-reduce), Partial -> Shard(1) (reduce-scatter), of a [2, 8, hidden] tensor -- is timed back to back
    beside the same collective called directly on the group (alternating, the fastest of each: the
    difference is CPU work, which the occasional wake-up delay of a gloo call would only blur):

        redistribute_latency = median over the three of (min t_redistribute - min t_collective)

    (DTensor's redistribution planning, functional-collective launch and wrapping; the planner charges it
    once per tensor-parallel collective, forward or backward). Medians of repeats; the slowest rank's
    (all ranks measure at once: ranks beyond the cores share them, as in training)."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(hidden, 2 * hidden), nn.Linear(2 * hidden, hidden)

        def forward(self, x):
            return self.fc2(F.gelu(self.fc1(x)))

    mesh = DeviceMesh.from_group(group, device.type)
    x = torch.randn(2, 4, hidden, device=device, requires_grad=True)
    times = {}
    for split in (False, True):
        model = nn.Sequential(*[MLP() for _ in range(DTENSOR_LAYERS)]).to(device)
        if split:
            for mlp in model:
                parallelize_module(mlp, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, foreach=False)

        def step():
            model(x).sum().backward()

        for _ in range(2):  # warm-up: DTensor's sharding-propagation caches, optimizer state
            step()
            opt.step()
        fb, st = [], []
        for _ in range(repeats):
            _sync(device)
            t0 = time.perf_counter()
            step()
            _sync(device)
            t1 = time.perf_counter()
            opt.step()
            _sync(device)
            fb.append(t1 - t0)
            st.append(time.perf_counter() - t1)
        times[split] = (statistics.median(fb), statistics.median(st), sum(1 for _ in model.parameters()))
    redistribute = _measure_redistribute(pair, device, hidden, repeats) if pair is not None else {}
    dist.barrier()
    launches = 2 * DTENSOR_LAYERS * LAUNCHES_PER_NODE
    extra = [max(0.0, r["redistribute_s"] - r["collective_s"]) for r in redistribute.values()]
    per = torch.tensor([max(0.0, times[True][0] - times[False][0]) / launches,
                        max(0.0, times[True][1] - times[False][1]) / times[True][2],
                        statistics.median(extra) if extra else 0.0], dtype=torch.float64, device=device)
    dist.all_reduce(per, op=dist.ReduceOp.MAX)
    return {"op_latency_s": float(per[0]), "param_latency_s": float(per[1]), "redistribute_latency_s": float(per[2]),
            "redistribute": redistribute, "sharded_linears": 2 * DTENSOR_LAYERS,
            "launches": launches, "parameters": times[True][2],
            "forward_backward_s": {"plain": times[False][0], "dtensor": times[True][0]},
            "optimizer_step_s": {"plain": times[False][1], "dtensor": times[True][1]}}


def _measure_redistribute(pair, device, hidden: int, repeats: int) -> dict:
    """`measure_dtensor`'s redistributions on the two-rank mesh of `pair`, each beside its collective."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
    mesh = DeviceMesh.from_group(pair, device.type)
    whole = torch.randn(2, 8, hidden, device=device)
    shard = DTensor.from_local(whole.chunk(2, dim=1)[0].contiguous(), mesh, (Shard(1),), run_check=False)
    partial = DTensor.from_local(whole, mesh, (Partial(),), run_check=False)
    flat, half = whole.reshape(-1), whole.reshape(-1)[: whole.numel() // 2].clone()
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    cases = {
        "shard_to_replicate": (lambda: shard.redistribute(placements=(Replicate(),)).to_local(),
                               lambda: gather(flat, half, group=pair)),
        "partial_to_replicate": (lambda: partial.redistribute(placements=(Replicate(),)).to_local(),
                                 lambda: dist.all_reduce(flat, group=pair)),
        "partial_to_shard": (lambda: partial.redistribute(placements=(Shard(1),)).to_local(),
                             lambda: scatter(half, flat, group=pair)),
    }
    out = {}
    for name, (redistribute, collective) in cases.items():
        r, c = [], []
        redistribute(), collective()  # warm-up
        for _ in range(2 * repeats):  # alternating; the fastest of each: the CPU work, without the
            for fn, times in ((redistribute, r), (collective, c)):  # occasional wake-up delays of gloo
                _sync(device)
                t0 = time.perf_counter()
                fn()
                _sync(device)
                times.append(time.perf_counter() - t0)
        out[name] = {"redistribute_s": min(r), "collective_s": min(c)}
    return out


def _effective_bytes(nbytes: int, k: int) -> int:
    return max(k, nbytes // 4 // k * k) * 4


def measure_collectives(ranks: int, message_bytes, reps: int, extra: dict | None = None) -> dict:
    """Spawn `ranks` local processes and time the collectives among 2..ranks of them, back to back and
    in-step, and DTensor's overheads (`measure_in_step`, `measure_dtensor`, with the keyword arguments
    extra["in_step"], extra["dtensor"])."""
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory(prefix="partita-calibrate-") as tmp:
        init_file, result_path = os.path.join(tmp, "store"), os.path.join(tmp, "result.json")
        old = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the spawned ranks
        try:
            mp.start_processes(_worker, args=(ranks, init_file, list(message_bytes), reps, result_path, extra),
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


def fit_gemm_curve(rows: list[dict], peak: float) -> dict:
    """Device.gemm_half_dim and matmul_efficiency from square n x n matmuls (costmodel.kernels: the rate
    of an n^3 GEMM is peak e_max s(n)^3, s(n) = n / (n + x_half)): least squares on log rate over a grid
    of x_half, e_max from the largest sizes' fit. `rows` are measure_matmul's {"n", "flops_per_s"};
    `peak` the FLOP/s the efficiency is a fraction of. Returns gemm_half_dim, and e_max under the key
    matmul_efficiency_of_measured_peak."""
    ns = np.array([r["n"] for r in rows], dtype=float)
    rate = np.array([r["flops_per_s"] for r in rows], dtype=float)
    best = (float("inf"), 0.0, 1.0)
    for half in np.concatenate([[0.0], np.geomspace(1, 4096, 97)]):
        s3 = (ns / (ns + half)) ** 3
        log_e = float(np.mean(np.log(rate / (peak * s3))))
        err = float(np.sum((np.log(peak * np.exp(log_e) * s3) - np.log(rate)) ** 2))
        if err < best[0] - 1e-12:
            best = (err, float(half), float(np.exp(log_e)))
    return {"gemm_half_dim": best[1], "matmul_efficiency_of_measured_peak": min(1.0, best[2])}


def sync_latency(in_step: dict, fits: dict) -> float:
    """Device.sync_latency from `measure_in_step`'s rows and the back-to-back alpha-beta `fits`.

    The cost model charges a row's collective in a step as (costmodel.comm, module docstring)

        t = f_a(k) (alpha + s) + f_b(k) B / beta        (f_a, f_b: the form's factors, _FORMS)

    so each row i (all-reduce, all-gather, reduce-scatter at every group size k; p2p), with t_i the
    measured in-step seconds and h_i = f_a alpha + f_b B / beta its back-to-back fit, gives one estimate
    s_i = (t_i - h_i) / f_a,i, and

        s = median_i s_i                                  (clamped at 0)

    The median, not a least-squares fit: a single in-step timing is a scheduling event, occasionally
    several times its usual size or near zero (a weighted fit follows whichever row is smallest)."""
    estimates = []
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "p2p"):
        fit = fits.get(kind)
        for r in in_step.get(kind, []):
            if fit is None:
                continue
            if r["in_step_s"] is None:  # too noisy to measure (measure_in_step)
                continue
            fa, fb = _FORMS[kind](r["ranks"])
            h = fa * fit["alpha_s"] + fb * r["bytes"] / fit["beta_bytes_per_s"]
            estimates.append((r["in_step_s"] - h) / fa)
    return max(0.0, statistics.median(estimates)) if estimates else 0.0


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
    lines = [f"partita calibrate: {m['ranks']} ranks on {m['host']} ({m['backend']}), "
             f"{m['wall_time_s']:.1f} s{' (quick)' if m['quick'] else ''}"]
    for dt in ("fp32", "bf16"):
        rows = m["matmul"][dt]
        best = max(rows, key=lambda r: r["flops_per_s"])
        lines.append(f"  matmul {dt}: peak {best['flops_per_s'] / 1e9:.1f} GFLOP/s (n={best['n']}), "
                     + ", ".join(f"n={r['n']} {r['flops_per_s'] / 1e9:.1f}" for r in rows))
    lines.append(peak_line(m, dev))
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
    p.add_argument("--quick", action="store_true", help="fewer matrix and message sizes and repetitions than a "
                   "full calibration (the summary says how long it took)")
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

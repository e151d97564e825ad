"""`partita calibrate`, several ranks: collectives timed among 2..N local rank processes (gloo on CPU, NCCL with
one rank per GPU), back to back and inside a step, and DTensor's overheads (costmodel.calibrate.dtensor).
costmodel.calibrate's module docstring says how each becomes a Device field."""
from __future__ import annotations

import json
import os
import statistics
import tempfile
import time

from partita.costmodel.calibrate.dtensor import measure_dtensor
from partita.costmodel.calibrate.local import sync_device
from partita.costmodel.errors import PartitaError

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
IN_STEP_ROUNDS = 3
"""Rounds of `reps` loop pairs measure_in_step takes at most before it calls a collective unmeasurable."""


def _reps(reps: int, nbytes: int) -> int:
    """Fewer repeats for large messages (their time is long and steady)."""
    return reps if nbytes <= 2**20 else max(5, reps * 2**20 // nbytes)



def _time_collective(fn, reps: int, device) -> float:
    fn()  # warm-up (connections, buffers)
    sync_device(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync_device(device)
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


def rank_device(rank: int, gpus: int):
    """The device of rank `rank`: GPU `rank` on a GPU host (one rank per GPU: NCCL refuses two ranks on one
    GPU, calibrate.choose_ranks never starts more ranks than GPUs), else the CPU."""
    import torch
    if not gpus:
        return torch.device("cpu")
    assert rank < gpus, (rank, gpus)  # calibrate.choose_ranks
    return torch.device("cuda", rank)


def _worker(rank: int, world: int, init_file: str, message_bytes: list, reps: int, result_path: str,
            extra: dict | None = None, gpus: int = 0):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    extra = extra or {}
    device = rank_device(rank, gpus)
    if gpus:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if gpus else "gloo", store=dist.FileStore(init_file, world),
                            rank=rank, world_size=world)
    results: dict = {}
    reps = 60  # (the matmuls' window, and the collectives' repeats below: `reps` as passed is not used)
    results["concurrent_matmul"] = [_concurrent_matmul(world, device, reps)]
    for k in range(2, world + 1):
        group = dist.new_group(list(range(k)))
        if rank < k:
            for kind, rows in _back_to_back(k, message_bytes, reps, group, device).items():
                results.setdefault(kind, []).extend(rows)
        dist.barrier()
    results["p2p"] = _ping_pong(rank, message_bytes, reps, device)
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


def _concurrent_matmul(world: int, device, reps: int) -> dict:
    """Every rank multiplies at once: a rank's share of the host when all of them compute (ranks may
    outnumber cores), the rate the planner should charge; the slowest rank's rate."""
    import torch
    import torch.distributed as dist
    n = 512
    a = torch.randn(n, n, device=device)
    torch.mm(a, a)
    dist.barrier()
    # sustained over a window, not per matmul: a rank that waits for a core between matmuls loses that
    # time too (per-matmul medians credited 4 ranks on 2 cores with 0.74 of a core each)
    sync_device(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        torch.mm(a, a)
    sync_device(device)
    t = (time.perf_counter() - t0) / reps
    rate = torch.tensor([2 * n ** 3 / t], dtype=torch.float64, device=device)
    dist.all_reduce(rate, op=dist.ReduceOp.MIN)
    return {"ranks": world, "n": n, "flops_per_s": float(rate.item())}


def _back_to_back(k: int, message_bytes: list, reps: int, group, device) -> dict[str, list[dict]]:
    """{collective: rows} of each collective timed back to back among the k ranks of `group`, per message
    size: the slowest rank's median seconds."""
    import torch
    import torch.distributed as dist
    times = {kind: [_time_collective(_collective_fn(kind, k, b, group, device), _reps(reps, b), device)
                    for b in message_bytes] for kind in COLLECTIVES}
    flat = torch.tensor([t for kind in COLLECTIVES for t in times[kind]], dtype=torch.float64, device=device)
    dist.all_reduce(flat, op=dist.ReduceOp.MAX, group=group)  # the slowest rank's time
    flat = flat.tolist()
    out = {}
    for i, kind in enumerate(COLLECTIVES):
        row = flat[i * len(message_bytes):(i + 1) * len(message_bytes)]
        out[kind] = [{"ranks": k, "bytes": _effective_bytes(b, k), "seconds": t} for b, t in zip(message_bytes, row)]
    return out


def _ping_pong(rank: int, message_bytes: list, reps: int, device) -> list[dict]:
    """Point to point: ping-pong between ranks 0 and 1, half the round trip (rows on those two ranks)."""
    import torch
    import torch.distributed as dist
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
    return p2p


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
    steps = _Bursts(device, burst_s, reps, iters)
    out: dict = {"burst_s": steps.mms * steps.per, "matmuls_per_burst": steps.mms, "bytes": nbytes,
                 "all_reduce": [], "p2p": []}
    for kind in ("all_reduce", "all_gather", "reduce_scatter"):
        out[kind] = []
    for k in range(2, world + 1):
        if world % k:
            continue
        groups = [dist.new_group(list(range(i, i + k))) for i in range(0, world, k)]
        mine = groups[rank // k]
        for kind in ("all_reduce", "all_gather", "reduce_scatter"):
            t, hot = steps.in_step(_collective_fn(kind, k, nbytes, mine, device))
            out[kind].append(_in_step_row(k, world // k, _effective_bytes(nbytes, k), t, hot))
    buf = torch.ones(max(1, nbytes // 4), device=device)
    if world % 2 == 0:
        t, hot = steps.in_step(_one_way(rank, buf))
        out["p2p"].append(_in_step_row(2, world // 2, buf.numel() * 4, t, hot))
    return out


def _in_step_row(ranks: int, groups: int, nbytes: int, t: float | None, hot: float) -> dict:
    return {"ranks": ranks, "groups": groups, "bytes": nbytes, "in_step_s": t, "back_to_back_s": hot,
            "sync_s": None if t is None else max(0.0, t - hot)}


def _one_way(rank: int, buf):
    """A one-way send/recv with the neighbouring rank (rank ^ 1), alternating the direction, so that each rank
    sends as often as it receives."""
    import torch.distributed as dist
    peer, turn = rank ^ 1, [0]

    def one_way():
        turn[0] += 1
        if (rank % 2 == 0) == (turn[0] % 2 == 0):
            dist.send(buf, dst=peer)
        else:
            dist.recv(buf, src=peer)
    return one_way


class _Bursts:
    """measure_in_step's compute bursts: `mms` matmuls of about `burst_s` while every rank computes (`per`: the
    slowest rank's matmul), run `iters` times with or without a collective after each."""

    def __init__(self, device, burst_s: float, reps: int, iters: int):
        import torch
        import torch.distributed as dist
        self.device, self.reps, self.iters = device, reps, iters
        n = 128
        self.a = a = torch.randn(n, n, device=device)
        for _ in range(20):
            torch.mm(a, a)
        sync_device(device)
        t0 = time.perf_counter()
        for _ in range(100):
            torch.mm(a, a)
        sync_device(device)
        per = torch.tensor([(time.perf_counter() - t0) / 100], dtype=torch.float64, device=device)
        dist.all_reduce(per, op=dist.ReduceOp.MAX)  # while all ranks compute: the slowest one's matmul
        self.per = float(per.item())
        self.mms = max(1, round(burst_s / self.per))

    def loop(self, coll) -> float:
        """Wall seconds of `iters` bursts, each followed by `coll` (None: alone), between barriers."""
        import torch
        import torch.distributed as dist
        dist.barrier()
        t = time.perf_counter()
        for _ in range(self.iters):
            for _ in range(self.mms):
                torch.mm(self.a, self.a)
            if coll is not None:
                coll()
        sync_device(self.device)
        dist.barrier()
        return time.perf_counter() - t

    def in_step(self, coll) -> tuple[float | None, float]:
        """(`coll`'s in-step seconds, its back-to-back seconds), the slowest rank's.

        A difference of two wall times: under load the median can come out <= 0, an impossible cost.
        Take more pairs (up to IN_STEP_ROUNDS rounds of `reps`) until the median is positive; if it
        never is, the machine was too noisy to see this collective: None, never a negative figure."""
        import torch
        import torch.distributed as dist
        diffs = []
        for _ in range(IN_STEP_ROUNDS):
            for _ in range(self.reps):
                base = self.loop(None)
                diffs.append((self.loop(coll) - base) / self.iters)
            flag = torch.tensor([statistics.median(diffs)], dtype=torch.float64, device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # every rank takes the same decision
            if float(flag) > 0:
                break
        hot = _time_collective(coll, max(10, 2 * self.iters), self.device)
        pair = torch.tensor([statistics.median(diffs), hot], dtype=torch.float64, device=self.device)
        dist.all_reduce(pair, op=dist.ReduceOp.MAX)
        t = float(pair[0])
        return (t if t > 0 else None), float(pair[1])


def _effective_bytes(nbytes: int, k: int) -> int:
    return max(k, nbytes // 4 // k * k) * 4


def measure_collectives(ranks: int, message_bytes, reps: int, extra: dict | None = None, gpus: int = 0) -> dict:
    """Spawn `ranks` local processes (on a GPU host, `gpus` > 0: rank r on GPU r over NCCL; else gloo on the
    CPU) and time the collectives among 2..ranks of them, back to back and in-step, and DTensor's overheads
    (`measure_in_step`, `measure_dtensor`, with the keyword arguments extra["in_step"], extra["dtensor"]).
    A rank that fails is a PartitaError naming it and its last line (never the ranks' tracebacks)."""
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory(prefix="partita-calibrate-") as tmp:
        init_file, result_path = os.path.join(tmp, "store"), os.path.join(tmp, "result.json")
        old = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the spawned ranks
        try:
            mp.start_processes(_worker, args=(ranks, init_file, list(message_bytes), reps, result_path, extra, gpus),
                               nprocs=ranks, join=True, start_method="spawn")
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
            last = [line for line in str(e).splitlines() if line.strip()]
            raise PartitaError(f"calibration rank {e.error_index} of {ranks} failed: "
                               f"{last[-1].strip() if last else 'no message'}") from None
        finally:
            if old is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = old
        with open(result_path) as f:
            return json.load(f)

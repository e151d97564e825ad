"""`partita calibrate`: DTensor's CPU overheads per operator, per parameter and per redistribution, measured on
every rank at once (Device.sharded_op_latency, sharded_param_latency, redistribute_latency)."""
from __future__ import annotations

import statistics
import time

from partita.costmodel.calibrate.local import LAUNCHES_PER_NODE, sync_device

DTENSOR_LAYERS = 8
"""Column-parallel -> row-parallel Linear pairs in `measure_dtensor`'s model."""


def measure_dtensor(group, pair, device, repeats: int = 15, hidden: int = 16) -> dict:
    """DTensor's overheads, on every rank at once: per operator (Device.sharded_op_latency) and per
    parameter of an optimizer step (Device.sharded_param_latency) on a one-rank mesh (`group`, so no
    data moves and only the dispatch is timed), and per redistribution (Device.redistribute_latency)
    on a two-rank mesh (`pair`; None for a rank left without a partner).

    A stack of DTENSOR_LAYERS Megatron MLPs (Linear -> GELU -> Linear, tiny, so arithmetic is negligible)
    runs forward and backward, once as plain modules and once with the Linears split by torch's
    ColwiseParallel / RowwiseParallel (what the runtime's tensor parallelism applies); then AdamW
    (foreach=False, as runtime.loop.recipe) steps over its parameters. With L = 2 DTENSOR_LAYERS sharded
    Linears and P parameters (weights and biases):

        sharded_op_latency    = (t_dtensor - t_plain)_{forward + backward} / (L LAUNCHES_PER_NODE)
        sharded_param_latency = (t_dtensor - t_plain)_{optimizer step} / P

    i.e. per launch as planner.enumerate.strategies counts launches (one forward, BACKWARD_LAUNCHES backward per
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
    times = _plain_and_split(group, device, repeats, hidden)
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



def _plain_and_split(group, device, repeats: int, hidden: int) -> dict:
    """{split: (forward + backward seconds, optimizer step seconds, parameters)} of the MLP stack as plain
    modules (False) and with its Linears split Colwise / Rowwise on the one-rank mesh of `group` (True)."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = DeviceMesh.from_group(group, device.type)
    x = torch.randn(2, 4, hidden, device=device, requires_grad=True)
    times = {}
    for split in (False, True):
        model = _mlp_stack(hidden).to(device)
        if split:
            for mlp in model:
                parallelize_module(mlp, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, foreach=False)
        times[split] = (*_step_times(model, opt, x, device, repeats), sum(1 for _ in model.parameters()))
    return times


def _mlp_stack(hidden: int):
    """DTENSOR_LAYERS Megatron MLPs (Linear -> GELU -> Linear) of width `hidden`, in a Sequential."""
    import torch.nn as nn
    import torch.nn.functional as F

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(hidden, 2 * hidden), nn.Linear(2 * hidden, hidden)

        def forward(self, x):
            return self.fc2(F.gelu(self.fc1(x)))

    return nn.Sequential(*[MLP() for _ in range(DTENSOR_LAYERS)])


def _step_times(model, opt, x, device, repeats: int) -> tuple[float, float]:
    """(median forward + backward seconds, median optimizer step seconds) of `model` on `x`, after a warm-up."""
    def step():
        model(x).sum().backward()

    for _ in range(2):  # warm-up: DTensor's sharding-propagation caches, optimizer state
        step()
        opt.step()
    fb, st = [], []
    for _ in range(repeats):
        sync_device(device)
        t0 = time.perf_counter()
        step()
        sync_device(device)
        t1 = time.perf_counter()
        opt.step()
        sync_device(device)
        fb.append(t1 - t0)
        st.append(time.perf_counter() - t1)
    return statistics.median(fb), statistics.median(st)


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
                sync_device(device)
                t0 = time.perf_counter()
                fn()
                sync_device(device)
                times.append(time.perf_counter() - t0)
        out[name] = {"redistribute_s": min(r), "collective_s": min(c)}
    return out

"""The training loop every hand-written baseline shares (what a user would write without partita).

Run under torchrun: `python -m torch.distributed.run --standalone --nproc-per-node W -m
benchmarks.handwritten.ddp --model M --global-batch B --steps N --out out.json`. Trains exactly what
`partita.runtime.train` trains -- the same model built with the same seed, the same synthetic token batches
(a torch.Generator seeded with seed * 1_000_003 + step, each data-parallel rank taking its contiguous
slice), AdamW(lr, weight_decay=0, foreach=False), mean token cross-entropy -- and times each step the
same way: from zero_grad to the loss all-reduced and read back, the slowest rank's time per step.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from partita.costmodel.models import resolve_model


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--global-batch", type=int, required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def setup(args):
    """Process group, the model spec, and the model (fp32, same init on every rank)."""
    dist.init_process_group("gloo")
    spec = resolve_model(args.model)
    torch.manual_seed(args.seed)
    return spec, spec.build().float()


def batch(spec, global_batch: int, step: int, seed: int, dp_rank: int, dp: int):
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    tokens = torch.randint(0, spec.vocab, (global_batch, spec.seq_len + 1), generator=gen)
    n = global_batch // dp
    tokens = tokens[dp_rank * n:(dp_rank + 1) * n]
    return tokens[:, :-1], tokens[:, 1:]


def train(args, spec, model: nn.Module, dp_rank: int, dp: int) -> None:
    """Train `model` (already wrapped for its parallelism); rank 0 writes losses and step times."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, foreach=False)
    losses, times = [], []
    for step in range(args.steps):
        inputs, targets = batch(spec, args.global_batch, step, args.seed, dp_rank, dp)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())
        loss.backward()
        opt.step()
        held = loss.detach().clone()
        dist.all_reduce(held, op=dist.ReduceOp.AVG)
        losses.append(held.item())
        times.append(time.perf_counter() - t0)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"losses": losses, "step_times_s": slowest.tolist(), "world_size": dist.get_world_size(),
                       "omp_threads": os.environ.get("OMP_NUM_THREADS")}, f)


def finish() -> None:
    """After the model is gone: free FSDP's reference cycles while the process group exists, then end it."""
    gc.collect()
    dist.destroy_process_group()

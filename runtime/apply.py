"""Apply a plan to the user's module and run this rank's share of one training step.

- pp == 1: the user's module runs as written; tp layers are sharded in place (runtime.tp); data
  parallelism is DDP when tp == 1, else gradients are averaged over the dp group by hand; with
  num_microbatches > 1 gradients are accumulated over contiguous microbatches, each loss divided by
  their number, so gradients equal those of the full batch.
- pp > 1: the module is split into stages (runtime.pp), tp applied inside this rank's stage, the plan's
  schedule runs the microbatches, and gradients are averaged over the dp group.

Test hook: PARTITA_TEST_SKIP_GRAD_SYNC=1 skips the data-parallel gradient averaging (a deliberately
wrong run, so tests can check that --verify catches it).
"""
from __future__ import annotations

import contextlib
import os
from collections import defaultdict

import torch
import torch.distributed as dist
import torch.nn as nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.nn.parallel import DistributedDataParallel as DDP

from planner.plan import Plan
from runtime import pp as pipeline_parallel
from runtime.data import microbatches
from runtime.memory import local
from runtime.mesh import Topology
from runtime.recipe import lm_loss
from runtime.tp import apply_tp


def skip_grad_sync() -> bool:
    return os.environ.get("PARTITA_TEST_SKIP_GRAD_SYNC") == "1"


@torch.no_grad()
def average_grads(params: list[torch.Tensor], group, size: int) -> None:
    """All-reduce the local gradient shards over `group` and divide by its size (one bucket per dtype)."""
    buckets: dict[torch.dtype, list[torch.Tensor]] = defaultdict(list)
    for p in params:
        if p.grad is not None:
            g = local(p.grad)
            buckets[g.dtype].append(g)
    for grads in buckets.values():
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=group)
        flat.div_(size)
        for g, avg in zip(grads, _unflatten_dense_tensors(flat, grads)):
            g.copy_(avg)


class LocalExecutor:
    """pp == 1: one module per rank (tensor- and/or data-parallel), optional gradient accumulation."""

    def __init__(self, model: nn.Module, plan: Plan, topo: Topology):
        self.topo, self.n_micro = topo, plan.schedule.num_microbatches
        if topo.tp > 1:
            apply_tp(model, plan.placements, topo.mesh["tp"])
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.ddp = None
        if topo.dp > 1 and topo.tp == 1:
            self.ddp = DDP(model, process_group=topo.group("dp"),
                           device_ids=[topo.device.index] if topo.device.type == "cuda" else None)
        self.module = self.ddp if self.ddp is not None else model
        self.holds_loss = topo.tp_rank == 0

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Forward and backward of this rank's batch; returns its mean loss (detached)."""
        total = torch.zeros((), device=self.topo.device)
        xs, ys = microbatches(inputs, self.n_micro), microbatches(targets, self.n_micro)
        for i, (x, y) in enumerate(zip(xs, ys)):
            last = i == self.n_micro - 1
            sync = self.ddp is not None and last and not skip_grad_sync()
            ctx = self.ddp.no_sync() if self.ddp is not None and not sync else contextlib.nullcontext()
            with ctx:
                loss = lm_loss(self.module(x), y) / self.n_micro
                loss.backward()
            total += loss.detach()
        if self.topo.dp > 1 and self.ddp is None and not skip_grad_sync():
            average_grads(self.params, self.topo.group("dp"), self.topo.dp)
        return total


class PipelineExecutor:
    """pp > 1: this rank runs one pipeline stage under the plan's schedule."""

    def __init__(self, model: nn.Module, plan: Plan, topo: Topology, seq_len: int):
        self.topo = topo
        example = torch.zeros(plan.schedule.micro_batch_size, seq_len, dtype=torch.long, device=topo.device)
        pipe = pipeline_parallel.split(model, plan, example)
        stage_module = pipe.get_stage_module(topo.pp_rank)
        if topo.tp > 1:
            apply_tp(stage_module, plan.placements, topo.mesh["tp"])
        self.stage, self.schedule = pipeline_parallel.build_schedule(
            pipe, plan, topo.pp_rank, topo.device, topo.group("pp"), lm_loss)
        self.params = [p for p in stage_module.parameters() if p.requires_grad]
        self.first, self.last = topo.pp_rank == 0, topo.pp_rank == topo.pp - 1
        self.holds_loss = self.last and topo.tp_rank == 0

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Run the schedule on this rank's batch; returns its mean loss on the last stage, else 0."""
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.first else ()
        kwargs = {"target": targets, "losses": losses, "return_outputs": False} if self.last else {}
        self.schedule.step(*args, **kwargs)
        if self.topo.dp > 1 and not skip_grad_sync():
            average_grads(self.params, self.topo.group("dp"), self.topo.dp)
        if not losses:
            return torch.zeros((), device=self.topo.device)
        return torch.stack([l.detach() for l in losses]).mean()


def make_executor(model: nn.Module, plan: Plan, topo: Topology, seq_len: int) -> LocalExecutor | PipelineExecutor:
    """The executor for this rank; `seq_len` shapes the example microbatch the pipeline is traced with."""
    if topo.pp > 1:
        return PipelineExecutor(model, plan, topo, seq_len)
    return LocalExecutor(model, plan, topo)

"""The runtime side of a plan's sync mode (planner.plan.sync): a hook of the trainer loop (runtime.loop.trainer)
around the backward and the optimizer step.

A mode's hook class is built with the executor and the topology (`make_hook`) and may:
- `during_backward(step)`: return a context the step's forward and backward run in (e.g. DDP's `no_sync`, for a
  mode that does not average gradients every step);
- `before_optimizer(step)` / `after_optimizer(step)`: run around the optimizer step (e.g. average the parameters
  across the data-parallel replicas every H steps: local SGD; an outer optimizer step: DiLoCo).

A new mode is one entry in HOOKS under the name of its registry entry (planner.plan.sync.SYNC_MODES), beside its
price function (planner.estimate.sync.PRICES).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from partita.costmodel import PartitaError
from partita.planner.plan.sync import (COMPRESSED, DILOCO, LOCALSGD, POWERSGD, STREAMING, SYNC_MODES, SYNCHRONOUS, Sync,
                                       accepted, has_outer_step)
from partita.runtime.loop.sync.diloco import DiLoCo, LocalSGD, StreamingDiLoCo
from partita.runtime.loop.sync.hook import SyncHook


class Synchronous(SyncHook):
    """Synchronous data parallelism: nothing to do around the optimizer step. DDP averages the gradients in
    its buckets during the backward, FSDP reduce-scatters them there, and an executor without either averages
    them at the end of its step (runtime.parallel.apply.LocalExecutor.step); pipeline stages do the same per
    stage. By the optimizer step every replica holds the same averaged gradients."""


def bf16_all_reduce(group, bucket):
    """A DDP communication hook: the bucket cast to bf16 and divided by the group's size, summed over the group,
    and the mean cast back into the bucket -- what torch's own `bf16_compress_hook`
    (torch.distributed.algorithms.ddp_comm_hooks.default_hooks) does, which DDP accepts on CUDA/NCCL and XPU only
    (a TypeError on gloo), so the runtime registers this one everywhere."""
    buffer = bucket.buffer()
    wire = buffer.to(torch.bfloat16).div_(dist.get_world_size(group))
    future = dist.all_reduce(wire, group=group, async_op=True).get_future()

    def back(done):
        buffer.copy_(done.value()[0])
        return buffer

    return future.then(back)


class Compressed(SyncHook):
    """Synchronous data parallelism with the gradients all-reduced in bf16 (`bf16_all_reduce`, a DDP communication
    hook): each bucket is rounded to bf16, divided by the group's size, summed, and cast back, so every replica
    steps on the same rounded mean. Runs on DDP plans (zero 0, data parallelism only:
    planner.plan.executable.sync_refusal); one replica has nothing to all-reduce."""

    def __init__(self, executor, topo, options: dict, optimizer=None):
        super().__init__(executor, topo, options, optimizer)
        if (ddp := ddp_to_hook(executor, COMPRESSED)) is not None:
            ddp.register_comm_hook(executor.replicas, bf16_all_reduce)


def ddp_to_hook(executor, mode: str):
    """The DDP module a communication-hook mode registers its hook on; None with one replica (nothing to
    all-reduce). One line when the plan has no DDP (it shards or splits the model)."""
    if executor is None or executor.n_replicas <= 1:
        return None
    if executor.ddp is None:
        raise PartitaError(f"the {mode} sync mode runs on data-parallel plans with DDP (zero 0, no tensor or "
                           "pipeline parallelism) today; this plan shards or splits the model")
    return executor.ddp


class PowerSGD(SyncHook):
    """Synchronous data parallelism with PowerSGD's low-rank gradients (Vogels et al. 2019): torch's own DDP
    communication hook (torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook) with its PowerSGDState over the
    replicas' group, rank `rank`, compressing after `start` plain all-reduce steps (from step start + 1), error
    feedback and warm start on (torch's defaults). Runs on DDP plans (zero 0, data parallelism only); one replica
    has nothing to all-reduce. A resumed run starts the hook's state afresh: `start` more plain steps and no error carried over
    (torch's state holds numpy's random generator and per-bucket tensors keyed by DDP's bucket order, which a new
    process rebuilds), so it is not bit-exact with an uninterrupted run -- partita says so when it resumes."""

    def __init__(self, executor, topo, options: dict, optimizer=None):
        super().__init__(executor, topo, options, optimizer)
        if (ddp := ddp_to_hook(executor, POWERSGD)) is None:
            return
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
        sync = Sync(mode=POWERSGD, options=options)
        self.state = psgd.PowerSGDState(process_group=executor.replicas,
                                        matrix_approximation_rank=sync.option("rank"),
                                        start_powerSGD_iter=sync.option("start"))
        ddp.register_comm_hook(self.state, psgd.powerSGD_hook)
        self.start = sync.option("start")

    def load_state(self, path) -> None:
        if getattr(self, "state", None) is not None and self.topo.rank == 0:
            from partita.runtime.loop.console import STDOUT
            STDOUT.line(f"note: powersgd starts afresh after a resume: {self.start} plain all-reduce steps, then "
                        "compression with no error feedback carried over (not bit-exact with an uninterrupted run)")


HOOKS: dict[str, type[SyncHook]] = {SYNCHRONOUS: Synchronous, COMPRESSED: Compressed, DILOCO: DiLoCo,
                                     STREAMING: StreamingDiLoCo, POWERSGD: PowerSGD, LOCALSGD: LocalSGD}
"""A hook class per registered sync mode (the same names as planner.plan.sync.SYNC_MODES)."""


def make_hook(sync: Sync, executor, topo, optimizer=None) -> SyncHook:
    """The hook of the plan's sync mode, for the trainer loop (`optimizer`: the inner optimizer, whose state a
    mode may checkpoint)."""
    if sync.mode not in SYNC_MODES or SYNC_MODES[sync.mode].hook not in HOOKS:
        raise PartitaError(f"sync mode {sync.mode!r} has no runtime hook; accepted: {accepted()}")
    return HOOKS[SYNC_MODES[sync.mode].hook](executor, topo, dict(sync.options), optimizer)


def run_refusal(sync: Sync, checkpoint_every: int = 0, steps: int = 0, verify: bool = False) -> str | None:
    """One line when the run cannot honour the plan's sync mode with these flags; None when it can."""
    if sync.mode == COMPRESSED and verify:
        return ("--verify compares with single-process fp32 training, and the compressed sync mode rounds every "
                "averaged gradient to bf16 by design: run without --verify, or compare with a synchronous plan's run")
    if sync.mode == POWERSGD and verify and steps > sync.option("start"):
        start = sync.option("start")
        return (f"--verify compares with single-process training, and powersgd compresses the gradients from step "
                f"{start + 1} on (an approximation by design): run without --verify, or at most {start} steps")
    if has_outer_step(sync.mode) and verify and sync.option("bits") == 4:
        return (f"--verify compares with single-process training, and {sync.mode} at bits 4 rounds every outer "
                "change to 4 bits by design: run without --verify, or verify the plan at bits 16 or 32")
    if sync.mode == STREAMING:
        same = (sync.option("every"), sync.option("fragments"), sync.option("delay"), sync.option("alpha"),
                sync.option("outer_lr"), sync.option("outer_momentum")) == (1, 1, 0, 0, 1, 0)
        if verify and not same:
            return ("--verify compares with single-process training, which streaming DiLoCo reproduces only with H = 1, "
                    "1 fragment, delay 0, alpha 0, outer_lr 1 and outer_momentum 0; run without --verify")
        return None  # a checkpoint may fall anywhere, and the run may end anywhere (StreamingDiLoCo)
    if sync.mode not in (DILOCO, LOCALSGD):
        return None
    every, mode = sync.option("every"), sync.mode
    if checkpoint_every % every:
        return (f"--checkpoint-every {checkpoint_every} is not a multiple of the plan's {mode} H = {every}: {mode} "
                f"writes checkpoints after outer steps only, where the replicas agree; use --checkpoint-every "
                f"{every * max(1, round(checkpoint_every / every))}")
    if steps % every:
        return (f"--steps {steps} is not a multiple of the plan's {mode} H = {every}: the replicas would end the run "
                f"apart, after {steps % every} inner step(s) with no outer step; run {steps - steps % every or every} "
                "steps or re-plan with --sync-every")
    if verify and (every, sync.option("outer_lr"), sync.option("outer_momentum")) != (1, 1, 0):
        return (f"--verify compares with single-process training, which {mode} reproduces only with H = 1"
                + (", outer_lr 1 and outer_momentum 0" if mode == DILOCO else "") + "; run without --verify")
    return None

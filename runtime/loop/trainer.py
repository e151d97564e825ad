"""The trainer's step loop, with its hooks (runtime.loop.session builds them and runs it).

Each step k + 1 of first_step + 1 .. steps, in this order:

    batch                  this rank's data-parallel slice of step k's batch (depends on (seed, step) only)
    forward + backward     executor.step, under the saved-activation tracker and every hook's `during_backward`
    after_backward         may replace the loss (faults inject here: runtime.failure.faults)
    loss and stop          one all-reduce: the global mean loss and any rank's stop request
                           (guards.reduce_loss_and_stop); a non-finite loss stops before the optimizer (NonFiniteLoss)
    before_optimizer       the sync mode's hook (runtime.loop.sync), then the recipe's: the step's learning rate
                           recorded, the gradients clipped by their global norm (runtime.loop.clip)
    optimizer step
    after_optimizer        the sync mode's hook, the recipe's schedule steps, then faults after the update
    after_step             the progress line (runtime.loop.progress); the step's time and loss are recorded
    checkpoint             every N-th step, the last, and a stopping one (runtime.checkpoint)
    stop                   record the step for a signal handler (runtime.failure.stop); a requested stop raises Stopped

After the last step the parameters are checked finite on every rank (NonFiniteParameters). Hooks run in the
order they are given; a hook overrides only the points it needs (StepHook's are no-ops).
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field

import torch

from partita.runtime import checkpoint as ckpt
from partita.runtime.checkpoint import snapshot
from partita.runtime.loop import memory
from partita.runtime.loop.clip import clip_grad_norm
from partita.runtime.loop.console import STDOUT, stderr_line
from partita.runtime.loop.recipe import Recipe, current_lr, make_schedule
from partita.runtime.failure.guards import NonFiniteLoss, NonFiniteParameters, Stopped, params_finite, reduce_loss_and_stop
from partita.runtime.failure.stop import record_step


class StepHook:
    """One hook of the loop: each method is a point of the step (module docstring); the defaults do nothing."""

    def during_backward(self, step: int):
        """A context the step's forward and backward run in."""
        return contextlib.nullcontext()

    def after_backward(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        """This rank's loss of the step, before it is reduced; returns the loss the step goes on with."""
        return loss

    def before_optimizer(self, step: int) -> None:
        pass

    def after_optimizer(self, step: int) -> None:
        pass

    def after_step(self, step: int, loss: float, seconds: float) -> None:
        """The step's global mean loss and its time."""

    def checkpoint(self, step: int, stopping: int) -> None:
        """After the step (`stopping`: the signal a rank asked to stop with, or 0)."""


@dataclass
class History:
    """What the loop has done: shared with the hooks, and what a failed run keeps (guards.keep_partial)."""

    start: int = 0
    """Steps done before this run (a resumed checkpoint's step)."""
    losses: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    learning_rates: list[float] = field(default_factory=list)
    """The learning rate of each step (runtime.loop.recipe's schedule)."""
    grad_norms: list[float] = field(default_factory=list)
    """With clipping, each step's global gradient norm before clipping."""
    evals: list[list] = field(default_factory=list)
    """[step, held-out loss] of each evaluation (runtime.loop.evaluate)."""
    kept: list[tuple[int, str]] = field(default_factory=list)
    """(step, path) of the checkpoints this run stands on, oldest first."""
    saves: list[str] = field(default_factory=list)
    """The checkpoints this run saved."""
    save_time: float = 0.0
    resumed_from: str | None = None
    """The checkpoint this run resumed from, or the snapshot in memory (runtime.checkpoint.recovery)."""
    state_bytes: int = 0
    """The largest model-state bytes (parameters, gradients, optimizer state) seen after a step."""

    @property
    def newest(self) -> str | None:
        return self.kept[-1][1] if self.kept else None


def device_sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Trainer:
    """The step loop over an executor (runtime.parallel.apply) and its optimizer."""

    executor: object
    opt: torch.optim.Optimizer
    data: object
    topo: object
    steps: int
    stop: object
    """The run's StopSignal (runtime.failure.stop): its `requested` signal travels in the loss all-reduce."""
    saved: memory.SavedActivations
    hooks: list[StepHook]
    checkpointing: bool = False
    """Whether the run saves checkpoints (what a stop line says about them)."""
    checkpoint_root: str | None = None
    """Where they go: recorded with each step (runtime.failure.stop.record_step) so that a launcher that outlives
    its peers can name the newest committed one, even one this node had not yet recorded."""

    def run(self, history: History) -> None:
        for k in range(history.start, self.steps):
            self.step(k + 1, history)
        if not params_finite(self.executor, self.topo):  # what the run hands back (and --verify compares) is finite
            raise NonFiniteParameters(self.steps, history.kept)

    def step(self, step: int, history: History) -> None:
        executor, topo = self.executor, self.topo
        batch = tuple(t.to(topo.device) for t in self.data.shard(step - 1, topo.dp_rank, topo.dp))
        device_sync(topo.device)
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        with self.saved, contextlib.ExitStack() as around:
            for hook in self.hooks:
                around.enter_context(hook.during_backward(step))
            loss = executor.step(batch)
        for hook in self.hooks:
            loss = hook.after_backward(step, loss)
        value, stopping = reduce_loss_and_stop(executor, loss, topo, self.stop.requested)
        if not math.isfinite(value):
            raise NonFiniteLoss(step, value, history.kept)
        self._optimizer_step(step)
        history.losses.append(value)
        device_sync(topo.device)
        history.times.append(time.perf_counter() - t0)
        for hook in self.hooks:
            hook.after_step(step, value, history.times[-1])
        history.state_bytes = max(history.state_bytes, memory.state_bytes(executor.params, self.opt))
        stopping = stopping if step < self.steps else 0  # asked during the last step: the run is done
        for hook in self.hooks:
            hook.checkpoint(step, stopping)
        record_step(step, self.steps, history.newest, self.checkpointing, self.checkpoint_root)
        if stopping:
            raise Stopped(stopping, step, self.steps, history.newest, self.checkpointing)

    def _optimizer_step(self, step: int) -> None:
        for hook in self.hooks:
            hook.before_optimizer(step)
        self.opt.step()
        for hook in self.hooks:
            hook.after_optimizer(step)


class RecipeHook(StepHook):
    """The training recipe around the optimizer step (runtime.loop.recipe): records the step's learning rate,
    clips the gradients by the whole model's norm (runtime.loop.clip; `pp_group`: the pipeline's, whose stages
    each hold a part), and steps the schedule after the update. `start`: the steps done before (a resume)."""

    def __init__(self, opt, recipe: Recipe, start: int, executor, pp_group, history: History):
        self.opt, self.recipe, self.executor, self.pp_group, self.history = opt, recipe, executor, pp_group, history
        self.schedule = make_schedule(opt, recipe, start)

    def before_optimizer(self, step):
        self.history.learning_rates.append(current_lr(self.opt))
        if self.recipe.clip_grad_norm is not None:
            self.history.grad_norms.append(clip_grad_norm(self.executor.params, self.recipe.clip_grad_norm,
                                                          self.pp_group, self.executor.norm_params))

    def after_optimizer(self, step):
        self.schedule.step()


class FaultHook(StepHook):
    """The test faults of PARTITA_FAULTS (runtime.failure.faults): during the step (exit, raise, signal, a NaN loss)
    and after the update (an infinite weight)."""

    def __init__(self, faults, params):
        self.faults, self.params = faults, params

    def after_backward(self, step, loss):
        self.faults.exit_during_step(step)
        self.faults.raise_during_step(step)
        self.faults.signal_during_step(step)
        return loss * float("nan") if self.faults.nan_at(step) else loss

    def after_optimizer(self, step):
        self.faults.inf_after_update(step, self.params)


class ProgressHook(StepHook):
    """A progress line per step (runtime.loop.progress)."""

    def __init__(self, progress, device: torch.device):
        self.progress, self.device = progress, device

    def after_step(self, step, loss, seconds):
        self.progress.step(step, loss, seconds, self.device)


class CheckpointHook(StepHook):
    """Saves a checkpoint after every `every`-th step, the last one, and one a rank asked to stop after; never one
    holding a non-finite weight (NonFiniteParameters). Appends to the history's `kept` and `saves`."""

    def __init__(self, history: History, every: int, steps: int, directory, executor, opt, manifest: dict, topo,
                 faults, keep: int, sync=None):
        self.history, self.every, self.steps, self.directory = history, every, steps, directory
        self.executor, self.opt, self.manifest, self.topo, self.faults, self.keep = \
            executor, opt, manifest, topo, faults, keep
        self.sync = sync
        """The sync mode's hook (runtime.loop.sync): whether a step may be saved, and its own state to save."""

    def checkpoint(self, step, stopping):
        if not (self.every and (step % self.every == 0 or step == self.steps or stopping)):
            return
        if self.sync is not None and (why := self.sync.save_refusal(step)):
            if self.topo.rank == 0:  # a stop inside a window: the newest checkpoint stays the run's last
                STDOUT.line(f"note: no checkpoint after step {step}: {why}")
            return
        h, t1 = self.history, time.perf_counter()
        if not params_finite(self.executor, self.topo):
            raise NonFiniteParameters(step, h.kept)
        extra = self.sync.checkpoint_state() if self.sync is not None else {}
        h.kept.append((step, str(ckpt.save(self.directory, step, self.executor.modules, self.opt, self.manifest,
                                            self.topo.rank, self.faults, keep=self.keep, extra=extra))))
        h.save_time += time.perf_counter() - t1
        h.saves.append(h.kept[-1][1])


class SnapshotHook(StepHook):
    """A copy of the training state in the node's memory after every `every`-th step (runtime.checkpoint.snapshot),
    agreed on by every rank at the first, written in a thread overlapped with the next step's forward and backward
    and joined before its optimizer step (and at the last step or a stop); says once when the node's tmpfs refused
    one."""

    def __init__(self, every: int, steps: int, root, executor, opt, info: dict, topo):
        self.every, self.steps, self.root, self.executor, self.opt, self.info = every, steps, root, executor, opt, info
        self.topo, self.writer, self.said = topo, None, False

    def checkpoint(self, step, stopping):
        if step % self.every == 0:
            rank = self.topo.rank
            state = {**ckpt.train_state(self.executor.modules, self.opt), **ckpt.rng_state(rank)}
            if self.writer is None:
                self.writer = snapshot.Writer(self.root, snapshot.agree(state, self.root, rank), rank)
            self.writer.start(step, state, {**self.info, "time": time.time()})
        if step == self.steps or stopping:
            self.before_optimizer(step)

    def before_optimizer(self, step):
        if self.writer is not None and (note := self.writer.wait()) and not self.said:
            self.said = True
            stderr_line(f"partita: rank {self.topo.rank}: {note}")

"""The base class of a sync mode's hook (runtime.loop.sync): what the trainer loop (runtime.loop.trainer) calls
around the backward and the optimizer step, and what checkpoints and the end of a run ask of it."""
from __future__ import annotations

import contextlib

import torch

from partita.runtime.loop.trainer import StepHook


class SyncHook(StepHook):
    """A sync mode's hook: built from the executor (its `params`, `ddp`, `replicas` group), the topology and the
    plan's options for the mode."""

    def __init__(self, executor, topo, options: dict, optimizer=None):
        self.executor, self.topo, self.options, self.optimizer = executor, topo, options, optimizer

    def during_backward(self, step: int):
        return contextlib.nullcontext()

    def save_refusal(self, step: int) -> str | None:
        """Why no checkpoint may be written after `step` (None: it may)."""
        return None

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        """The mode's own tensors a checkpoint holds beside the model and optimizer state ({}: none)."""
        return {}

    def load_state(self, path) -> None:
        """Collective: fill the mode's own state from the checkpoint at `path` (after the model and optimizer)."""

    def close(self) -> None:
        """Collective, at the end of a run that trained to its last step or stopped at a step boundary: finish the
        mode's communication still in flight, before the process groups go."""

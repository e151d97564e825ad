"""What stops a run before its last step, and what a stopped run keeps (runtime.loop.session's training loop).

- NonFiniteLoss: a NaN or infinite loss stops the run before that step's optimizer update (every rank sees
  the same reduced loss); NonFiniteParameters: an update left a NaN or infinite weight, checked before each
  save and at the end, so no checkpoint ever holds one. Their message says what the checkpoints hold: the
  newest one, when it was saved right before the failing step, holds the weights that step started from, and
  is not called good.
- Stopped: a signal asked to stop (runtime.failure.stop); the request travels in the loss all-reduce
  (`reduce_loss_and_stop`), so every rank stops after the same step.
- `keep_partial`: a run that fails after training began keeps its loss history: rank 0 prints the last
  losses and writes them all to --losses-out with the failure.
"""
from __future__ import annotations

import json
import signal

import torch
import torch.distributed as dist

from partita.costmodel import PartitaError
from partita.runtime.loop import memory
from partita.runtime.loop.console import STDOUT
from partita.runtime.failure.stop import SIGNALS

EXIT_OK, EXIT_VERIFY, EXIT_ERROR, EXIT_NONFINITE = 0, 1, 2, 3


def _kept(step: int, checkpoints: list[tuple[int, str]]) -> str:
    """What the run's checkpoints hold when step `step` went wrong: the newest one, if it was saved right
    before that step, holds the weights that step started from, and is not called good."""
    if not checkpoints:
        return "; no checkpoint was saved"
    (last, path), before = checkpoints[-1], checkpoints[:-1]
    if last < step - 1:
        return f"; the last good checkpoint is {path}"
    older = f"; the one before it is {before[-1][1]}" if before else "; there is none before it"
    return f"; the newest checkpoint, {path}, holds the weights step {step} started from{older}"


class NonFiniteLoss(PartitaError):
    """The loss of a step is NaN or infinite; the run stops before that step's optimizer update."""

    def __init__(self, step: int, value: float, checkpoints: list[tuple[int, str]]):
        super().__init__(f"loss is {value} at step {step}: training stopped before that step's optimizer "
                         f"update{_kept(step, checkpoints)}")
        self.step = step


def stop_line(signum: int, step: int, steps: int, checkpoint: str | None, checkpointing: bool,
              how: str = "") -> str:
    """What a run stopped by signal `signum` after step `step` of `steps` says (`how`: how it stopped, when
    not at the step boundary itself), and where it resumes from."""
    where = (f"; resume from {checkpoint} with --resume" if checkpoint else
             "; no checkpoint was saved (--checkpoint-dir and --checkpoint-every keep one)" if not checkpointing
             else "; no checkpoint was saved yet")
    return f"stopped by {signal.Signals(signum).name} after step {step} of {steps}{how}{where}"


class Stopped(PartitaError):
    """Training stopped at a step boundary because a signal asked for it (raised alike on every rank;
    runtime.failure.stop)."""

    def __init__(self, signum: int, step: int, steps: int, checkpoint: str | None, checkpointing: bool):
        super().__init__(stop_line(signum, step, steps, checkpoint, checkpointing))
        self.signum, self.step = signum, step

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class NonFiniteParameters(NonFiniteLoss):
    """A parameter became NaN or infinite in an optimizer update: the run stops before saving it."""

    def __init__(self, step: int, checkpoints: list[tuple[int, str]]):
        PartitaError.__init__(self, f"parameters are not finite after the optimizer update of step {step} (a "
                                    f"learning rate too large?): training stopped without saving them"
                                    f"{_kept(step + 1, checkpoints)}")
        self.step = step


def reduce_loss_and_stop(executor, loss: torch.Tensor, topo, requested: int | None) -> tuple[float, int]:
    """runtime.loop.stepping.reduce_loss and the stop request in one all-reduce: (the step's global mean loss, the signal that
    asked any rank to stop, or 0). Summed: [loss, ranks asked, sum of their signal numbers] (ranks asked by
    different signals stop as by SIGTERM)."""
    held = (loss if executor.holds_loss else torch.zeros_like(loss)).detach().reshape(())
    dtype = held.dtype if held.dtype in (torch.float32, torch.float64) else torch.float32
    asked = 1.0 if requested else 0.0
    t = torch.stack([held.to(dtype), torch.tensor(asked, dtype=dtype, device=held.device),
                     torch.tensor(asked * (requested or 0), dtype=dtype, device=held.device)])
    dist.all_reduce(t)
    value, ranks, signals = t.tolist()
    signum = round(signals / ranks) if ranks else 0
    return value / (topo.dp * topo.cp), (signum if signum in SIGNALS else signal.SIGTERM if ranks else 0)


def params_finite(executor, topo) -> bool:
    """Collective: whether every rank's parameters (its local shards) are all finite."""
    bad = torch.zeros(1, device=topo.device)
    with torch.no_grad():
        for p in executor.params:
            if not torch.isfinite(memory.local(p)).all():
                bad += 1
                break
    dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    return bad.item() == 0


PARTIAL_ROWS = 20
"""Loss rows a failed run prints (the last ones); --losses-out keeps them all."""


def keep_partial(opts, prep, topo, history, run_id: str | None, error: BaseException) -> None:
    """A run that fails after training began: rank 0 prints the losses of the steps done and writes them
    to --losses-out with the failure, so the history survives the failure. `history`: runtime.loop.trainer's."""
    if topo.rank != 0:
        return
    losses, start, checkpoints = history.losses, history.start, history.saves
    if opts.print_report and losses:
        shown = losses[-PARTIAL_ROWS:]
        first = start + len(losses) - len(shown)
        lines = ["step  loss", *(f"{first + i + 1:>4}  {v:.8f}" for i, v in enumerate(shown))]
        if first > start:
            lines.insert(1, f"  (steps {start + 1}-{first}: in --losses-out)" if opts.losses_out else "  ...")
        STDOUT.line(*lines)
    if opts.losses_out:
        code = (error.exit_code if isinstance(error, Stopped) else EXIT_NONFINITE if isinstance(error, NonFiniteLoss)
                else EXIT_ERROR if isinstance(error, PartitaError) else 1)
        with open(opts.losses_out, "w") as f:
            json.dump({"losses": losses, "first_step": start, "failure": str(error).splitlines()[0] if str(error)
                       else type(error).__name__, "exit_code": code, "checkpoints": checkpoints, "run_id": run_id,
                       "attempt": prep.attempt + 1, "restarts": prep.attempt,
                       "resumed_from": history.resumed_from}, f, indent=2)

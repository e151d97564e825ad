"""`--eval-data D [--eval-every N] [--eval-batches K]`: the loss on held-out data while training.

After every N-th step and after the last, each rank runs the model forward only -- in eval mode (no dropout,
BatchNorm on its running statistics), without gradients -- on its data-parallel slice of the first K batches of
D (the same K every time, so the figures compare), and the global mean loss is one all-reduce, as a training
step's is. D takes what --data takes (a token file, or `package.module:factory`) and is batched like it, at the
plan's global batch. Evaluation draws no random numbers, so the training losses of a run are the same with it and
without it (tests/e2e/test_evaluation.py).

A pipelined plan runs its schedule forward only (torch's `eval`: the schedule without its backward actions); the
loss is the last stage's.
"""
from __future__ import annotations

import torch

from partita.runtime.loop.console import STDOUT
from partita.runtime.failure.guards import reduce_loss_and_stop
from partita.runtime.failure.hang import still_going
from partita.runtime.loop.trainer import StepHook


def refusal(opts) -> str | None:
    """Why this run cannot evaluate as asked, or None."""
    if opts.eval_data is None:
        return "--eval-every and --eval-batches need --eval-data" if opts.eval_every or opts.eval_batches != 1 else None
    if opts.eval_every < 0 or opts.eval_batches < 1:
        return "--eval-every must be >= 0 and --eval-batches at least 1"
    return None


class EvalHook(StepHook):
    """Evaluates after every `every`-th step and the last (module docstring); appends (step, loss) to `out`."""

    def __init__(self, executor, data, topo, steps: int, every: int, batches: int, out: list, console: bool):
        self.executor, self.data, self.topo = executor, data, topo
        self.steps, self.every, self.batches, self.out, self.console = steps, every, batches, out, console

    def after_step(self, step, loss, seconds):
        if step == self.steps or (self.every and step % self.every == 0):
            value = evaluate(self.executor, self.data, self.topo, self.batches)
            self.out.append([step, value])
            if self.console:
                STDOUT.line(f"eval after step {step}: loss {value:.6g} ({self.batches} held-out batch"
                            f"{'es' if self.batches > 1 else ''})")


def evaluate(executor, data, topo, batches: int) -> float:
    """The global mean loss of the first `batches` batches of `data`, forward only, in eval mode."""
    modes = [(m, m.training) for module in executor.modules for m in module.modules()]
    for module in executor.modules:
        module.eval()
    try:
        total = 0.0
        for k in range(batches):
            batch = tuple(t.to(topo.device) for t in data.shard(k, topo.dp_rank, topo.dp))
            with torch.no_grad():
                loss = executor.evaluate(batch)
            total += reduce_loss_and_stop(executor, loss, topo, None)[0]
            still_going()  # --hang-timeout: a long evaluation is no hang (runtime.failure.hang)
        return total / batches
    finally:
        for m, training in modes:
            m.train(training)

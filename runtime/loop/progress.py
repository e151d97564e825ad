"""Progress while training: the one formatter of per-step lines, shared by `partita run` and the Python API
(both train through runtime.loop.session), and the optional TensorBoard scalars.

Rank 0 reports (the loss is the step's global mean, which every rank already holds); the other ranks stay
silent, and each still writes its own error file on failure (runtime.loop.report).

    step    10/3000  loss 5.53421  0.0352 s/step  7,270 tokens/s  mem 318.1 MiB  eta 1m45s

- `step`: this step of the run's `steps` (a resumed run counts on from its checkpoint);
- the step time is rank 0's wall time of that step (forward, backward, gradient sync, optimizer);
- tokens/s for token models, samples/s for the others (the plan's unit: tokens when it has a sequence
  length), from that step's time;
- `mem`: the peak so far -- of the CUDA allocator on a GPU, of this process's resident set (RSS) on CPU;
- `eta`: the mean step time of this run so far (its first step, the warm-up, left out once there are
  others) times the steps left.

Lines go out after the first step, every `every` steps and after the last. On a terminal (stdout a TTY) one
status line with a bar is redrawn in place after every step instead, and kept as a line at those steps;
logs and pipes get plain lines only; `every` 0: no lines. With `tensorboard` (a directory), rank 0 also writes the scalars
loss, step_time_s, <unit>_per_s and memory_bytes for every step (torch.utils.tensorboard, which needs the
`tensorboard` package: pip install 'partita[tensorboard]').

The lines go through runtime.loop.console: a stdout that is closed or full (`| head`, `> /dev/full`, a terminal
gone) turns them off with one line on stderr, and training goes on.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from partita.costmodel.errors import PartitaError
from partita.runtime.loop.console import STDOUT, Console
from partita.runtime.loop.memory import peak_rss_bytes
from partita.runtime.loop.options import DEFAULT_LOG_EVERY as DEFAULT_EVERY

BAR = 20


def summary_writer():
    """torch's SummaryWriter class, or PartitaError (one line, before training) when tensorboard is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise PartitaError("--tensorboard needs the tensorboard package, which is not installed: "
                           "pip install 'partita[tensorboard]' (or pip install tensorboard)") from None
    return SummaryWriter


def memory_bytes(device: torch.device) -> int:
    """The peak memory so far: the CUDA allocator's on a GPU, the process's RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return peak_rss_bytes()


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _mib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"


@dataclass
class StepReport:
    """What one progress line says."""

    step: int
    steps: int
    loss: float
    step_time_s: float
    per_s: float
    unit: str
    memory_bytes: int
    eta_s: float

    def line(self) -> str:
        width = len(str(self.steps))
        return (f"step {self.step:>{width}}/{self.steps}  loss {self.loss:.5f}  {self.step_time_s:.4f} s/step  "
                f"{self.per_s:,.0f} {self.unit}/s  mem {_mib(self.memory_bytes)}  eta {_duration(self.eta_s)}")


class Progress:
    """Per-step reporting of one run (module docstring): console lines where `console` (rank 0, a report
    wanted), TensorBoard scalars where `tensorboard` names a directory (rank 0); nothing on other ranks."""

    def __init__(self, steps: int, first_step: int, per_step: int, unit: str, *, console: bool,
                 every: int = DEFAULT_EVERY, tensorboard: str | None = None, stream=None):
        self.steps, self.first, self.per_step, self.unit = steps, first_step, per_step, unit
        self.every = every if console else 0
        self.console = Console(stream) if stream is not None else STDOUT
        self.tty = self.every > 0 and self.console.isatty()
        self.times: list[float] = []
        self.writer = summary_writer()(log_dir=tensorboard) if tensorboard else None
        self._open = False  # a status line drawn in place, not yet ended

    def report(self, step: int, loss: float, step_time_s: float, memory: int) -> StepReport:
        self.times.append(step_time_s)
        timed = self.times[1:] if len(self.times) > 1 else self.times
        eta = sum(timed) / len(timed) * (self.steps - step)
        return StepReport(step, self.steps, loss, step_time_s, self.per_step / step_time_s if step_time_s > 0 else 0.0,
                          self.unit, memory, eta)

    def step(self, step: int, loss: float, step_time_s: float, device: torch.device) -> None:
        """Called by every rank after each step; only rank 0 reports."""
        if self.every <= 0 and self.writer is None:
            return
        r = self.report(step, loss, step_time_s, memory_bytes(device))
        if self.writer is not None:
            for tag, value in (("loss", r.loss), ("step_time_s", r.step_time_s), (f"{r.unit}_per_s", r.per_s),
                               ("memory_bytes", r.memory_bytes)):
                self.writer.add_scalar(tag, value, step)
            self.writer.flush()  # on disk even if a later step fails
        if self.every <= 0:
            return
        keep = step == self.first + 1 or step % self.every == 0 or step == self.steps
        if self.tty:
            done = int(BAR * step / self.steps)
            self._open = self.console.write(f"\r[{'#' * done}{'.' * (BAR - done)}] {r.line()}\x1b[K"
                                            + ("\n" if keep else "")) and not keep
        elif keep:
            self.console.line(r.line())
        if not self.console.on:  # the console failed: no more lines (the scalars above go on)
            self.every = 0

    def close(self) -> None:
        if self._open:
            self.console.write("\n")
            self._open = False
        if self.writer is not None:
            self.writer.close()
            self.writer = None

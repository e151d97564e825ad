"""The run report rank 0 prints: losses, measured step time, tokens/s and memory beside the plan's prediction."""
from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass
class RunResult:
    losses: list[float]
    step_times: list[float]
    """Per step, the slowest rank's wall time (forward, backward, gradient sync, optimizer, loss reduce)."""
    peak_memory_bytes: int
    """Largest over ranks; what it counts is `memory_method`."""
    memory_method: str
    peak_rss_bytes: int
    tokens_per_step: int
    """Tokens of a global batch, or its samples where `unit` is "samples" (models without a sequence length)."""
    peak_reserved_bytes: int | None = None
    """On CUDA, largest over ranks: the caching allocator's peak reserved bytes (torch.cuda.max_memory_reserved:
    allocated plus what it caches, the memory a GPU's out-of-memory is decided against); None elsewhere."""
    reference_losses: list[float] | None = None
    max_abs_diff: float | None = None
    tolerance: float | None = None
    notes: list[str] = field(default_factory=list)
    applied: dict = field(default_factory=dict)
    """What the runtime applied on rank 0 (runtime.parallel.apply.Applied); pp > 1: pipeline rank 0's stages."""
    first_step: int = 0
    """Steps done before this run (resumed from a checkpoint); `losses[i]` is the loss of step first_step + i + 1."""
    resumed_from: str | None = None
    attempt: int = 0
    """torchrun's restart count (TORCHELASTIC_RESTART_COUNT) of the attempt that produced this result."""
    checkpoints: list[str] = field(default_factory=list)
    checkpoint_time_s: float = 0.0
    """Wall time of all checkpoint saves (not part of the step times)."""
    run_id: str | None = None
    """The run that owns the checkpoint directory (runtime.checkpoint.ownership); None without one."""
    param_checksum: float | None = None
    """Sum of all trained parameter elements (float64), each counted once."""
    reference_param_checksum: float | None = None
    unit: str = "tokens"
    """What the throughput counts: "tokens" or "samples" (runtime.loop.session.throughput_unit)."""
    recipe: str | None = None
    """The training recipe in one line (runtime.loop.recipe.Recipe.describe)."""
    learning_rates: list[float] = field(default_factory=list)
    """The learning rate of each step, as `losses`."""
    eval_losses: list = field(default_factory=list)
    """[step, loss] of each evaluation on --eval-data (runtime.loop.evaluate)."""
    grad_norms: list[float] | None = None
    """With clipping, each step's global gradient norm before clipping; None without."""
    reference_grad_norms: list[float] | None = None
    """--verify with clipping: the single-process reference's norms of the same steps."""
    model: object = field(default=None, repr=False, compare=False)
    """With `return_model` (runtime.api.run), on rank 0: the model the builder makes, on the CPU, holding the
    trained weights (every stage, shard and expert gathered); None on the other ranks and otherwise. Not part
    of `to_dict`."""
    saved_final: str | None = None
    """Where --save-final wrote the trained weights."""
    final_loader: str | None = None
    """How one process loads them, a line of Python with PATH for `saved_final` (runtime.checkpoint.final.loader)."""
    param_max_abs_diff: float | None = None
    """Largest |trained parameter - reference parameter| over all elements (--verify). Reported, not
    judged: Adam scales every update to about lr, so an element whose gradient is near zero takes the
    sign of its update from rounding noise (measured: up to ~3e-5 after 3 fp32 steps at lr 1e-3)."""

    @property
    def verified(self) -> bool | None:
        """None without --verify; else whether the losses are within tolerance."""
        if self.reference_losses is None:
            return None
        return self.max_abs_diff is not None and self.max_abs_diff <= self.tolerance

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time_s

    @property
    def step_time_s(self) -> float:
        """Mean step time, leaving out step 1 (warm-up) when there is more than one step."""
        times = self.step_times[1:] if len(self.step_times) > 1 else self.step_times
        return sum(times) / len(times)

    def to_json(self) -> dict:
        return {"losses": self.losses, "reference_losses": self.reference_losses,
                "max_abs_diff": self.max_abs_diff, "step_time_s": self.step_time_s,
                "step_times_s": self.step_times, f"{self.unit}_per_s": self.tokens_per_s, "unit": self.unit,
                "peak_memory_bytes": self.peak_memory_bytes, "memory_method": self.memory_method,
                "peak_reserved_bytes": self.peak_reserved_bytes,
                "peak_rss_bytes": self.peak_rss_bytes, "applied": self.applied,
                "first_step": self.first_step, "resumed_from": self.resumed_from,
                "attempt": self.attempt + 1, "restarts": self.attempt, "run_id": self.run_id,
                "checkpoints": self.checkpoints, "checkpoint_time_s": self.checkpoint_time_s,
                "param_checksum": self.param_checksum, "reference_param_checksum": self.reference_param_checksum,
                "param_max_abs_diff": self.param_max_abs_diff, "verified": self.verified,
                "recipe": self.recipe, "learning_rates": self.learning_rates, "grad_norms": self.grad_norms,
                "eval_losses": self.eval_losses,
                "reference_grad_norms": self.reference_grad_norms, "saved_final": self.saved_final,
                "final_loader": self.final_loader}


def _mib(b) -> str:
    return f"{b / 2**20:.2f} MiB" if isinstance(b, (int, float)) else "-"


def _fmt(v, fmt: str, unit: str = "") -> str:
    return format(v, fmt) + unit if isinstance(v, (int, float)) else "-"


def preamble(header: str, notes: list[str], first: list[str] = ()) -> str:
    """What the run report says before training (printed before the first step): `first` (a note that must
    come before anything else, e.g. the plan was made for other devices), the header, the notes."""
    return "\n".join([*first, header, *notes])


SHOWN_STEPS = 10
"""The report's loss table shows the first and the last this many steps of a longer run (and, under --verify, the
step furthest from the reference); --losses-out holds every step."""


def _shown_steps(losses: list[float], ref: list[float] | None) -> list[int | range]:
    """Indices of the steps the table shows, in order, with the range of those left out between them."""
    n = len(losses)
    if n <= 2 * SHOWN_STEPS + 1:
        return list(range(n))
    keep = set(range(SHOWN_STEPS)) | set(range(n - SHOWN_STEPS, n))
    if ref:
        keep.add(max(range(n), key=lambda i: abs(losses[i] - ref[i])))
    shown: list[int | range] = []
    last = -1
    for i in sorted(keep):
        if i > last + 1:
            shown.append(range(last + 1, i))
        shown.append(i)
        last = i
    return shown


def loss_table(losses: list[float], ref: list[float] | None, first_step: int = 0) -> list[str]:
    """The report's loss table: each shown step's loss, beside the reference's under --verify (`_shown_steps`)."""
    lines = ["step  loss" + ("          reference     |diff|" if ref else "")]
    for i in _shown_steps(losses, ref):
        if isinstance(i, range):
            lines.append(f" ...  {len(i)} step(s) not shown (--losses-out keeps every step's loss)")
            continue
        row = f"{first_step + i + 1:>4}  {losses[i]:.8f}"
        if ref:
            row += f"    {ref[i]:.8f}    {abs(losses[i] - ref[i]):.1e}"
        lines.append(row)
    return lines


def render(r: RunResult, header: str | None, predicted: dict) -> str:
    """The report after training; `header` None: the header and notes went out before training (`preamble`)."""
    lines = [header, *r.notes] if header is not None else []
    if r.applied:
        lines.append(f"applied on rank 0: {r.applied['summary']}")
    ref = r.reference_losses
    if r.resumed_from:
        lines.append(f"resumed from {r.resumed_from} (after step {r.first_step})"
                     + (f", torchrun attempt {r.attempt + 1}" if r.attempt else ""))
    lines += loss_table(r.losses, ref, r.first_step)
    first, n = r.first_step + 1, len(r.step_times)
    timed = f"mean of steps {first + 1}-{first + n - 1}" if n > 1 else f"step {first}, incl. warm-up"
    tps = r.tokens_per_step / r.step_time_s
    rows = [("", "measured", "predicted", ""),
            ("step time", _fmt(r.step_time_s, ".4f", " s"), _fmt(predicted.get("step_time_s"), ".4f", " s"),
             f"{timed}, slowest rank"),
            (f"{r.unit}/s", _fmt(tps, ",.0f"), _fmt(predicted.get("tokens_per_s"), ",.0f"), ""),
            ("peak memory", _mib(r.peak_memory_bytes), _mib(predicted.get("peak_memory_bytes")),
             f"largest rank; {r.memory_method}"),
            ("peak RSS", _mib(r.peak_rss_bytes), "", "largest rank process, incl. the torch runtime")]
    if r.peak_reserved_bytes is not None:
        rows.insert(4, ("peak reserved", _mib(r.peak_reserved_bytes), "",
                        "largest rank; torch.cuda.max_memory_reserved: allocated + the allocator's cache"))
    for name, measured, pred, note in rows:
        lines.append(f"{name:<12}{measured:>14}  {pred:>14}" + (f"   ({note})" if note else ""))
    if r.checkpoints:
        lines.append(f"checkpoints: {', '.join(r.checkpoints)} ({r.checkpoint_time_s:.2f} s saving)")
    if r.saved_final:
        how = r.final_loader or "model.load_state_dict(torch.load(PATH))"
        lines.append(f"final weights: {r.saved_final} (one process loads them: {how})")
    if r.param_checksum is not None:
        lines.append(f"parameter checksum: {r.param_checksum:.10e}"
                     + (f" (reference {r.reference_param_checksum:.10e})" if r.reference_param_checksum is not None else ""))
    if ref is not None:
        if r.param_max_abs_diff is not None:
            lines.append(f"verify: max |parameter - reference| = {r.param_max_abs_diff:.2e} (reported, not judged)")
        verdict = "OK" if r.verified else "FAILED"
        lines.append(f"verify: max |loss - reference| = {r.max_abs_diff:.2e} (tolerance {r.tolerance:.0e}): {verdict}")
    return "\n".join(lines)


# ---- failures of ranks, as one line for the user ------------------------------------------------------------
# A worker that fails writes its message into torchrun's per-worker error file (TORCHELASTIC_ERROR_FILE, in
# the JSON shape of torch.distributed.elastic's ErrorHandler, so torchrun's own report reads it too), with its
# global rank and a fine-grained time beside it. partita's launcher (runtime.api.agent) reads the files of the
# failed workers and prints the first failure as `partita: error: rank R: <message>`.

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
KILLED_BY_AGENT = (15,)
"""SIGTERM: how torchrun stops the other workers once one has failed. A worker killed by SIGKILL without an
error file is not one of them: the kernel's out-of-memory killer ends a process that way (torchrun sends
SIGKILL only to a worker still alive 30 s after its SIGTERM, by which time the cause was seen)."""
PEER_LOST = re.compile(r"Connection (reset|closed) by peer|Broken pipe|Socket Timeout|connection (was )?(closed|"
                       r"reset)|NCCL communicator was aborted|ProcessGroup\w* .*(closed|aborted)", re.IGNORECASE)
"""Messages of a worker that only noticed that a peer went away: a consequence, not the cause."""


def write_error_file(rank: int, message: str, trace: str | None = None, exitcode: int = 1,
                     path: str | None = None) -> None:
    """Record this worker's failure where torchrun looks for it (no-op outside torchrun). `exitcode`: the
    code the worker is about to exit with (torchrun may stop it with SIGTERM before it does). `path`: another
    worker's error file (its launcher writes the verdict on a rank it ends: runtime.launcher.leave)."""
    import json
    import os
    import time
    path = path or os.environ.get(ERROR_FILE_ENV)
    if not path:
        return
    now = time.time()
    data = {"message": {"message": message,
                        "extraInfo": {"py_callstack": trace or message, "timestamp": str(int(now)),
                                      "partita": {"rank": rank, "time": now, "exitcode": exitcode}}}}
    # Written whole or not at all: the agent reads this file as soon as it sees the worker end, and a
    # half-written one made torchrun's own reader raise (JSONDecodeError) and take the agent down.
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError:  # the directory went away (the agent is shutting down): nothing to report to
        pass


@dataclass
class RankFailure:
    rank: int
    exitcode: int
    """The worker's exit code (negative: the signal that ended it), or the one it was about to exit with."""
    message: str
    """One line: the worker's own message, or how it ended (exit code, signal)."""
    time: float
    trace: str | None = None
    """The traceback of an unexpected exception (None for partita's own errors)."""
    error_file: str | None = None
    """Set when the worker wrote one (it said what went wrong)."""

    @property
    def secondary(self) -> bool:
        """Stopped by torchrun after another worker failed: SIGTERM, and no message of its own."""
        return self.error_file is None and self.exitcode < 0 and -self.exitcode in KILLED_BY_AGENT

    @property
    def peer_lost(self) -> bool:
        """Its own message says only that a peer went away (PEER_LOST)."""
        return self.error_file is not None and bool(PEER_LOST.search(self.message))

    def line(self) -> str:
        return f"rank {self.rank}: {self.message}"


def read_failure(rank: int, exitcode: int, error_file: str | None, noticed: float) -> RankFailure:
    """What a failed worker said in its error file, or how it ended when it wrote none. `noticed`: when
    torchrun saw it end (for ordering workers that wrote no file)."""
    import json
    import signal
    data = None
    if error_file:
        try:
            with open(error_file) as f:
                data = json.load(f)
        except (OSError, ValueError):
            data = None
    msg = data.get("message") if isinstance(data, dict) else None
    if isinstance(msg, dict):
        info = msg.get("extraInfo") or {}
        ours = info.get("partita") or {}
        text = str(msg.get("message", "")).strip().splitlines()
        trace = info.get("py_callstack")
        code = exitcode if exitcode > 0 else int(ours.get("exitcode", exitcode))
        return RankFailure(rank=int(ours.get("rank", rank)), exitcode=code,
                           message=text[-1] if text else f"exited with code {exitcode}",
                           time=float(ours.get("time", info.get("timestamp", noticed))),
                           trace=trace if trace and trace != msg.get("message") else None, error_file=error_file)
    if exitcode < 0:
        try:
            how = f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"killed by signal {-exitcode}"
        if -exitcode == signal.SIGKILL:
            how += " (out of memory?)"
    else:
        how = f"exited with code {exitcode}"
    return RankFailure(rank=rank, exitcode=exitcode, message=how, time=noticed)


def attempt_failures(log_dir) -> list[RankFailure]:
    """The failures the workers of a launcher's latest attempt wrote (log_dir/<run>/attempt_<k>/<local>/error.json),
    each with the exit code it recorded."""
    from pathlib import Path
    attempts = sorted(Path(log_dir).glob("*/attempt_*"), key=lambda p: int(p.name.split("_")[-1]))
    if not attempts:
        return []
    return [read_failure(int(f.parent.name), 0, str(f), f.stat().st_mtime) for f in attempts[-1].glob("*/error.json")]


def first_failure(failures: list[RankFailure]) -> RankFailure:
    """The failure that started it: the earliest, leaving out workers torchrun stopped because of it and
    workers that only noticed a peer go away (a worker the out-of-memory killer ended writes nothing, and its
    peers' "Connection reset by peer" may well be timed before torchrun notices it died)."""
    said = {f.rank for f in failures if f.error_file is not None}
    # a rank's bare end (killed, no file) gives way to a file about that rank: its own, or the hang watch's of the
    # peer that ended it (runtime.failure.hang)
    failures = [f for f in failures if f.error_file is not None or f.rank not in said] or failures
    primary = ([f for f in failures if not f.secondary and not f.peer_lost]
               or [f for f in failures if not f.secondary] or failures)
    return min(primary, key=lambda f: (f.time, f.rank))


REPEATED_WARNINGS = r"(torch|transformers)(\.|$)"
"""Modules whose warnings every rank raises alike (the same library code runs on every rank)."""


def show_library_warnings_once(rank: int) -> None:
    """Library warnings (torch, transformers) on rank 0 only: every rank runs the same code and would print
    the same lines W times (FSDP2's "returned a view tensor" warning, deprecations). Rank 0 still shows each
    once; a warning raised only on another rank's pipeline stage is not shown. The user's own warnings stay."""
    import warnings
    if rank > 0:
        warnings.filterwarnings("ignore", module=REPEATED_WARNINGS)
        # attributed to the caller's module (stacklevel=2): matched by its text as well
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")

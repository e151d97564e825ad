"""The run report rank 0 prints: losses, measured step time and memory beside the plan's prediction."""
from __future__ import annotations

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
    reference_losses: list[float] | None = None
    max_abs_diff: float | None = None
    tolerance: float | None = None
    notes: list[str] = field(default_factory=list)
    applied: dict = field(default_factory=dict)
    """What the runtime applied on rank 0 (runtime.apply.Applied); pp > 1: pipeline stage 0's share."""

    @property
    def step_time_s(self) -> float:
        """Mean step time, leaving out step 1 (warm-up) when there is more than one step."""
        times = self.step_times[1:] if len(self.step_times) > 1 else self.step_times
        return sum(times) / len(times)

    def to_json(self) -> dict:
        return {"losses": self.losses, "reference_losses": self.reference_losses,
                "max_abs_diff": self.max_abs_diff, "step_time_s": self.step_time_s,
                "step_times_s": self.step_times, "tokens_per_s": self.tokens_per_step / self.step_time_s,
                "peak_memory_bytes": self.peak_memory_bytes, "memory_method": self.memory_method,
                "peak_rss_bytes": self.peak_rss_bytes, "applied": self.applied}


def _mib(b) -> str:
    return f"{b / 2**20:.2f} MiB" if isinstance(b, (int, float)) else "-"


def _fmt(v, fmt: str, unit: str = "") -> str:
    return format(v, fmt) + unit if isinstance(v, (int, float)) else "-"


def render(r: RunResult, header: str, predicted: dict) -> str:
    lines = [header, *r.notes]
    if r.applied:
        lines.append(f"applied on rank 0: {r.applied['summary']}")
    ref = r.reference_losses
    lines.append("step  loss" + ("          reference     |diff|" if ref else ""))
    for i, loss in enumerate(r.losses):
        row = f"{i + 1:>4}  {loss:.8f}"
        if ref:
            row += f"    {ref[i]:.8f}    {abs(loss - ref[i]):.1e}"
        lines.append(row)
    timed = f"mean of steps 2-{len(r.step_times)}" if len(r.step_times) > 1 else "step 1, incl. warm-up"
    tps = r.tokens_per_step / r.step_time_s
    rows = [("", "measured", "predicted", ""),
            ("step time", _fmt(r.step_time_s, ".4f", " s"), _fmt(predicted.get("step_time_s"), ".4f", " s"),
             f"{timed}, slowest rank"),
            ("tokens/s", _fmt(tps, ",.0f"), _fmt(predicted.get("tokens_per_s"), ",.0f"), ""),
            ("peak memory", _mib(r.peak_memory_bytes), _mib(predicted.get("peak_memory_bytes")),
             f"largest rank; {r.memory_method}"),
            ("peak RSS", _mib(r.peak_rss_bytes), "", "largest rank process, incl. the torch runtime")]
    for name, measured, pred, note in rows:
        lines.append(f"{name:<12}{measured:>14}  {pred:>14}" + (f"   ({note})" if note else ""))
    if ref is not None:
        verdict = "OK" if r.max_abs_diff <= r.tolerance else "FAILED"
        lines.append(f"verify: max |loss - reference| = {r.max_abs_diff:.2e} (tolerance {r.tolerance:.0e}): {verdict}")
    return "\n".join(lines)

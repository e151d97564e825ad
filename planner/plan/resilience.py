"""How often a plan should checkpoint and what failures cost it, as a plan file records it (`predicted.resilience`,
the rows of a plan set); planner.estimate.resilience computes it."""
from __future__ import annotations

from dataclasses import asdict, dataclass

HOUR = 3600.0


@dataclass(frozen=True)
class Resilience:
    """How often a plan should checkpoint, and what failures are expected to cost it."""

    mtbf_s: float
    """The job's mean time between interruptions at this plan's size."""
    checkpoint_bytes: float
    """Bytes of one checkpoint: every parameter's weights and optimizer state, once."""
    save_s: float
    restart_s: float
    """From a failure to training again: the assumed restart plus reading the checkpoint back."""
    interval_s: float
    """Daly's optimum training time between saves."""
    every_steps: int
    """The same in optimizer steps of the plan (`partita run --checkpoint-every`)."""
    lost_fraction: float
    """Expected fraction of wall time lost to saves, restarts and redone work at that interval."""
    assumptions: tuple[str, ...]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["assumptions"] = list(self.assumptions)
        return d

    def line(self) -> str:
        return (f"checkpoint every {self.every_steps} steps ({_duration(self.interval_s)}; a save takes "
                f"{self.save_s:.3g} s, a restart {self.restart_s:.3g} s): expected time lost to failures "
                f"{self.lost_fraction:.1%} at one interruption every {_duration(self.mtbf_s)}")

    @classmethod
    def from_dict(cls, d: dict) -> "Resilience | None":
        """A plan file's `predicted.resilience` back, or None when it is not the shape to_dict writes."""
        try:
            return cls(**{**d, "assumptions": tuple(str(a) for a in d.get("assumptions", ()))})
        except (TypeError, AttributeError):
            return None



def _duration(s: float) -> str:
    if s >= 1000 * HOUR:
        return f"{s / HOUR:,.0f} h"
    return f"{s / HOUR:.3g} h" if s >= HOUR else f"{s / 60:.3g} min" if s >= 60 else f"{s:.3g} s"

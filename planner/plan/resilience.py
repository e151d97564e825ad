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
    snapshots: "Snapshots | None" = None
    """The same with snapshots in the nodes' memory (`partita run --snapshot-every`), where the cluster is known."""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["assumptions"] = list(self.assumptions)
        return d

    def line(self) -> str:
        out = (f"checkpoint every {self.every_steps} steps ({_duration(self.interval_s)}; a save takes "
               f"{self.save_s:.3g} s, a restart {self.restart_s:.3g} s): expected time lost to failures "
               f"{self.lost_fraction:.1%} at one interruption every {_duration(self.mtbf_s)}")
        return out + (f"; {self.snapshots.line()}" if self.snapshots is not None else "")

    @classmethod
    def from_dict(cls, d: dict) -> "Resilience | None":
        """A plan file's `predicted.resilience` back, or None when it is not the shape to_dict writes."""
        try:
            snaps = d.get("snapshots")
            return cls(**{**d, "assumptions": tuple(str(a) for a in d.get("assumptions", ())),
                          "snapshots": Snapshots(**snaps) if snaps is not None else None})
        except (TypeError, AttributeError):
            return None


@dataclass(frozen=True)
class Snapshots:
    """What failures cost with snapshots in the nodes' memory (runtime.checkpoint.snapshot), for every failure that
    leaves a copy of each shard on a node still up (planner.estimate.resilience.price_snapshots)."""

    rank_bytes: float
    """What one rank copies a snapshot: the weights and optimizer state over the world's size (each byte once)."""
    ring: bool
    """Whether each node's snapshot also goes to the next node (a world of several nodes)."""
    copy_s: float
    """How long one snapshot's copy takes: into the node's memory, and the ring's send when there is one."""
    snapshot_s: float
    """How long it stalls training: the copy runs beside the next step, and only what it takes beyond it stalls."""
    recover_s: float
    """From a failure to training again: the restart, the lost node's state from its peer, the copy back."""
    interval_s: float
    every_steps: int
    """`partita run --snapshot-every`."""
    lost_fraction: float

    def line(self) -> str:
        return (f"with snapshots in memory every {self.every_steps} step{'s' * (self.every_steps != 1)} "
                f"(--snapshot-every {self.every_steps}; a snapshot's copy takes {self.copy_s:.3g} s beside the next "
                f"step, stalling it {self.snapshot_s:.3g} s; recovery from a peer takes {self.recover_s:.3g} s): "
                f"{self.lost_fraction:.1%}")



def _duration(s: float) -> str:
    if s >= 1000 * HOUR:
        return f"{s / HOUR:,.0f} h"
    return f"{s / HOUR:.3g} h" if s >= HOUR else f"{s / 60:.3g} min" if s >= 60 else f"{s:.3g} s"

"""The price of a sync mode (planner.plan.sync.SYNC_MODES): what keeping the data-parallel replicas in agreement
costs a candidate per step -- the communication no compute hides, and the memory the mode holds beyond the
model states the memory phases already count.

One function per mode, of one signature, `price(predicted) -> SyncPrice`, over the candidate's priced step
(planner.estimate.build.predicted): a new mode (local SGD, DiLoCo) adds its function to PRICES under the name of
its registry entry, and its runtime hook to runtime.loop.sync.HOOKS.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from partita.costmodel.errors import PartitaError
from partita.planner.plan.sync import SYNC_MODES, SYNCHRONOUS, accepted


@dataclass(frozen=True, kw_only=True)
class SyncPrice:
    """A sync mode's cost per optimizer step."""

    exposed_s: float
    """Seconds of data-parallel synchronisation on the step's critical path (part of the step time)."""
    extra_memory_bytes: int
    """Bytes per rank the mode holds beyond the model states, activations and workspace of the memory phases."""


def synchronous(predicted: dict) -> SyncPrice:
    """Synchronous data parallelism as the estimator prices it today (nothing here changes a prediction): the
    exposed part of the data-parallel gradient synchronisation in the slowest stage's flush, the breakdown's
    `dp_comm_s` (planner.estimate.build.predicted: the layers' exposed dp traffic, e.g. what DDP's buckets leave
    uncovered, plus its latency and last bucket); the ZeRO stream's own traffic is `zero_comm_s`, not priced
    here. No extra memory: the gradients it averages are model states (under DDP its buckets, from the first
    step on: planner.estimate.phases.grads_absent)."""
    return SyncPrice(exposed_s=float(predicted.get("breakdown", {}).get("dp_comm_s", 0.0)), extra_memory_bytes=0)


PRICES: dict[str, Callable[[dict], SyncPrice]] = {SYNCHRONOUS: synchronous}
"""A price function per registered sync mode (the same names as planner.plan.sync.SYNC_MODES)."""


def sync_price(mode: str, predicted: dict) -> SyncPrice:
    """The price of sync mode `mode` for a candidate whose step is priced as `predicted`."""
    if mode not in SYNC_MODES or mode not in PRICES:
        raise PartitaError(f"sync mode {mode!r} has no price; accepted: {accepted()}")
    return PRICES[mode](predicted)

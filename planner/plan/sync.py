"""The plan's `sync` section: how the data-parallel replicas keep their weights in agreement (part of the plan
contract the runtime reads; stdlib only).

    sync         {"mode": "synchronous"}   absent: synchronous (plans written before the section load unchanged,
                 and a plan in the default mode is written without it, byte for byte as before)

A sync mode is one registry entry here (its name, what it means, the options it takes), one price function in
the planner's estimate layer (planner.estimate.sync.PRICES) and one hook class in the runtime's trainer loop
(runtime.loop.sync.HOOKS): synchronous data parallelism today; local SGD, DiLoCo and streaming DiLoCo are
modes around the optimizer step of the same loop (DESIGN.md, "Where new capabilities go").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from partita.planner.plan.sections import checked


@dataclass(frozen=True, kw_only=True)
class SyncMode:
    """A registry entry: a sync mode's name, what it does in one line, and the options its section may hold."""

    name: str
    summary: str
    options: dict[str, Any] = field(default_factory=dict)
    """{option name: what it may be} (planner.plan.sections specs); {}: the mode takes none."""


SYNCHRONOUS = "synchronous"
SYNC_MODES: dict[str, SyncMode] = {
    SYNCHRONOUS: SyncMode(name=SYNCHRONOUS,
                          summary="synchronous data parallelism: gradients averaged over dp in every step's backward "
                                  "(DDP's buckets, FSDP's reduce-scatter), before the optimizer step"),
}
"""The accepted modes, by name. A new one is added here (with PRICES and HOOKS entries of the same name)."""


@dataclass(kw_only=True)
class Sync:
    """A plan's sync choice: the mode, and its options (none for synchronous)."""

    mode: str = SYNCHRONOUS
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def is_default(self) -> bool:
        return self.mode == SYNCHRONOUS and not self.options

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, **({"options": dict(self.options)} if self.options else {})}


def accepted() -> str:
    return ", ".join(SYNC_MODES)


def mode_problem(mode: Any, where: str = "sync.mode") -> str | None:
    """One line when `mode` names no registered sync mode; None when it does."""
    if isinstance(mode, str) and mode in SYNC_MODES:
        return None
    shown = repr(mode) if len(repr(mode)) <= 40 else repr(mode)[:37] + "..."
    return f"{where} is {shown}; accepted: {accepted()}"


def problems(data: Any) -> list[str]:
    """What is wrong with a plan's `sync` section (None: absent); [] when nothing is."""
    if data is None:
        return []
    if not isinstance(data, dict):
        return ["sync must be a JSON object, e.g. {\"mode\": \"synchronous\"}"]
    unknown = sorted(set(data) - {"mode", "options"})
    if unknown:
        return [f"sync has unknown key {unknown[0]!r}; a sync section holds mode and options"]
    if why := mode_problem(data.get("mode")):
        return [why]
    entry, options = SYNC_MODES[data["mode"]], data.get("options", {})
    if not isinstance(options, dict):
        return ["sync.options must be a JSON object"]
    extra = sorted(set(options) - set(entry.options))
    if extra:
        takes = ", ".join(entry.options) or "none"
        return [f"sync.options.{extra[0]} is not an option of the {entry.name} mode; it takes: {takes}"]
    return [p for name, spec in entry.options.items() if name in options
            for p in checked(options[name], spec, f"sync.options.{name}")]


def from_section(data: Any) -> Sync:
    """The Sync of a section that `problems` found nothing wrong with (None: the default)."""
    if data is None:
        return Sync()
    return Sync(mode=data["mode"], options=dict(data.get("options", {})))

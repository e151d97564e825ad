"""The plan contract's error, below every module of planner.plan (planner.plan re-exports it)."""
from __future__ import annotations

from partita.costmodel.errors import PartitaError


class PlanError(PartitaError):
    """A plan file that is malformed, from another schema, or does not fit the model or world size."""

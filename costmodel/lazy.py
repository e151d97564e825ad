"""A package's submodules as its attributes, each imported on first use (`__getattr__ = submodules(__name__)` in
the package's `__init__`): `partita.planner.solve.milp` works without the package importing every module it
holds, so a command loads only what it uses."""
from __future__ import annotations

import importlib


def submodules(package: str):
    """A module-level `__getattr__` for `package` (PEP 562)."""
    def __getattr__(name: str):
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{package}.{name}":  # the submodule exists; something it imports is missing
                raise
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
    return __getattr__

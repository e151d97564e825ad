"""Graph capture and costs: what a model computes and stores, and what a cluster can do.

costmodel knows nothing of choices: it describes operators, tensors, devices and links; the planner
decides. Public entry points are re-exported here.

Names load on first use (as in partita/__init__.py): `from partita.costmodel import PartitaError` does not
import torch, so `partita run` and a launcher process start without it.
"""
import importlib

from partita.costmodel.errors import PartitaError, InfeasibleError

_NAMES = {"model_fingerprint": "partita.costmodel.capture.fingerprint", "ModelSpec": "partita.costmodel.models.registry",
          "resolve_model": "partita.costmodel.models.registry", "PRESETS": "partita.costmodel.models.configs"}
__all__ = ["PartitaError", "InfeasibleError", *_NAMES]


def __getattr__(name):
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    try:
        return importlib.import_module(f"partita.costmodel.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"partita.costmodel.{name}":  # the submodule exists; something it imports is missing
            raise
        raise AttributeError(f"module 'partita.costmodel' has no attribute {name!r}") from None

"""Graph capture and costs: what a model computes and stores, and what a cluster can do.

costmodel knows nothing of choices: it describes operators, tensors, devices and links; the planner
decides. Public entry points are re-exported here.

Names load on first use (as in partita/__init__.py): `from partita.costmodel import PartitaError` does not
import torch, so `partita run` and a launcher process start without it.
"""
import importlib

from partita.costmodel.errors import PartitaError, InfeasibleError
from partita.costmodel.lazy import submodules

_NAMES = {"model_fingerprint": "partita.costmodel.capture.fingerprint", "ModelSpec": "partita.costmodel.models.registry",
          "resolve_model": "partita.costmodel.models.registry", "PRESETS": "partita.costmodel.models.configs"}
__all__ = ["PartitaError", "InfeasibleError", *_NAMES]


_submodule = submodules("partita.costmodel")


def __getattr__(name):
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    return _submodule(name)

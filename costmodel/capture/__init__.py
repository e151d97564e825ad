"""Capture: a model as an operator graph on fake tensors (fx or torch.export), its layers found and replicated, its fingerprint."""
import importlib


def __getattr__(name):  # a submodule loads on first use, as an attribute too
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":  # the submodule exists; something it imports is missing
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None

"""Prices: FLOPs, kernel times, collectives, memory, overlap streams, resharding, fused kernels."""
import importlib


def __getattr__(name):  # a submodule loads on first use, as an attribute too
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":  # the submodule exists; something it imports is missing
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None

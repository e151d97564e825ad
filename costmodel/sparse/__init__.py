"""Embedding tables: their accesses, costs and TorchRec's own estimators."""
from partita.costmodel.lazy import submodules


__getattr__ = submodules(__name__)  # a submodule loads on first use, as an attribute too

"""Prices: FLOPs, kernel times, collectives, memory, overlap streams, resharding, fused kernels."""
from partita.costmodel.lazy import submodules


__getattr__ = submodules(__name__)  # a submodule loads on first use, as an attribute too

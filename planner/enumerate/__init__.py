"""The candidates the search solves: meshes, micro-batching, per-layer sharding options and their variants (recompute, offload), the SearchSpace they come from."""
from partita.costmodel.lazy import submodules


__getattr__ = submodules(__name__)  # a submodule loads on first use, as an attribute too

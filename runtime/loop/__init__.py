"""The training loop and what runs around it: stops, faults, progress, memory, verification, the report."""
from partita.costmodel.lazy import submodules


__getattr__ = submodules(__name__)  # a submodule loads on first use, as an attribute too

"""How a run stops or fails on purpose: signals and stop requests (`stop`), non-finite losses and weights
(`guards`), the hang watch (`hang`) and the faults tests inject (`faults`)."""
from partita.costmodel.lazy import submodules


__getattr__ = submodules(__name__)  # a submodule loads on first use, as an attribute too

"""Process groups, rendezvous and the pre-flight checks of a launch."""
from partita.costmodel.lazy import submodules


__getattr__ = submodules(__name__)  # a submodule loads on first use, as an attribute too

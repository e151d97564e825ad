"""A candidate's price beside its memory phases and the printed breakdown of the chosen plan; the baselines under the same cost model."""
from partita.costmodel.lazy import submodules


__getattr__ = submodules(__name__)  # a submodule loads on first use, as an attribute too

"""What partita shows about plans beyond the CLI's report: plots for notebooks, side-by-side comparisons."""
from partita.costmodel.lazy import submodules


__getattr__ = submodules(__name__)  # a submodule loads on first use, as an attribute too

"""--verify: the single-process reference and the comparisons with their tolerances (`checks`), and the checks of a
finished run, with the fp32 pass of a run in another dtype (`run`)."""
from partita.costmodel.lazy import submodules


__getattr__ = submodules(__name__)  # a submodule loads on first use, as an attribute too

"""The training loop and what runs around it: the step loop and its hooks, the recipe, progress, memory, evaluation
and the report (stops and faults: runtime.failure; --verify: runtime.verify; TorchRec's loop: runtime.rec)."""
from partita.costmodel.lazy import submodules


__getattr__ = submodules(__name__)  # a submodule loads on first use, as an attribute too

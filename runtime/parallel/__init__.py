"""Applying a plan: one module per parallelism (tensor, FSDP/ZeRO, pipeline, context, expert), recompute, offload and
precision around the layers (TorchRec for tables: runtime.rec)."""
from partita.costmodel.lazy import submodules


__getattr__ = submodules(__name__)  # a submodule loads on first use, as an attribute too

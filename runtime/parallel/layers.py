"""What kind of layer a module is, by class (or, for a pipeline's outlined copy, by the class it was outlined
from): what the tensor-parallel rules and the pre-flight checks ask, without importing DTensor."""
from __future__ import annotations

import torch.nn as nn


def class_name(module: nn.Module, fqn: str = "") -> str:
    """The module's class name; for a pipeline's outlined copy (an InterpreterModule) of module `fqn`, the
    name of the class it was outlined from (recorded in its graph's `nn_module_stack`)."""
    graph = getattr(module, "graph", None)
    if graph is not None and fqn:
        for node in graph.nodes:
            for path, cls in (node.meta.get("nn_module_stack") or {}).values():
                if path == fqn:
                    return str(cls).rpartition(".")[2]
    return type(module).__name__


def is_norm(module: nn.Module, fqn: str = "") -> bool:
    """A norm "sequence" applies to: LayerNorm / RMSNorm, or a leaf module whose class is named so (also
    a pipeline's outlined copy of one)."""
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
        return True
    leaf = not any(True for _ in module.children())
    return leaf and class_name(module, fqn).endswith(("LayerNorm", "RMSNorm"))


def is_embedding(module: nn.Module, fqn: str = "") -> bool:
    """An nn.Embedding, or a pipeline's outlined copy of one."""
    return isinstance(module, nn.Embedding) or class_name(module, fqn) == "Embedding"

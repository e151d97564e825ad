"""transformers' models as torch.export captures them (costmodel.capture.export) and a pipeline stage splits
them (runtime.parallel.pp): `export_context` makes the trace follow the path eager training takes on an unpadded,
unpacked batch; `contains_hf_model` says whether a user's module holds one (costmodel.models.hf builds them)."""
from __future__ import annotations

import contextlib
from typing import Any
from unittest import mock

import torch.nn as nn


def is_hf_model(model: nn.Module) -> bool:
    return any(c.__module__.startswith("transformers.") for c in type(model).__mro__)


def contains_hf_model(model: nn.Module) -> bool:
    """Whether `model` is, or holds anywhere inside it, a transformers module (a user's wrapper or factory
    module holding an HF model gets the same capture patches as the bare model)."""
    return any(is_hf_model(m) for m in model.modules())


@contextlib.contextmanager
def export_context(root: nn.Module | None = None):
    """Trace what eager training runs on an unpadded, unpacked batch.

    Eager HF code inspects tensor values to skip building attention masks (no padding: SDPA's is_causal
    flag; positions 0..s-1: not a packed batch). Under torch.export and fake tensors it cannot read values,
    so it materialises an [s, s] mask, which sends SDPA to a masked kernel that saves the mask, and, for
    grouped-query attention, replaces SDPA's `enable_gqa` by copies of K and V (`repeat_kv`). Both change
    the saved bytes and hide the head structure. Here the mask helpers answer as they do in eager mode
    for such a batch. Only attributes that exist are patched, so a transformers release without them
    still captures, just with its traced masks.

    For the configs of the transformers modules inside `root` (wherever they sit in the user's module),
    while capturing:
    - `use_cache` is off: training builds no KV cache (a factory's model keeps its config's default, True).
    - mixture-of-experts layers run transformers' "grouped_mm" experts path. Its "eager" path loops over
      the experts a batch hits (`nonzero`) and gathers each expert's tokens: shapes that depend on the
      routing, which torch.export cannot follow on fake tensors. "grouped_mm" sorts the tokens x top-k
      routed rows by expert and runs one grouped GEMM over them: the same rows through the same experts
      (FLOPs = tokens x k x one expert's, costmodel.price.flops), static shapes, and the dispatch (sort, gather)
      and combine (weighted sum) as memory-bound ops. It is also transformers' default where it can run.
    """
    try:
        import transformers.masking_utils as mu
    except ImportError:
        yield
        return
    with contextlib.ExitStack() as stack:
        if hasattr(mu, "is_torchdynamo_exporting"):
            stack.enter_context(mock.patch.object(mu, "is_torchdynamo_exporting", lambda: False))
        if hasattr(mu, "find_packed_sequence_indices"):
            stack.enter_context(mock.patch.object(mu, "find_packed_sequence_indices", lambda *a, **k: None))
        for cfg in _hf_configs(root):
            stack.enter_context(_patched(cfg, "use_cache", False, lambda v: bool(v)))
            stack.enter_context(_patched(cfg, "_experts_implementation", "grouped_mm", lambda v: v == "eager"))
        yield


def _hf_configs(root: nn.Module | None) -> list:
    """The distinct transformers configs held by modules of `root`."""
    seen: dict[int, Any] = {}
    for m in (root.modules() if root is not None else ()):
        cfg = getattr(m, "config", None)
        if is_hf_model(m) and cfg is not None and type(cfg).__module__.startswith("transformers."):
            seen.setdefault(id(cfg), cfg)
    return list(seen.values())


@contextlib.contextmanager
def _patched(obj, attr: str, value, when):
    """Set `obj.attr = value` for the duration when `when(current)` holds, then restore it."""
    if not hasattr(obj, attr) or not when(getattr(obj, attr)):
        yield
        return
    old = getattr(obj, attr)
    setattr(obj, attr, value)
    try:
        yield
    finally:
        setattr(obj, attr, old)

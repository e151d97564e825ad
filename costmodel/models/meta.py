"""Build a model on the meta device without running its initialisers.

A meta tensor has a shape and a dtype and no values, so initialising one computes nothing -- but it still
costs: `normal_` on a meta tensor dispatches to torch._refs, whose wrapper imports torch._dynamo (about
1.5 s, more than building the model; `meta_build` also stands torch._dynamo in for the other factory ops). The planner's fingerprint, the pre-flight check and the resume check
build models on meta only to read names, shapes and dtypes: `meta_build` skips the value fills of meta
tensors (torch.nn.init's initialisers and the in-place random and constant fills of Tensor) while it runs.
A tensor that is not on meta is filled as usual, so a factory that makes real buffers still gets them.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch
import torch.nn as nn

INITIALISERS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
                "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_",
                "sparse_")
"""torch.nn.init's in-place initialisers (what modules' reset_parameters call)."""
FILLS = ("normal_", "uniform_", "fill_", "zero_", "random_", "bernoulli_", "exponential_", "geometric_",
         "log_normal_", "cauchy_")
"""Tensor's in-place fills (what hand-written `_init_weights` call, e.g. HuggingFace's)."""


def _skipping_meta(fill: Callable) -> Callable:
    def fill_unless_meta(tensor, *args, **kwargs):
        return tensor if getattr(tensor, "is_meta", False) else fill(tensor, *args, **kwargs)
    return fill_unless_meta


@contextmanager
def values_skipped_on_meta() -> Iterator[None]:
    """While it is open, filling a meta tensor returns it as it is (module docstring)."""
    saved_init = {name: getattr(nn.init, name) for name in INITIALISERS if hasattr(nn.init, name)}
    saved_fills = {name: torch.Tensor.__dict__.get(name) for name in FILLS}
    try:
        for name, fn in saved_init.items():
            setattr(nn.init, name, _skipping_meta(fn))
        for name in FILLS:
            setattr(torch.Tensor, name, _skipping_meta(getattr(torch.Tensor, name)))
        yield
    finally:
        for name, fn in saved_init.items():
            setattr(nn.init, name, fn)
        for name, own in saved_fills.items():
            if own is None:
                delattr(torch.Tensor, name)  # inherited from torch._C.TensorBase again
            else:
                setattr(torch.Tensor, name, own)


def meta_build(build: Callable[[], nn.Module]) -> nn.Module:
    """`build()` on the meta device with its initialisers skipped: names, shapes and dtypes, no values. Other
    factory ops on meta (a rotary table's `arange`) dispatch to torch._refs too, whose wrapper would import
    torch._dynamo: it is stood in for meanwhile (costmodel.capture.defer)."""
    from partita.costmodel.capture.defer import deferred
    with torch.device("meta"), values_skipped_on_meta(), deferred():
        return build()

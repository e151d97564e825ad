"""Change how a module's forward runs without replacing the module, so every FQN stays as the user wrote it.

`wrap_forward(module, around)` sets an instance attribute `forward` calling `around(inner, args, kwargs)`,
where `inner` is the forward the module had. `nn.Module.__call__` still runs the module's hooks (FSDP2's
all-gather and reshard, tensor-parallel input/output layouts) outside the wrapper, so a checkpointed
forward recomputes with the parameters FSDP has gathered. Works on the user's modules and on the
`InterpreterModule`s a pipeline split makes of them. (torch's `checkpoint_wrapper` would insert a
`_checkpoint_wrapped_module` level into every parameter name instead.)
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable

import torch.nn as nn

Around = Callable[[Callable[..., Any], tuple, dict], Any]


def wrap_forward(module: nn.Module, around: Around) -> None:
    inner = module.forward

    @functools.wraps(inner)
    def forward(*args, **kwargs):
        return around(inner, args, kwargs)

    module.forward = forward


def within(make_context: Callable[[], contextlib.AbstractContextManager]) -> Around:
    """An `around` that runs the forward inside a fresh `make_context()`."""
    def around(inner, args, kwargs):
        with make_context():
            return inner(*args, **kwargs)
    return around

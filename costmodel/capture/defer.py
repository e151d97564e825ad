"""torch._dynamo left unimported while fx captures a model on fake tensors: about a second of every cold plan.

Importing torch._dynamo costs 0.8-1.7 s here (it imports inductor's utilities and hundreds of modules), and a
capture on fake tensors needs two things of it: `torch._dynamo.config` (FakeTensorMode reads its cache flags when
it is made) and `torch._dynamo.disable` (torch wraps every TorchDispatchMode's `__torch_dispatch__` in
`torch._disable_dynamo`, which imports torch._dynamo on the first call to ask it for a disabled copy). Neither
needs the rest: a function nothing compiles has nothing to disable.

`deferred()` stands a module in for torch._dynamo while the fx capture runs, holding the real `config` submodule
and a `disable` whose wrapper calls the function as it is while torch._dynamo is not loaded and torch._dynamo's
own `disable` once it is (so a dispatch mode wrapped now is disabled for dynamo later, as torch means it to be).
When the capture ends the stand-in leaves sys.modules and torch, with every torch._dynamo submodule it loaded:
the next `import torch._dynamo` is torch's own, whole. The capture's graph is the same either way (checked on
the presets, tests/costmodel/test_defer_dynamo.py).

Not deferred: a process that has imported torch._dynamo already (nothing to save), torch.export's capture (it is
dynamo), a torch whose torch._dynamo has no `config` submodule (the capture imports torch._dynamo as before), and
any capture while PARTITA_DEFER_DYNAMO=0 (a way out should a torch release need more of dynamo in a capture, and
benchmarks.startup's side-by-side figure).
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
import types

NAME = "torch._dynamo"
ENV = "PARTITA_DEFER_DYNAMO"


class StandIn(types.ModuleType):
    """What `import torch._dynamo` finds while a capture runs (module docstring). Asked for anything else, it steps
    aside and torch._dynamo is imported for real (the capture then pays for it, as without the stand-in)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        _remove(sys.modules["torch"], self)
        return getattr(importlib.import_module(NAME), name)


def _disable_later(fn, recursive=True, *, reason=None, wrapping=True):
    """torch._dynamo.disable's stand-in: `fn` as it is until torch._dynamo is loaded, then torch's disabled copy."""
    real: list = []

    def call(*args, **kwargs):
        dynamo = sys.modules.get(NAME)
        if dynamo is None or isinstance(dynamo, StandIn):
            return fn(*args, **kwargs)
        if not real:
            real.append(dynamo.disable(fn, recursive, wrapping=False))
        return real[0](*args, **kwargs)
    return call


@contextlib.contextmanager
def deferred():
    """torch._dynamo stood in for while the block runs (module docstring); yields whether it is."""
    import torch
    off = os.environ.get(ENV, "").strip() == "0"
    spec = importlib.util.find_spec(NAME) if NAME not in sys.modules and not off else None
    if spec is None or not spec.submodule_search_locations:
        yield False
        return
    stand_in = StandIn(NAME)
    stand_in.__spec__, stand_in.__path__ = spec, list(spec.submodule_search_locations)
    stand_in.disable = _disable_later
    sys.modules[NAME] = stand_in
    torch._dynamo = stand_in
    try:
        try:
            stand_in.config = importlib.import_module(f"{NAME}.config")
        except Exception:  # noqa: BLE001 -- another torch's layout: take the stand-in out and import as before
            _remove(torch, stand_in)
            yield False
            return
        yield True
    finally:
        _remove(torch, stand_in)


def _remove(torch, stand_in: StandIn) -> None:
    """The stand-in and the submodules loaded under it out of sys.modules and torch (unless the real one came)."""
    if sys.modules.get(NAME) is not stand_in:
        return
    for name in [n for n in sys.modules if n == NAME or n.startswith(NAME + ".")]:
        del sys.modules[name]
    if getattr(torch, "_dynamo", None) is stand_in:
        del torch._dynamo

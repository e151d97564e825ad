"""The models partita plans and runs: presets, `gpt:` / `llama:` / `resnet:` / `dlrm:` / `hf:` strings and
`package.module:factory` models, each resolved to a ModelSpec (registry.py).

Names load on first use: the configurations and presets (configs.py) need no torch, so `partita models`
and other listings start in a fraction of a second; `resolve_model` and ModelSpec import torch with the
registry.
"""
import importlib

_NAMES = {name: "partita.costmodel.models.registry"
          for name in ("ModelSpec", "resolve_model", "with_seq", "gpt_spec", "describe_presets")}
_NAMES.update({name: "partita.costmodel.models.configs"
               for name in ("GPTConfig", "ResNetConfig", "PRESETS", "CNN_PRESETS")})
__all__ = list(_NAMES)


def __getattr__(name):
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module 'partita.costmodel.models' has no attribute {name!r}")

"""A model's fingerprint: which parameters it has, of which shapes and dtypes.

A plan records the fingerprint of the model it was made for; the runtime refuses to apply it to a
different model. Works on meta and fake modules (no parameter values are read).
"""
import hashlib

import torch.nn as nn


def model_fingerprint(module: nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in module.named_parameters():
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype}\n".encode())
    return "sha256:" + h.hexdigest()[:16]

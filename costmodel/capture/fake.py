"""The model as the capture traces it (costmodel.capture.trace, costmodel.capture.export): built on fake tensors in
the training dtype (`build_fake`), and wrapped with its loss so the loss's FLOPs and saved tensors are part of the
graph (`wrap_for_capture`)."""
from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from partita.costmodel.errors import PartitaError
from partita.costmodel.models import ModelSpec
from partita.costmodel.models.losses import cross_entropy
from partita.costmodel.models.meta import values_skipped_on_meta

# the fused loss is one node, as its kernel is one launch (fx.wrap patches the name in this module, where
# _WithLoss.forward looks it up)
fx.wrap("cross_entropy")

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_WRAP = "model."
_MAX_INPUTS = 6


class _WithLoss(nn.Module):
    """model + token cross-entropy, so the loss's saved tensors and FLOPs are captured too: PyTorch's on
    fp32 logits, or the fused kernel's (costmodel.models.losses, one fx node named cross_entropy like PyTorch's,
    so the planner shards it with a vocabulary-parallel head the same way)."""

    def __init__(self, model: nn.Module, loss: str = "plain"):
        super().__init__()
        self.model = model
        self.fused = loss == "fused"

    def forward(self, tokens, targets):
        logits = self.model(tokens)
        if self.fused:
            return cross_entropy(logits.flatten(0, 1), targets.flatten(0, 1))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


class _WithLossFn(nn.Module):
    """model + `spec.loss_fn(model, *inputs)`. forward has fixed arity (fx cannot trace *args)."""

    def __init__(self, model: nn.Module, loss_fn, n: int):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn
        self.n = n

    def forward(self, x0, x1=None, x2=None, x3=None, x4=None, x5=None):
        return self.loss_fn(self.model, *(x0, x1, x2, x3, x4, x5)[:self.n])


def wrap_for_capture(spec: ModelSpec, model: nn.Module, inputs: tuple):
    """(module to trace, its arguments, FQN prefix its wrapper adds, concrete_args for fx).

    With a `loss_fn` the loss module wraps the model; with a vocabulary the token cross-entropy does
    (targets are zeros: values do not change costs); otherwise the bare forward is traced.
    """
    if spec.loss_fn is not None:
        if not 1 <= len(inputs) <= _MAX_INPUTS:
            raise PartitaError(f"model {spec.name!r}: example inputs must be 1 to {_MAX_INPUTS} tensors, "
                               f"got {len(inputs)}")
        unused = {f"x{i}": None for i in range(len(inputs), _MAX_INPUTS)}
        return _WithLossFn(model, spec.loss_fn, len(inputs)), inputs, _WRAP, unused
    if spec.vocab:
        targets = torch.zeros(inputs[0].shape, dtype=torch.long)
        return _WithLoss(model, spec.config.get("loss", "plain")), (*inputs, targets), _WRAP, None
    return model, inputs, "", None


def build_fake(spec: ModelSpec, dtype: str, mode: FakeTensorMode, batch: int) -> tuple[nn.Module, tuple]:
    """spec.build() and spec.example_inputs(batch) as fake tensors, in the training dtype (Module.to()
    cannot swap fake params, and float inputs must match the parameters).

    The module is built on the meta device and its parameters and buffers are then swapped for fake
    tensors: building under FakeTensorMode runs every initialiser through fake dispatch, ~10x slower (2.2 s
    against 0.2 s for gpt3-175b's 96 blocks). A model whose constructor needs tensor values (meta tensors
    have none) is built under FakeTensorMode as before."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(DTYPES[dtype])
    try:
        try:
            with torch.device("meta"), values_skipped_on_meta():  # shapes only: initialisers on meta cost time
                model = spec.build()
        except Exception:  # noqa: BLE001 -- the constructor read a value; fake tensors allow that
            model = None
        with mode:
            model = _fakeify(model) if model is not None else spec.build()
            inputs = spec.example_inputs(batch)
    finally:
        torch.set_default_dtype(previous)
    return model, (inputs if isinstance(inputs, tuple) else (inputs,))


def _fakeify(model: nn.Module) -> nn.Module:
    """Swap a meta module's parameters and buffers for fake CPU tensors of the same shape, dtype and
    strides (called inside the fake mode). A tensor held under two names (a tied weight) stays one."""
    swapped: dict[int, torch.Tensor] = {}

    def fake(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in swapped:
            f = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
            swapped[id(t)] = nn.Parameter(f, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else f
        return swapped[id(t)]

    for mod in model.modules():
        for table in (mod._parameters, mod._buffers):
            for name, t in table.items():
                if t is not None:
                    table[name] = fake(t)
        for name, t in list(vars(mod).items()):  # a plain tensor attribute (`self.mask = torch.tril(...)`)
            if isinstance(t, torch.Tensor) and t.device.type == "meta":
                setattr(mod, name, fake(t))
    return model

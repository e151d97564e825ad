"""Recording a model as `torch.autocast` runs it, on fake CPU tensors (costmodel.capture.trace).

partita's runtime trains a bf16 plan without FSDP under `torch.autocast(device, bfloat16)` over fp32
parameters (runtime/parallel/precision.py). What autograd saves then differs from a bf16 model's: the residual
stream stays fp32, each matmul saves a bf16 cast of its fp32 input and a bf16 cast of its weight. The
capture records that by running the graph with fp32 parameters under CPU autocast (`autocast_region`).

Autocast's lists differ by device (PyTorch's AMP reference, "CUDA Ops that can autocast to float32";
aten/src/ATen/autocast_mode.h, AT_FORALL_FP32 and AT_FORALL_FP32_SET_OPT_DTYPE): both cast matmuls,
linear layers, convolutions and attention to the lower precision, but CUDA also runs softmax,
log_softmax, pow, rsqrt, exp, layer_norm, sum, the losses ... in fp32, which CPU autocast runs in their
input's dtype. Fake CUDA tensors cannot be made on a machine without CUDA, so for a GPU plan
(`policy="cuda"`) `CudaFp32Ops` casts 16-bit inputs of those operators to fp32 above autograd, as CUDA
autocast does, and autograd then saves what it would save on the GPU (a materialised attention's fp32
softmax). "Ops called with an explicit dtype= argument are not eligible" (the same reference): left alone.

Saved tensors are classified by their autograd history (`saved_kind`): one computed from parameters
alone through casts and views (autocast's cast of a weight, cached once per forward) does not grow with
the batch; an internal cast of a node's input (autocast's cast of an fp32 activation for a matmul) is
re-run, not kept, by a selective checkpoint (runtime/parallel/recompute.py saves only parametric ops' outputs).
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

POLICIES = ("cpu", "cuda")
"""Whose autocast lists a record follows: CPU autocast's own, or CUDA's (emulated, module docstring)."""

CUDA_FP32 = frozenset({
    "__pow__", "__rpow__", "__rdiv__", "__rtruediv__", "acos", "asin", "binary_cross_entropy_with_logits",
    "cosh", "cosine_embedding_loss", "cdist", "cosine_similarity", "cross_entropy", "cross_entropy_loss",
    "cumprod", "cumsum", "dist", "erfinv", "exp", "expm1", "group_norm", "native_group_norm",
    "hinge_embedding_loss", "kl_div", "l1_loss", "layer_norm", "native_layer_norm", "log", "log_softmax",
    "_log_softmax", "log10", "log1p", "log2", "margin_ranking_loss", "mse_loss", "multilabel_margin_loss",
    "multi_margin_loss", "nll_loss", "nll_loss_nd", "norm", "normalize", "pdist", "poisson_nll_loss", "pow",
    "prod", "reciprocal", "rsqrt", "sinh", "smooth_l1_loss", "soft_margin_loss", "softmax", "_softmax",
    "softmin", "softplus", "sum", "renorm", "tan", "triplet_margin_loss", "logsumexp", "huber_loss"})
"""CUDA autocast's fp32 operators (module docstring), by Python or ATen name."""

_HALF = (torch.bfloat16, torch.float16)


def _name(func) -> str:
    packet = getattr(func, "overloadpacket", None)
    return packet.__name__ if packet is not None else getattr(func, "__name__", "")


class CudaFp32Ops(TorchFunctionMode):
    """Inside CPU autocast: run CUDA autocast's fp32 operators on fp32 inputs (module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _name(func) in CUDA_FP32 and kwargs.get("dtype") is None and torch.is_autocast_enabled("cpu"):
            up = lambda a: a.float() if isinstance(a, torch.Tensor) and a.dtype in _HALF else a
            args, kwargs = tree_map(up, (args, kwargs))
        return func(*args, **kwargs)


@contextlib.contextmanager
def autocast_region(policy: str):
    """bf16 autocast over fake CPU tensors, following `policy`'s lists (POLICIES)."""
    if policy not in POLICIES:
        raise ValueError(f"autocast policy must be one of {POLICIES}, got {policy!r}")
    with torch.autocast("cpu", dtype=torch.bfloat16), (CudaFp32Ops() if policy == "cuda" else contextlib.nullcontext()):
        yield


@contextlib.contextmanager
def state_in(module: nn.Module, dtype: torch.dtype, mode):
    """Every floating parameter, buffer and plain tensor attribute of `module` swapped, for the block,
    for a fake tensor of the same shape in `dtype` (a tensor held under two names stays one); restored
    after. The runtime's autocast trains on fp32 parameters (runtime.loop.recipe.build_model)."""
    swapped: dict[int, torch.Tensor] = {}
    undo: list[tuple[dict, str, torch.Tensor]] = []

    def fake(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in swapped:
            with mode:
                f = torch.empty_strided(t.shape, t.stride(), dtype=dtype, device="cpu")
            swapped[id(t)] = nn.Parameter(f, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else f
        return swapped[id(t)]

    for mod in module.modules():
        tables = [mod._parameters, mod._buffers,
                  {k: v for k, v in vars(mod).items() if isinstance(v, torch.Tensor)}]
        for i, table in enumerate(tables):
            for name, t in list(table.items()):
                if t is not None and t.is_floating_point() and t.dtype != dtype:
                    target = table if i < 2 else vars(mod)
                    undo.append((target, name, t))
                    target[name] = fake(t)
    try:
        yield
    finally:
        for table, name, t in reversed(undo):
            table[name] = t


def as_dtype(t, dtype: torch.dtype, mode):
    """A fake floating tensor (or Parameter) as `dtype`, anything else unchanged (export graphs' state)."""
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dtype == dtype:
        return t
    with mode:
        f = torch.empty_strided(t.shape, t.stride(), dtype=dtype, device="cpu")
    return nn.Parameter(f, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else f


_UNARY = frozenset({"ToCopyBackward0", "TBackward0", "TransposeBackward0", "ViewBackward0", "PermuteBackward0",
                    "ExpandBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0", "AliasBackward0",
                    "UnsqueezeBackward0", "SqueezeBackward0", "SqueezeBackward1", "CloneBackward0",
                    "SliceBackward0", "SelectBackward0"})
"""Autograd nodes of casts and views: one input, the same values in another dtype or layout."""


def saved_kind(t: torch.Tensor) -> str:
    """"weight": computed from one parameter by casts and views alone; "cast": a cast (possibly viewed)
    of a tensor that is not a parameter; "": anything else (module docstring)."""
    fn, cast = t.grad_fn, False
    while fn is not None:
        name = type(fn).__name__
        if name == "AccumulateGrad":
            return "weight" if isinstance(fn.variable, nn.Parameter) else ""
        if name not in _UNARY:
            return "cast" if cast else ""
        cast = cast or name == "ToCopyBackward0"
        inputs = [f for f, _ in fn.next_functions if f is not None]
        if len(inputs) != 1:
            return "cast" if cast else ""
        fn = inputs[0]
    return ""

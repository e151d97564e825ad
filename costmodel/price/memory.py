"""Bytes of model state per parameter, by precision policy and optimizer.

ZeRO (Rajbhandari et al. SC'20, REFERENCE.md): mixed-precision Adam keeps 2 bytes of bf16/fp16
parameters, 2 bytes of gradients and K = 12 bytes of optimizer state (fp32 master weights, momentum,
variance) per parameter: 16 bytes in all. In fp32, Adam keeps 4 + 4 + 8 = 16 bytes; SGD without momentum
4 + 4.

Gradient communication (`grad_comm`, bytes per parameter on the wire): 4 whatever the precision, as
partita's runtime reduces gradients in fp32 -- FSDP2's MixedPrecisionPolicy(reduce_dtype=fp32) under
ZeRO-2/3, and the fp32 gradients of autocast's fp32 parameters under ZeRO-0 (runtime.parallel.precision). So do
Megatron-LM in bf16 (fp32 main_grad all-reduce), torchtitan's FSDP2 default and Composer's DEFAULT mixed
precision.

Gathered parameters (`shard_copy`): where FSDP keeps a layer's parameters gathered (ZeRO-2, a pipeline
stage), its sharded parameter stays too. In mixed precision that shard is the fp32 master, already
among the optimizer's 12 bytes; in fp32 it is one more p-byte copy of 1/d of the parameters.

Optimizer-step traffic (bytes read + written per parameter, memory-bound): Adam reads gradient, master
weight, momentum and variance and writes master weight, momentum, variance and the working copy.

bf16 under autocast (`autocast=True`: partita's runtime without FSDP, runtime.parallel.precision): the model keeps
its fp32 parameters, their fp32 gradients (autograd casts the bf16 weight gradient back to the fp32 leaf)
and fp32 Adam moments -- the fp32 layout, 4 + 4 + 8 bytes; what bf16 adds is a bf16 cast of each weight
that autograd saves for the backward (2 bytes per matmul parameter while its layer's activations live),
priced as saved tensors (costmodel.capture.trace `weight_saved_bytes`), not as model state.

An fp32 gradient buffer beside 16-bit parameters (`fp32_grads`): Megatron-LM in bf16 accumulates and reduces the
gradients in fp32 main_grad buffers unless told --grad-reduce-in-bf16 (megatron/training/arguments.py, "bfloat16
requires gradient accumulation and all-reduce to be done in fp32"; the weight-gradient GEMMs add into them):
2 + 4 + 12 = 18 bytes per parameter with Adam, the step reading 4 bytes of gradient. NeMo's distributed fused Adam
keeps bf16 gradient buckets instead; partita's runtime does not run this layout (TrainConfig.fp32_grads prices a
published run as it ran).

Pure bf16 (`master_weights="none"`: TrainConfig.master_weights): bf16 parameters, bf16 gradients and bf16
optimizer state, no fp32 master copy -- torchtitan with `mixed_precision_param = "bfloat16"` on a bf16 model,
nanotron and Megatron-LM configurations that keep bf16 weights. In ZeRO's notation (Rajbhandari et al. SC'20,
section 3.1, REFERENCE.md: (2 + 2 + K) Psi with K = 12 for fp32 master + m + v) the optimizer term loses the
master and halves the moments, K = 2 + 2 = 4 for Adam (m and v in bf16) and K = 0 for SGD without momentum:

    Adam: 2 (param) + 2 (grad) + 2 (m) + 2 (v) = 8 bytes per parameter, against 16 with fp32 master weights
    SGD:  2 (param) + 2 (grad)                 = 4 bytes per parameter, against 8

Each term shards under ZeRO as before (planner.enumerate.options.zero_state_bytes). Gradients are reduced in
bf16 (`grad_comm` 2: DDP reduces in the parameters' dtype; FSDP2 without a reduce dtype), the shard FSDP keeps
beside a gathered parameter is a bf16 copy (`shard_copy` 2: no fp32 master holds it), and the Adam step
reads gradient, parameter, m and v and writes parameter, m and v: 7 x 2 = 14 bytes (SGD: 3 x 2 = 6).
"""
from __future__ import annotations

from dataclasses import dataclass

from partita.costmodel.errors import PartitaError


@dataclass(frozen=True)
class StateBytes:
    param: int
    grad: int
    optimizer: int
    step_traffic: int
    grad_comm: int = 4
    """Bytes per parameter a gradient all-reduce or reduce-scatter sends (module docstring)."""
    shard_copy: int = 0
    """Bytes per parameter of the sharded parameter FSDP keeps beside a gathered one (module docstring)."""

    @property
    def total(self) -> int:
        return self.param + self.grad + self.optimizer


MASTER_WEIGHTS = ("fp32", "none")
"""Where a 16-bit model's optimizer keeps its weights: an fp32 master copy, or none (pure bf16, module docstring)."""


def state_bytes(dtype: str, optimizer: str = "adam", autocast: bool = False,
                master_weights: str = "fp32", fp32_grads: bool = False) -> StateBytes:
    """Model-state bytes per parameter (module docstring); `autocast`: a bf16 model run under autocast;
    `master_weights` "none": pure bf16, every state in bf16 (8 bytes per parameter with Adam); `fp32_grads`: a 16-bit
    model's gradients accumulate in an fp32 buffer (Megatron-LM's bf16, module docstring)."""
    if optimizer not in ("adam", "sgd"):
        raise PartitaError(f"unknown optimizer {optimizer!r}; accepted: adam, sgd")
    if master_weights not in MASTER_WEIGHTS:
        raise PartitaError(f"master weights {master_weights!r}; accepted: {', '.join(MASTER_WEIGHTS)}")
    if master_weights == "none":
        if dtype not in ("bf16", "fp16"):
            raise PartitaError(f"master weights 'none' needs 16-bit parameters (dtype bf16), got {dtype!r}")
        moments = 2 * 2 if optimizer == "adam" else 0   # bf16 m and v, or none
        traffic = 2 * (7 if optimizer == "adam" else 3)  # read g, p(, m, v); write p(, m, v)
        return StateBytes(param=2, grad=2, optimizer=moments, step_traffic=traffic, grad_comm=2, shard_copy=2)
    half = dtype in ("bf16", "fp16") and not autocast
    p = 2 if half else 4
    if optimizer == "adam":
        opt = 12 if half else 8   # fp32 master + m + v, or m + v
        traffic = p + 4 * 3 + (4 * 3 if half else 4 * 2) + p
    else:
        opt = 4 if half else 0    # fp32 master weights only
        traffic = 2 * p + (8 if half else 0)
    grad = 4 if half and fp32_grads else p
    return StateBytes(param=p, grad=grad, optimizer=opt, step_traffic=traffic + grad - p, shard_copy=0 if half else p)

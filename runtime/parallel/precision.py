"""Training precision of a plan (`plan.train["dtype"]`): fp32, bf16 compute on fp32 master weights, or pure bf16
(`plan.train["master_weights"]` "none").

- fp32: nothing changes; runs are exact against the single-process reference (1e-5).
- bf16 with FSDP (zero_stage 2/3): FSDP2 `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`:
  each unit all-gathers its parameters in bf16 and runs its whole forward/backward in bf16; gradients
  are reduced and applied in fp32 to the fp32 sharded parameters the optimizer holds. A pipeline stage's
  root casts its output back to fp32, so the activations crossing stages keep the dtype the pipeline was
  traced with.
- bf16 without FSDP (DDP, hand-averaged dp, tp, pp): `torch.autocast(device, bfloat16)` around the
  module's (or pipeline stage's) forward: the ops on autocast's lower-precision list (matmuls, attention)
  run in bf16; parameters, gradients and optimizer state stay fp32. Close to the FSDP recipe, not
  bit-equal to it.
- pure bf16 (`is_pure`): the model itself is cast to bf16 (`to_pure`: parameters and floating buffers) before
  any parallelism is applied, so the optimizer is built on the bf16 parameters and keeps bf16 moments (no
  fp32 master copy: costmodel.price.memory's 2 + 2 + 2 + 2 bytes per parameter with Adam); no autocast,
  and gradients are reduced in bf16 (DDP in the parameters' dtype; FSDP2 with `MixedPrecisionPolicy()`,
  no cast). A pipeline stage takes floating inputs in bf16 and sends its output in fp32, the dtype the
  pipeline was traced with, as the FSDP recipe's stage root does.
fp16 needs loss scaling, which this runtime does not do: such a plan is refused before any step.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from partita.planner.plan import Plan, PlanError
from partita.runtime.parallel.wrap import within, wrap_forward

DTYPES = {None: torch.float32, "fp32": torch.float32, "float32": torch.float32,
          "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


def train_dtype(plan: Plan) -> torch.dtype:
    """The compute dtype the plan asks for; PlanError for one this runtime does not execute."""
    name = plan.train.get("dtype")
    if name not in DTYPES:
        raise PlanError(f"train.dtype is {name!r}; this runtime trains in fp32 or bf16 "
                        "(fp16 would need loss scaling, which it does not do)")
    return DTYPES[name]


def is_pure(plan: Plan) -> bool:
    """Whether the plan trains in pure bf16: bf16 parameters and optimizer state, no fp32 master (module docstring)."""
    return plan.train.get("master_weights") == "none" and train_dtype(plan) == torch.bfloat16


def to_pure(module: nn.Module, stage: bool = False) -> None:
    """Cast `module` to bf16 in place (module docstring); `stage`: a pipeline stage, fed and read in fp32."""
    module.to(torch.bfloat16)
    if stage:
        cast = lambda v, dt: v.to(dt) if isinstance(v, torch.Tensor) and v.is_floating_point() else v

        def around(inner, args, kwargs):
            out = inner(*(cast(a, torch.bfloat16) for a in args), **{k: cast(v, torch.bfloat16) for k, v in kwargs.items()})
            return tuple(cast(o, torch.float32) for o in out) if isinstance(out, tuple) else cast(out, torch.float32)
        wrap_forward(module, around)


def fsdp_policy(dtype: torch.dtype, stage_root: bool = False, pure: bool = False):
    """FSDP2's policy for a unit; `stage_root`: a pipeline stage's root, whose output goes out in fp32;
    `pure`: a pure-bf16 model, no cast at all (gradients reduced in bf16; to_pure sets the stage's dtypes)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy  # only sharded plans need FSDP
    if dtype == torch.float32 or pure:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32,
                                output_dtype=torch.float32 if stage_root else None)


def autocast_forward(module: nn.Module, dtype: torch.dtype, device: torch.device) -> None:
    """Run `module`'s forward under autocast to `dtype` (in place; a no-op for fp32)."""
    if dtype != torch.float32:
        wrap_forward(module, within(lambda: torch.autocast(device.type, dtype=dtype)))


def describe(dtype: torch.dtype, fsdp: bool, pure: bool = False) -> str:
    """One line for the run report."""
    if dtype == torch.float32:
        return "precision: fp32"
    if pure:
        return "precision: pure bf16 (bf16 parameters, gradients and optimizer state; no fp32 master weights)"
    how = "FSDP2 MixedPrecisionPolicy, fp32 gradient reduction" if fsdp else "torch.autocast"
    return f"precision: bf16 compute on fp32 master weights ({how})"

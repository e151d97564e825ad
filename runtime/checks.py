"""Pre-flight checks of a plan against the model and the world size, before any process group exists.

Each failure raises PlanError with one line saying what differs; the entry point prints it and exits 2.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from costmodel import model_fingerprint
from costmodel.models import ModelSpec
from planner.plan import Plan, PlanError
from runtime.fsdp import sharded
from runtime.pp import SCHEDULES, check_schedule
from runtime.recipe import OPTIMIZERS
from runtime.precision import describe, train_dtype


def build_meta(spec: ModelSpec) -> nn.Module:
    """The model on the meta device: names, shapes and dtypes without memory."""
    with torch.device("meta"):
        return spec.build()


def preflight(plan: Plan, spec: ModelSpec, world_size: int) -> list[str]:
    """Raise PlanError if the plan cannot run here; return notes worth printing (e.g. dtype)."""
    m = plan.mesh
    if world_size != m.world_size:
        raise PlanError(f"plan is for {m.world_size} ranks (pp={m.pp} x dp={m.dp} x tp={m.tp}) "
                        f"but WORLD_SIZE is {world_size}")
    model = build_meta(spec)
    want = plan.model.get("fingerprint")
    if want is not None and want != (got := model_fingerprint(model)):
        raise PlanError(f"plan was made for model {plan.model.get('name')!r} with fingerprint {want}, "
                        f"but --model {spec.name} has fingerprint {got} (different parameters)")
    seq = plan.train.get("seq_len")
    if seq is not None and spec.seq_len is not None and seq != spec.seq_len:
        raise PlanError(f"plan trains sequences of {seq} tokens but --model {spec.name} has seq_len {spec.seq_len}")
    modules = dict(model.named_modules())
    for i, stage in enumerate(plan.stages):
        for fqn in ([stage.split_at] if stage.split_at else []) + stage.modules:
            if fqn not in modules:
                raise PlanError(f"stages[{i}] names module {fqn!r}, which --model {spec.name} does not have")
    if plan.schedule.name not in SCHEDULES:
        raise PlanError(f"schedule {plan.schedule.name} is not executed by this runtime, which runs "
                        f"{', '.join(SCHEDULES)}")
    check_schedule(plan)
    if len(plan.stages) > 1 and spec.loss_fn is not None:
        raise PlanError(f"model {spec.name!r} computes its own loss (loss_fn), which this runtime does not split "
                        "into pipeline stages (the last stage needs logits and targets): use a plan with pp=1")
    for fqn, style in plan.placements.items():
        mod = modules.get(fqn)
        if not isinstance(mod, nn.Linear):
            raise PlanError(f"placements[{fqn!r}] must name an nn.Linear of --model {spec.name}, "
                            f"found {type(mod).__name__ if mod is not None else 'nothing'}")
        dim = mod.out_features if style == "colwise" else mod.in_features
        if dim % m.tp:
            raise PlanError(f"placements[{fqn!r}] = {style} splits a dimension of {dim} over tp={m.tp}, "
                            "which does not divide it")
    check_blocks(plan, modules, spec.name)
    optimizer_name(plan)
    fsdp, dtype = sharded(plan), train_dtype(plan)
    return [] if dtype == torch.float32 else [describe(dtype, fsdp)]


def optimizer_name(plan: Plan) -> str:
    """The plan's optimizer ("adam" when unset); PlanError for one the runtime does not build."""
    name = plan.train.get("optimizer") or "adam"
    if name not in OPTIMIZERS:
        raise PlanError(f"train.optimizer is {name!r}; this runtime builds {' and '.join(OPTIMIZERS)}")
    return name


def check_blocks(plan: Plan, modules: dict[str, nn.Module], model: str) -> None:
    """Each block names a module once, on the stage that runs it, with choices this runtime executes."""
    owner = {fqn: s.index for s in plan.stages for fqn in s.modules}
    seen = set()
    for i, b in enumerate(plan.blocks):
        if b.fqn not in modules:
            raise PlanError(f"blocks[{i}] names module {b.fqn!r}, which --model {model} does not have")
        if b.fqn in seen:
            raise PlanError(f"blocks[{i}] names module {b.fqn!r} a second time")
        seen.add(b.fqn)
        if not b.fqn and plan.mesh.pp > 1:
            raise PlanError(f"blocks[{i}] names the whole model, which a pipeline of {plan.mesh.pp} stages splits")
        parts = b.fqn.split(".")
        listed = [owner[a] for a in (".".join(parts[:k]) for k in range(len(parts), 0, -1)) if a in owner]
        if listed and listed[0] != b.stage:
            raise PlanError(f"blocks[{i}] puts {b.fqn!r} on stage {b.stage}, but stages[{listed[0]}] holds it")
        if b.offload_activations and b.recompute == "full":
            raise PlanError(f"blocks[{i}] ({b.fqn!r}) offloads activations under full recompute, which keeps only "
                            "the block's input (still in use): nothing to offload; use recompute none or selective")

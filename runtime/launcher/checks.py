"""Pre-flight checks of a plan against the model and the world size, before any process group exists.

Each failure raises PlanError with one line saying what differs; the entry point prints it and exits 2.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from partita.costmodel import model_fingerprint
from partita.costmodel.price.fusion import KERNELS
from partita.costmodel.models import ModelSpec
from partita.costmodel.models.meta import meta_build
from partita.planner.plan import executable
from partita.planner.plan import Plan, PlanError
from partita.runtime.parallel import cp as context_parallel
from partita.runtime.parallel.blocks import is_layer
from partita.runtime.parallel import ep as expert_parallel
from partita.runtime.parallel.fsdp import sharded
from partita.runtime.parallel.pp import check_schedule
from partita.runtime.loop.recipe import OPTIMIZERS
from partita.runtime.parallel.layers import is_norm
from partita.runtime.parallel.precision import describe, is_pure, train_dtype


def build_meta(spec: ModelSpec) -> nn.Module:
    """The model on the meta device: names, shapes and dtypes without memory."""
    return meta_build(spec.build)


def preflight(plan: Plan, spec: ModelSpec, world_size: int) -> list[str]:
    """Raise PlanError if the plan cannot run here; return notes worth printing (e.g. dtype)."""
    m = plan.mesh
    if world_size != m.world_size:
        cp = f" x cp={m.cp}" if m.cp > 1 else ""
        raise PlanError(f"plan is for {m.world_size} ranks (pp={m.pp} x dp={m.dp}{cp} x tp={m.tp}) "
                        f"but WORLD_SIZE is {world_size}")
    model = build_meta(spec)
    notes = check_model(plan, spec, model)
    seq = plan.train.get("seq_len")
    if seq is not None and spec.seq_len is not None and seq != spec.seq_len:
        raise PlanError(f"plan trains sequences of {seq} tokens but --model {spec.name} has seq_len {spec.seq_len}")
    modules = dict(model.named_modules())
    for i, stage in enumerate(plan.stages):
        for fqn in ([stage.split_at] if stage.split_at else []) + stage.modules:
            if fqn not in modules:
                raise PlanError(f"stages[{i}] names module {fqn!r}, which --model {spec.name} does not have")
    check_stage_coverage(plan, model, spec.name)
    context_parallel.check_plan(plan, spec, model)
    expert_parallel.check_plan(plan, spec, model)
    check_executable(plan, spec, model)
    check_placements(plan, model, spec)
    check_blocks(plan, modules, spec.name)
    optimizer_name(plan)
    fsdp, dtype = sharded(plan), train_dtype(plan)
    return notes + ([] if dtype == torch.float32 else [describe(dtype, fsdp, is_pure(plan))])


def check_model(plan: Plan, spec: ModelSpec, model: nn.Module) -> list[str]:
    """The model to train is the one the plan was made for: its fingerprint (parameter names, shapes, dtypes)
    equals the plan's. The plan's model name is only compared, never resolved: a name that differs is a note,
    which says whether the fingerprints agree or the plan has none to check (a hand-written plan; its module
    names are still checked against the model)."""
    name, want, got = plan.model.get("name"), plan.model.get("fingerprint"), model_fingerprint(model)
    shown = _shown(name)
    if want is not None and want != got:
        raise PlanError(f"plan was made for model {shown} with fingerprint {want}, but --model {spec.name} has "
                        f"fingerprint {got} (different parameters)")
    if name is None or name == spec.name:
        return []
    if want is None:
        return [f"note: plan was made for model {shown}, not --model {spec.name}, and records no fingerprint to "
                "check that they are the same model"]
    return [f"note: plan was made for model {shown}; --model {spec.name} has the same parameters (fingerprint "
            f"{got}), so it runs"]


def _shown(name) -> str:
    """The plan's model name for a message: quoted, escaped, short (a plan file is untrusted text)."""
    text = repr(name)
    return text if len(text) <= 60 else text[:57] + "..."


def check_stage_coverage(plan: Plan, model: nn.Module, name: str) -> None:
    """Every parameter of the model lies in a module some stage lists (a tied parameter: under one of its
    names), so no layer goes untrained; planner.plan's loader has already refused a module listed twice.
    One stage runs the whole model (every parameter trains, the root module's own ones too)."""
    if len(plan.stages) == 1:
        return
    listed = [fqn for s in plan.stages for fqn in s.modules]
    names: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(n)
    for aliases in names.values():
        if not any(fqn == "" or n.startswith(fqn + ".") for n in aliases for fqn in listed):
            parts = aliases[0].split(".")[:-1]  # the outermost module of it that holds nothing listed
            owner = next((a for a in (".".join(parts[:k]) for k in range(1, len(parts) + 1))
                          if not any(fqn.startswith(a + ".") for fqn in listed)), "")
            raise PlanError(f"no stage lists module {owner!r} of --model {name} (parameter {aliases[0]!r}): it "
                            "would not be trained; add it to the stage that runs it")


def check_executable(plan: Plan, spec: ModelSpec, model: nn.Module) -> None:
    """The plan within what this runtime executes, as planner.plan.executable states it (the planner plans
    within the same limits): its schedule, its ZeRO stage on its mesh, no overlap it cannot run, and a
    pipeline only for a model a pipeline runs.
    A `package.module:factory` token model gets its vocabulary and sequence length here (from its embedding
    and example batch: the factory's ModelSpec records neither), so its batches are token windows."""
    if spec.loss_fn is None and not spec.vocab and (shape := executable.token_model_shape(spec, model)):
        spec.vocab, spec.seq_len = shape
    if len(plan.stages) > 1 and (why := executable.pipeline_refusal(spec)):
        raise PlanError(why)
    if plan.schedule.name not in executable.SCHEDULES:
        raise PlanError(f"schedule {plan.schedule.name} is not executed by this runtime, which runs "
                        f"{', '.join(executable.SCHEDULES)}")
    check_schedule(plan)
    if plan.kernels not in KERNELS:
        raise PlanError(f"plan's solver.fixed.kernels is {plan.kernels!r}; this runtime runs "
                        f"{' or '.join(KERNELS)}: re-plan with --kernels {{{','.join(KERNELS)}}}")
    m = plan.mesh
    if why := (executable.zero_refusal(plan.zero_stage, m.tp, m.cp, m.ep)
               or executable.overlap_refusal(plan.overlap.get("tp_comm", False), plan.overlap.get("p2p", False))
               or executable.sync_refusal(plan.sync.mode, m.pp, m.tp, m.cp, m.ep, plan.zero_stage)):
        raise PlanError(why)


def _what(mod: nn.Module | None) -> str:
    return type(mod).__name__ if mod is not None else "nothing"


def check_placements(plan: Plan, model: nn.Module, spec: ModelSpec) -> None:
    """Each placement names a module of the kind its style shards, with dimensions tp divides
    (runtime/parallel/tp.py states the rules)."""
    modules, tp = dict(model.named_modules()), plan.mesh.tp
    last = [f for f, m in modules.items() if any(True for _ in m.parameters(recurse=False))][-1:]
    owners: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(name)
    for fqn, style in plan.placements.items():
        mod = modules.get(fqn)
        where = f"placements[{fqn!r}] = {style}"
        if style in ("colwise", "rowwise"):
            if not isinstance(mod, nn.Linear):
                raise PlanError(f"placements[{fqn!r}] must name an nn.Linear of --model {spec.name}, "
                                f"found {_what(mod)}")
            dims = [(mod.out_features if style == "colwise" else mod.in_features, "a dimension")]
        elif style == "sequence":
            if mod is None or not is_norm(mod):
                raise PlanError(f"{where} needs a norm (LayerNorm or RMSNorm) of --model {spec.name}, "
                                f"found {_what(mod)}")
            _check_sequence_block(plan, modules, fqn)
            dims = [(spec.seq_len or plan.train.get("seq_len") or 0, "the sequence")]
        elif isinstance(mod, nn.Embedding):  # vocab
            dims = [(mod.num_embeddings, "the vocabulary")]
        elif isinstance(mod, nn.Linear):
            if [fqn] != last:
                raise PlanError(f"{where} is for the LM head, the model's last layer (its output is the logits "
                                f"the loss reads), but --model {spec.name}'s last layer is {last[0]!r}")
            dims = [(mod.out_features, "the vocabulary")]
        else:
            raise PlanError(f"{where} needs an nn.Embedding or the LM head nn.Linear of --model {spec.name}, "
                            f"found {_what(mod)}")
        for dim, what in dims:
            if dim % tp:
                raise PlanError(f"{where} splits {what} of {dim} over tp={tp}, which does not divide it")
        for name, p in mod.named_parameters(prefix=fqn):
            if len(tied := owners.get(id(p), [])) > 1:
                other = next(n for n in tied if n != name)
                raise PlanError(f"{where} would shard {name!r}, which is tied to {other!r} (the same tensor); "
                                "sharding one would untie them: leave both replicated")


def _check_sequence_block(plan: Plan, modules: dict[str, nn.Module], fqn: str) -> None:
    """A module holding a "sequence" norm runs sequence-parallel (runtime/parallel/tp.py, rule 2): all its norms must be
    "sequence", and row-parallel layers must put its sublayers' outputs on the sequence shards."""
    parent = fqn.rpartition(".")[0]
    if not parent:
        return
    others = [f"{parent}.{n}" for n, c in modules[parent].named_children()
              if is_norm(c) and plan.placements.get(f"{parent}.{n}") != "sequence"]
    if others:
        raise PlanError(f"placements[{fqn!r}] = sequence makes {parent!r} sequence-parallel (its residual stream "
                        f"is sharded on the sequence), so its norm {others[0]!r} must be 'sequence' too")
    if not any(f.startswith(parent + ".") and s == "rowwise" for f, s in plan.placements.items()):
        raise PlanError(f"placements[{fqn!r}] = sequence makes {parent!r} sequence-parallel, but no rowwise layer "
                        "in it reduce-scatters its sublayers' outputs onto the sequence shards of its residual stream")


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
        kernels = plan.kernels if is_layer(b.fqn) else "eager"  # only the layers run compiled (runtime.parallel.blocks)
        if why := executable.offload_refusal(b.recompute, b.offload_activations, kernels, b.fqn):
            raise PlanError(why)


def dropout_probability(spec: ModelSpec) -> float:
    """The largest dropout probability the model trains with: a `dropout` in its config (gpt:/llama:
    families), an nn.Dropout module (user modules), or a *drop* probability of a HuggingFace config
    (dropout, attention_dropout, resid_pdrop ...); 0 when none."""
    found = [float(spec.config.get("dropout") or 0.0)]
    for m in build_meta(spec).modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            found.append(m.p)
        config = getattr(m, "config", None)
        if config is not None and hasattr(config, "to_dict"):
            found += [v for k, v in config.to_dict().items()
                      if "drop" in k and isinstance(v, float) and not isinstance(v, bool) and v < 1.0]
    return max(found)

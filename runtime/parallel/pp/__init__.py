"""Pipeline parallelism: split the user's module at the plan's FQNs and run the plan's schedule (1F1B, GPipe,
interleaved 1F1B: torch's class named by planner.plan.schedules).

`torch.distributed.pipelining.pipeline()` traces the module (torch.export) with one example
microbatch and splits it at the beginning of each stage's `split_at` module; stage modules keep
the original parameter FQNs, so tensor parallelism can still be applied by name. With interleaved 1F1B
the plan has pp x virtual_stages stages in model order and pipeline rank r holds stages r, r + pp, ...
(`local_stages`): one PipelineStage each, all driven by one multi-stage schedule (ScheduleInterleaved1F1B).

Models with their own loss (planner.plan.executable says which a pipeline runs): a HuggingFace causal or masked
LM is traced with a forward that returns its logits (`_logits_forward`, with the capture's patches of
costmodel.models.hf so the trace follows eager training), and the last stage's loss is computed from
those logits and the batch's labels: HF's shifted next-token cross-entropy for a causal LM
(runtime.loop.recipe.hf_causal_loss), the plain token cross-entropy for a masked LM (every position
labelled). `split` records that loss on the Pipe (`PIPE_LOSS`), and `build_schedule` uses it.

Values a model computes once and gives to every layer (HF's rotary cos/sin, Falcon's causal mask) would
flow from stage 0 to every later stage, a skip connection torch's schedules do not run: `split` traces
with runtime.parallel.pp.relay's split_policy, which relays them through the stages in between.

Tied weights across stages (Megatron's embedding group): a parameter held under two names whose users land
on different stages is replicated by `pipeline()` into each stage that uses it. `TiedSync` keeps the copies
one parameter: at build time every copy is overwritten by the copy of the stage holding its first name
(broadcast), and after each schedule step the copies' gradients are summed (all-reduce) over the pipeline
ranks holding them -- one process group per (dp, tp) coordinate -- before any data-parallel averaging and
the optimizer step, so each copy takes the update of the single tied parameter.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from partita.runtime.loop.recipe import is_dtensor
from partita.planner.plan import schedules
from partita.planner.plan import Plan, PlanError
from partita.runtime.parallel.blocks import blocks_in
from partita.runtime.loop.memory import local
from partita.runtime.parallel.pp.relay import relay_skips, skip_edges, split_markers
from partita.runtime.loop.recipe import hf_causal_loss, lm_loss

SCHEDULES = {name: s.torch_class for name, s in schedules.SCHEDULES.items()}
"""The plan's schedule names and torch.distributed.pipelining's classes for them (planner.plan.schedules). That
module (torch._dynamo with it, about a second per process) is imported only by a rank that runs a pipeline."""
PIPE_LOSS = "_partita_loss"
"""Attribute of the Pipe holding the last stage's loss(output, target) when the model needs its own."""
PIPE_TIED = "_partita_tied"
"""Attribute of the Pipe holding the model's tied parameter names: [(first name, other names...)]."""


def local_stages(plan: Plan, pp_rank: int) -> list[int]:
    """Indices of the stages pipeline rank `pp_rank` runs: pp_rank, pp_rank + pp, ... (plan.py)."""
    return list(range(pp_rank, len(plan.stages), plan.mesh.pp))


def check_schedule(plan: Plan) -> None:
    """PlanError if torch's schedule cannot run the plan's microbatches and stages: the schedule's own
    refusal (planner.plan.schedules), which plan validation states in the same words."""
    s = plan.schedule
    if why := schedules.schedule(s.name).refusal(s.num_microbatches, plan.mesh.pp, s.virtual_stages):
        raise PlanError(why)


def _hf_loss(model: nn.Module):
    """The pipeline loss of a HuggingFace LM (module docstring), or None for any other module."""
    kind = getattr(model, "loss_type", None) if _is_hf(model) else None
    return {"ForCausalLM": hf_causal_loss, "ForMaskedLM": lm_loss}.get(kind)


def _is_hf(model: nn.Module) -> bool:
    return any(c.__module__.startswith("transformers.") for c in type(model).__mro__)


@contextlib.contextmanager
def _logits_forward(model: nn.Module):
    """While tracing: `model(input_ids)` returns the HF model's logits (no loss, no cache), traced as
    eager training runs (costmodel.models.hf_export.export_context)."""
    from partita.costmodel.models.hf_export import export_context
    cls_forward = type(model).forward

    def logits(input_ids):
        return cls_forward(model, input_ids=input_ids).logits  # export_context turns use_cache off

    model.forward = logits
    rotary = _plain_rotary_forwards(model)
    try:
        with export_context(model):
            yield
    finally:
        del model.forward
        for m in rotary:
            del m.forward


def _plain_rotary_forwards(model: nn.Module) -> list[nn.Module]:
    """Rotary-embedding modules (HF's `*RotaryEmbedding`) traced without their `@torch.no_grad()` decorator:
    torch.export records it as a higher-order op whose subgraph `pipeline()`'s unflattening loses (the
    split stage then lacks an input). They compute cos/sin of a buffer, which needs no gradient anyway."""
    patched = []
    for m in model.modules():
        fn = type(m).forward
        if type(m).__name__.endswith("RotaryEmbedding") and hasattr(fn, "__wrapped__"):
            m.forward = fn.__wrapped__.__get__(m)
            patched.append(m)
    return patched


def tied_names(model: nn.Module) -> list[tuple[str, ...]]:
    """Each parameter held under several names: (first name, other names...)."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return [tuple(n) for n in names.values() if len(n) > 1]


def split(model: nn.Module, plan: Plan, example_microbatch: torch.Tensor):
    """Trace and split `model` into the plan's stages; returns the Pipe. Values the model hands to every
    layer (rotary tables, masks) are relayed stage by stage (runtime.parallel.pp.relay)."""
    from torch.distributed import pipelining
    points = [s.split_at for s in plan.stages[1:]]
    loss = _hf_loss(model)
    tied = tied_names(model)
    with warnings.catch_warnings():  # torch-internal pytree deprecation noise from export, once per rank
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        with split_markers(model, points), _logits_forward(model) if loss is not None else contextlib.nullcontext():
            pipe = pipelining.pipeline(model, mb_args=(example_microbatch,), split_policy=relay_skips)
    setattr(pipe, PIPE_LOSS, loss)
    setattr(pipe, PIPE_TIED, tied)
    if pipe.num_stages != len(plan.stages):
        raise PlanError(f"splitting at {points} gave {pipe.num_stages} stages, the plan has {len(plan.stages)}")
    if skips := skip_edges(pipe.split_gm):
        raise PlanError(f"model {type(model).__name__} passes values from pipeline stage {skips[0][0]} straight to "
                        f"stage {skips[0][1]} (a skip connection), which torch.distributed.pipelining does not run: "
                        "use a plan with pp=1")
    check_ownership(pipe, plan, model)
    persistent = set(model.state_dict())
    for i in range(pipe.num_stages):
        _keep_nonpersistent(pipe.get_stage_module(i), persistent)
        blocks_in(pipe.get_stage_module(i), plan, i)  # on every rank, so that all of them stop if one stage would
    return pipe


def _keep_nonpersistent(stage: nn.Module, persistent: set[str]) -> None:
    """Buffers the user's model leaves out of its state dict (HF's rotary `inv_freq`) stay out of the
    stage's, which `pipeline()` would otherwise save: checkpoints then hold the same keys under any plan."""
    for prefix, m in stage.named_modules():
        for name in m._buffers:
            if (f"{prefix}.{name}" if prefix else name) not in persistent:
                m._non_persistent_buffers_set.add(name)


def check_ownership(pipe, plan: Plan, model: nn.Module) -> None:
    """Every parameter of a module the plan lists for stage i must live in stage i after the split."""
    owned = {i: {n for n, _ in pipe.get_stage_module(i).named_parameters(remove_duplicate=False)}
             for i in range(pipe.num_stages)}
    aliases = {n: names for names in tied_names(model) for n in names}  # a tied parameter: any of its names
    for stage in plan.stages:
        for fqn in stage.modules:
            for name, _ in model.get_submodule(fqn).named_parameters(prefix=fqn):
                if not owned[stage.index].intersection(aliases.get(name, (name,))):
                    where = [i for i, names in owned.items() if name in names]
                    raise PlanError(f"plan puts {fqn!r} on stage {stage.index}, but splitting at the plan's "
                                    f"split_at points puts {name!r} on stage {where[0] if where else '?'}")


def build_schedule(pipe, plan: Plan, stage_indices: list[int], device: torch.device, group,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    """This rank's PipelineStages (one per index) and the plan's schedule over them.

    Gradients are scaled by 1/num_microbatches (scale_grads), so with a per-microbatch mean loss they
    equal those of the mean loss over the whole (data-parallel rank's) batch.
    """
    stages = [pipe.build_stage(i, device, group=group) for i in stage_indices]
    from torch.distributed import pipelining
    record = schedules.schedule(plan.schedule.name)
    cls, n = getattr(pipelining, record.torch_class), plan.schedule.num_microbatches
    loss_fn = getattr(pipe, PIPE_LOSS, None) or loss_fn
    if record.virtual:  # torch's multi-stage schedules take the list of this rank's stages
        schedule = cls(stages, n_microbatches=n, loss_fn=loss_fn, scale_grads=True)
    else:
        assert len(stages) == 1, stage_indices
        schedule = cls(stages[0], n_microbatches=n, loss_fn=loss_fn, scale_grads=True)
    tied = TiedSync.build(pipe, plan, stage_indices, group)
    return stages, (tied.wrap(schedule) if tied is not None else schedule)


class TiedSync:
    """The copies of tied parameters on several pipeline stages kept one parameter (module docstring)."""

    def __init__(self, links: list[tuple[list[torch.Tensor], object]], uncounted: list[torch.Tensor] = ()):
        self.links = links
        """Per tied parameter this rank holds a copy of: (its local copies, the process group of its holders)."""
        self.uncounted = list(uncounted)
        """The copies a norm over all ranks leaves out, so that each tied parameter counts once: every copy but
        one on the first owner's pipeline rank (runtime.loop.clip)."""

    @classmethod
    def build(cls, pipe, plan: Plan, stage_indices: list[int], pp_group) -> "TiedSync | None":
        """Collective over all ranks (new_group, broadcast): the groups of the tied parameters split over
        pipeline ranks, with every copy set to the first owner's; None when no tied parameter is split."""
        pp = plan.mesh.pp
        world = dist.get_world_size()
        width = world // pp  # ranks per pipeline rank: the mesh is (pp, dp, tp) with pp outermost (runtime.launcher.mesh)
        mine = dist.get_process_group_ranks(pp_group)
        coord = mine[0] % width
        if mine != [coord + k * width for k in range(pp)]:
            raise PlanError(f"pipeline group {mine} is not the (pp, dp, tp) mesh's column of rank {dist.get_rank()}")
        links, uncounted = [], []
        here = stage_indices[0] % pp
        for names in getattr(pipe, PIPE_TIED, []):
            holders = {}  # stage index -> its copy
            for i in range(pipe.num_stages):
                params = dict(pipe.get_stage_module(i).named_parameters(remove_duplicate=False))
                held = [params[n] for n in names if n in params]
                if held:
                    holders[i] = (held[0], any(n == names[0] for n in params))
            ranks = sorted({i % pp for i in holders})
            if len(ranks) < 2:
                continue  # one pipeline rank holds every copy: autograd sums the gradients itself
            first = next((i for i, (_, has_first) in holders.items() if has_first), min(holders)) % pp
            mine_group = None
            for c in range(width):  # every rank creates every group, in the same order
                g = pp_group if len(ranks) == pp else dist.new_group([c + k * width for k in ranks])
                if c == coord:
                    mine_group = g
            copies = list({id(p): p for i, (p, _) in holders.items() if i in stage_indices}.values())
            if copies:
                for p in copies:  # the first owner's values on every copy
                    dist.broadcast(local(p).detach(), src=coord + first * width, group=mine_group)
                links.append((copies, mine_group))
                uncounted += copies[1:] if here == first else copies
        return cls(links, uncounted) if links else None

    def wrap(self, schedule):
        return _SyncedSchedule(schedule, self)

    @torch.no_grad()
    def sum_grads(self) -> None:
        """Each tied parameter's gradient = the sum of its copies' gradients over the stages holding one."""
        for copies, group in self.links:
            grads = [local(p.grad) for p in copies if p.grad is not None]
            total = torch.stack(grads).sum(0) if grads else torch.zeros_like(local(copies[0]))
            dist.all_reduce(total, group=group)
            for p in copies:
                if p.grad is not None:
                    local(p.grad).copy_(total)
                elif not is_dtensor(p):
                    p.grad = total.clone()
                else:
                    raise PlanError("a tied parameter's sharded copy got no gradient on its stage")


class _SyncedSchedule:
    """A torch pipeline schedule whose `step` ends with the tied gradients summed (TiedSync)."""

    def __init__(self, schedule, tied: TiedSync):
        self.schedule, self.tied = schedule, tied

    def step(self, *args, **kwargs):
        out = self.schedule.step(*args, **kwargs)
        self.tied.sum_grads()
        return out

    def __getattr__(self, name):
        return getattr(self.schedule, name)

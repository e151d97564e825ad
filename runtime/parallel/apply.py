"""Apply a plan to the user's module and run this rank's share of one training step.

`parallelize` applies, in place and by module FQN, to the whole model (pp == 1) or to this rank's
pipeline stage (pp > 1): each block's recompute and activation offload, and for a plan priced with
compiled kernels torch.compile of each layer (runtime.parallel.blocks), the tensor-
parallel layers (runtime.parallel.tp), then ZeRO 2/3 as FSDP2 units over the dp axis (runtime.parallel.fsdp) -- or, with
zero_stage 0, bf16 autocast when the plan trains in bf16 (runtime.parallel.precision).

- pp == 1: the user's module runs as written. Data parallelism is FSDP (zero_stage 2/3), else DDP when
  tp == 1, else gradients are averaged over the dp group by hand; with num_microbatches > 1 gradients are
  accumulated over contiguous microbatches, each loss divided by their number, so gradients equal those
  of the full batch.
- pp > 1: the module is split into stages (runtime.parallel.pp), this rank's stage (or, interleaved, stages)
  parallelized as above, the plan's schedule runs the microbatches, and gradients are averaged over the
  dp group (by FSDP, or by hand).

Tensor parallelism (runtime.parallel.tp) adds two things to a step: with a vocab-parallel LM head, forward and
backward run inside `loss_parallel()` (the loss comes back as a plain tensor, recipe.lm_loss); after the
backward, DTensor gradients are given their parameters' placements (`settle_grads`: the Partial gradients
of sequence-parallel norms summed over tp) before any dp averaging and the optimizer.

Each executor exposes `modules` (the user's module or this rank's stage modules, unwrapped: their
parameter and state-dict names are the user's FQNs, which checkpoints rely on) and `params`.

The data-parallel gradient sync is DDP's (built here as `DDP`) or `average_grads`'s: the negative tests of
--verify replace these two names in a worker they start themselves (tests/runtime/injected_bugs.py); no
switch in this module turns the sync off.
"""
from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.nn.parallel import DistributedDataParallel as DDP

from partita.costmodel.models import ModelSpec
from partita.costmodel.errors import PartitaError
from partita.planner.plan import Plan
from partita.planner.plan.sync import SYNC_MODES
from partita.runtime.parallel import cp as context_parallel
from partita.runtime.parallel import ep as expert_parallel
from partita.runtime.parallel.blocks import apply_block_choices, blocks_in
from partita.runtime.data import split_batch
from partita.runtime.parallel.fsdp import apply_fsdp, sharded
from partita.runtime.loop.memory import local
from partita.runtime.launcher.mesh import Topology
from partita.runtime.parallel.precision import autocast_forward, describe, is_pure, to_pure, train_dtype
from partita.runtime.loop.recipe import LossFn, lm_loss, loss_for, make_optimizer
from partita.runtime.loop.recipe import is_dtensor
from partita.runtime.parallel.zero1 import make_zero1


def _tp():
    """runtime.parallel.tp, imported by the plans that use it: it loads DTensor (~1 s of a worker's start)."""
    from partita.runtime.parallel import tp
    return tp


def loss_context(parallel: bool):
    return _tp().loss_context(True) if parallel else contextlib.nullcontext()


def plain(t: torch.Tensor) -> torch.Tensor:
    """A (replicated) DTensor loss as a plain tensor, differentiably."""
    return t.full_tensor() if is_dtensor(t) else t


def settle_grads(params: list[torch.Tensor]) -> None:
    if any(is_dtensor(p) for p in params):  # (runtime.parallel.tp.settle_grads)
        _tp().settle_grads(params)


@torch.no_grad()
def average_grads(params: list[torch.Tensor], group, size: int) -> None:
    """All-reduce the local gradient shards over `group` and divide by its size (one bucket per dtype)."""
    buckets: dict[torch.dtype, list[torch.Tensor]] = defaultdict(list)
    for p in params:
        if p.grad is not None:
            g = local(p.grad)
            buckets[g.dtype].append(g)
    for grads in buckets.values():
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=group)
        flat.div_(size)
        for g, avg in zip(grads, _unflatten_dense_tensors(flat, grads)):
            g.copy_(avg)


@dataclass
class Applied:
    """What `parallelize` did to this rank's module; printed with the run report and in --losses-out."""

    recompute: dict[str, str] = field(default_factory=dict)
    offload_activations: list[str] = field(default_factory=list)
    offload_states: list[str] = field(default_factory=list)
    tp_layers: int = 0
    fsdp_units: int = 0
    reshard_after_forward: bool | None = None
    precision: str = ""
    local_params: int = 0
    """Elements of the parameter shards this rank holds."""
    expert_layers: int = 0
    """Mixture-of-experts layers whose experts are sharded over the ep group (runtime.parallel.ep)."""
    compiled: list[str] = field(default_factory=list)
    """Layers whose forward runs torch.compile'd (a plan priced with compiled kernels, runtime.parallel.blocks)."""

    @classmethod
    def merge(cls, parts: list["Applied"]) -> "Applied":
        """One record for the several pipeline stages a rank runs (interleaved schedules)."""
        if len(parts) == 1:
            return parts[0]
        out = cls(reshard_after_forward=parts[0].reshard_after_forward, precision=parts[0].precision)
        for a in parts:
            out.recompute.update(a.recompute)
            out.offload_activations += a.offload_activations
            out.offload_states += a.offload_states
            out.tp_layers += a.tp_layers
            out.fsdp_units += a.fsdp_units
            out.local_params += a.local_params
            out.expert_layers += a.expert_layers
            out.compiled += a.compiled
        return out

    def summary(self) -> str:
        parts = [f"FSDP2 x{self.fsdp_units} units (reshard after forward: {self.reshard_after_forward})"
                 if self.fsdp_units else "no FSDP"]
        if self.expert_layers:
            parts.append(f"{self.expert_layers} expert-parallel MoE layers")
        if self.tp_layers:
            parts.append(f"{self.tp_layers} tensor-parallel layers")
        for mode in ("full", "op", "selective"):
            if names := [f for f, m in self.recompute.items() if m == mode]:
                parts.append(f"recompute {mode}: {', '.join(names)}")
        for what in ("offload_activations", "offload_states", "compiled"):
            if names := getattr(self, what):
                parts.append(f"{what.replace('_', ' ')}: {', '.join(names)}")
        return "; ".join(parts)


def parallelize(module: nn.Module, plan: Plan, topo: Topology, stage: int | None = None) -> Applied:
    """Apply the plan to `module` (the model, or pipeline stage `stage`) in place, as the module docstring
    says. With FSDP (`Applied.fsdp_units` > 0) FSDP also reduces the gradients over dp."""
    blocks = blocks_in(module, plan, stage)
    pure = is_pure(plan)
    if pure:  # before any parallelism: DTensor and FSDP shards are then bf16, and so is the optimizer's state
        to_pure(module, stage=stage is not None)
    compiled = apply_block_choices(module, blocks, compiled=plan.kernels == "compiled")
    done = Applied(recompute={f: b.recompute for f, b in blocks.items() if b.recompute != "none"},
                   offload_activations=[f for f, b in blocks.items() if b.offload_activations], compiled=compiled)
    if plan.mesh.ep > 1:
        done.expert_layers = expert_parallel.apply(module, plan, topo)
    if topo.tp > 1:
        done.tp_layers = _tp().apply_tp(module, plan.placements, topo.mesh["tp"])
    dtype = train_dtype(plan)
    if sharded(plan):
        done.fsdp_units = apply_fsdp(module, blocks, plan.zero_stage, fsdp_mesh(plan, topo), dtype,
                                     stage_root=stage is not None, pure=pure)
        done.reshard_after_forward = plan.zero_stage == 3
        done.offload_states = [f for f, b in blocks.items() if b.offload_states]
    elif not pure:
        autocast_forward(module, dtype, topo.device)
    done.precision = describe(dtype, done.fsdp_units > 0, pure)
    done.local_params = sum(local(p).numel() for p in module.parameters())
    return done


def island_count(plan: Plan) -> int:
    """Islands whose replicas FSDP shards among themselves alone: those of a sync mode that trains islands apart
    between outer steps (planner.plan.sync, `shards_in_islands`: DiLoCo, streaming DiLoCo) in a ZeRO 2/3 plan; 1
    otherwise (FSDP over every replica)."""
    entry = SYNC_MODES.get(plan.sync.mode)
    if entry is None or not entry.shards_in_islands or not sharded(plan):
        return 1
    return int(plan.sync.option("islands") or plan.mesh.dp)


def fsdp_mesh(plan: Plan, topo: Topology):
    """The mesh FSDP shards over: the data-parallel (x cp) replicas, or, with islands apart (`island_count`), this
    island's replicas: a (island, shard) mesh over the data-parallel ranks (the runtime runs those modes on data
    parallelism alone), consecutive ranks an island, as runtime.loop.sync.diloco.DiLoCo groups them."""
    islands = island_count(plan)
    if islands <= 1:
        return context_parallel.replica_mesh(topo)
    if plan.mesh.dp % islands:
        raise PartitaError(f"sync.options.islands = {islands} does not divide the plan's {plan.mesh.dp} data-parallel "
                           "replicas into equal islands")
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(topo.device.type, (islands, plan.mesh.dp // islands), mesh_dim_names=("island", "shard"))
    return mesh["shard"]


class LocalExecutor:
    """pp == 1: one module per rank (tensor- and/or data-parallel), optional gradient accumulation."""

    def __init__(self, model: nn.Module, plan: Plan, topo: Topology, loss: LossFn):
        self.topo, self.n_micro, self.loss = topo, plan.schedule.num_microbatches, loss
        self.cp = context_parallel.install(model, topo)  # None unless cp > 1
        replicas = context_parallel.replica_mesh(topo)  # dp, or dp x cp: the gradient-averaging ranks
        self.replicas, self.n_replicas = replicas.get_group(), replicas.size()
        self.applied = parallelize(model, plan, topo)
        self.fsdp = self.applied.fsdp_units > 0
        self.modules = [model]
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.norm_params = self.params
        """The parameters a norm over all ranks counts here (runtime.loop.clip)."""
        self.ddp = None
        if self.n_replicas > 1 and topo.tp == 1 and not self.fsdp:
            # gradients as views of DDP's buckets: one copy of the gradients, not two (the buckets live
            # for the whole run; planner.search.memory_phases counts them from the first step on)
            self.ddp = DDP(model, process_group=self.replicas, gradient_as_bucket_view=True,
                           device_ids=[topo.device.index] if topo.device.type == "cuda" else None)
        self.module = self.ddp if self.ddp is not None else model
        self.holds_loss = topo.tp_rank == 0
        self.loss_parallel = topo.tp > 1 and _tp().vocab_head(plan.placements, model)
        self.average_within(self.replicas, self.n_replicas)

    def average_within(self, group, size: int) -> None:
        """The ranks whose gradients `step` averages where neither DDP nor FSDP does (tensor-parallel replicas): all
        replicas, or, for a sync mode that trains islands apart, this rank's island (None, 1: nobody else)."""
        self.grad_group, self.grad_ranks = group, size

    def step(self, batch: tuple) -> torch.Tensor:
        """Forward and backward of this rank's batch; returns its mean loss (detached)."""
        total = torch.zeros((), device=self.topo.device)
        if self.cp is not None:
            batch = self.cp.shard(batch)
        for i, mb in enumerate(split_batch(batch, self.n_micro)):
            last = i == self.n_micro - 1
            sync = self.ddp is not None and last
            ctx = self.ddp.no_sync() if self.ddp is not None and not sync else contextlib.nullcontext()
            with ctx, loss_context(self.loss_parallel):
                loss = plain(self.loss(self.module, mb)) / self.n_micro
                loss.backward()
            total += loss.detach()
        settle_grads(self.params)
        if self.grad_ranks > 1 and self.ddp is None and not self.fsdp:
            average_grads(self.params, self.grad_group, self.grad_ranks)
        expert_parallel.sync_expert_grads(self.params)
        return total

    def evaluate(self, batch: tuple) -> torch.Tensor:
        """The forward of this rank's batch only (the caller holds no_grad and eval mode): its mean loss."""
        total = torch.zeros((), device=self.topo.device)
        if self.cp is not None:
            batch = self.cp.shard(batch)
        for mb in split_batch(batch, self.n_micro):
            with loss_context(self.loss_parallel):
                total += plain(self.loss(self.module, mb)).detach() / self.n_micro
        return total


def settle_ddp_buckets(executor, data, topo: Topology, k: int) -> None:
    """DDP lays its gradient buckets out twice: at construction in reverse parameter order, and again before
    its second forward in the order the first backward made the gradients ready (Reducer::rebuild_buckets).
    Where an element sits in a bucket decides which rank's ring chunk sums it, and with more than 2 ranks the
    order of a floating-point sum changes its last bit. A run resumed at step k would take step k + 1 with the
    first layout where the uninterrupted run had the second: 4-rank DDP drifted by up to 9.5e-7 after a resume.
    So a resumed run first runs one forward and backward of step k + 1's batch, which only lays the buckets
    out, and undoes what it touched (gradients, buffers such as BatchNorm's statistics, the generators dropout
    draws from): its steps then run on the layout the uninterrupted run's steps 2, 3, ... ran on."""
    if getattr(executor, "ddp", None) is None:
        return
    with torch.no_grad():
        buffers = [(b, b.detach().clone()) for m in executor.modules for b in m.buffers()]
    rng = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state(topo.device) if topo.device.type == "cuda" else None
    executor.step(tuple(t.to(topo.device) for t in data.shard(k, topo.dp_rank, topo.dp)))
    for p in executor.params:
        p.grad = None
    with torch.no_grad():
        for b, saved in buffers:
            b.copy_(saved)
    torch.set_rng_state(rng)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, topo.device)


class PipelineExecutor:
    """pp > 1: this rank runs its pipeline stage(s) -- one, or virtual_stages of them for interleaved
    1F1B -- under the plan's schedule. The last stage computes the loss from the logits (runtime.parallel.pp)."""

    def __init__(self, model: nn.Module, plan: Plan, topo: Topology, seq_len: int):
        self.topo = topo
        self.replicas, self.n_replicas = topo.group("dp"), topo.dp  # the ranks that average gradients
        example = torch.zeros(plan.schedule.micro_batch_size, seq_len, dtype=torch.long, device=topo.device)
        from partita.runtime.parallel import pp as pipeline_parallel  # torch's pipelining: pipelined plans only
        pipe = pipeline_parallel.split(model, plan, example)
        self.stage_indices = pipeline_parallel.local_stages(plan, topo.pp_rank)
        self.modules = [pipe.get_stage_module(i) for i in self.stage_indices]
        self.applied = Applied.merge([parallelize(m, plan, topo, stage=i)
                                      for m, i in zip(self.modules, self.stage_indices)])
        self.fsdp = self.applied.fsdp_units > 0
        self.stages, self.schedule = pipeline_parallel.build_schedule(
            pipe, plan, self.stage_indices, topo.device, topo.group("pp"), lm_loss)
        self.params = [p for m in self.modules for p in m.parameters() if p.requires_grad]
        tied = getattr(self.schedule, "tied", None)
        left_out = {id(p) for p in tied.uncounted} if tied is not None else set()
        self.norm_params = [p for p in self.params if id(p) not in left_out]
        """The parameters a norm over all ranks counts here (runtime.loop.clip): each tied one once."""
        self.first, self.last = 0 in self.stage_indices, len(plan.stages) - 1 in self.stage_indices
        self.holds_loss = self.last and topo.tp_rank == 0
        self.loss_parallel = topo.tp > 1 and any(_tp().vocab_head(plan.placements, m) for m in self.modules)
        self.average_within(self.replicas, self.n_replicas)

    def average_within(self, group, size: int) -> None:
        """The ranks of this stage whose gradients `step` averages (where FSDP does not): all replicas, or, for a
        sync mode that trains islands apart, this rank's island (None, 1: nobody else)."""
        self.grad_group, self.grad_ranks = group, size

    def step(self, batch: tuple) -> torch.Tensor:
        """Run the schedule on this rank's batch; returns its mean loss on the last stage, else 0."""
        inputs, targets = batch
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.first else ()
        kwargs = {"target": targets, "losses": losses, "return_outputs": False} if self.last else {}
        with loss_context(self.loss_parallel):
            self.schedule.step(*args, **kwargs)
        settle_grads(self.params)
        if self.grad_ranks > 1 and not self.fsdp:
            average_grads(self.params, self.grad_group, self.grad_ranks)
        if not losses:
            return torch.zeros((), device=self.topo.device)
        return torch.stack([x.detach() for x in losses]).mean()

    def evaluate(self, batch: tuple) -> torch.Tensor:
        """The schedule forward only (torch's `eval`: no backward actions) on this rank's batch; its mean loss on
        the last stage, else 0 (the caller holds no_grad and eval mode)."""
        inputs, targets = batch
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.first else ()
        kwargs = {"target": targets, "losses": losses} if self.last else {}
        with loss_context(self.loss_parallel):
            self.schedule.eval(*args, **kwargs)
        if not losses:
            return torch.zeros((), device=self.topo.device)
        return torch.stack([x.detach() for x in losses]).mean()


Executor = LocalExecutor | PipelineExecutor


def make_plan_optimizer(executor: Executor, plan: Plan, lr: float, name: str,
                        weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """The optimizer over this rank's parameters: under ZeRO-1 its state sharded over the ranks that
    average the gradients (runtime.parallel.zero1), else whole (FSDP's parameters are already shards);
    `weight_decay` of the matrices (runtime.loop.recipe.param_groups)."""
    if plan.zero_stage == 1 and executor.n_replicas > 1:
        return make_zero1(executor.params, lr, name, executor.replicas, weight_decay)
    return make_optimizer(executor.params, lr, name, weight_decay)


def make_executor(model: nn.Module, plan: Plan, topo: Topology, spec: ModelSpec) -> Executor:
    """The executor for this rank; a pipeline is traced with one example microbatch of spec.seq_len tokens."""
    if len(plan.stages) > 1:
        return PipelineExecutor(model, plan, topo, spec.seq_len)
    return LocalExecutor(model, plan, topo, loss_for(spec))

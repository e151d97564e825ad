"""Expert parallelism (plan.mesh.ep): each mixture-of-experts layer's experts sharded over ep data-parallel ranks.

ep divides dp and adds no ranks: dp ranks 0..ep-1 form expert-parallel group 0, ep..2ep-1 group 1, and so on
(`Mesh.ep_coords`). Expert e of E lives on the rank of ep index e // (E / ep) of each group; E must be
divisible by ep.

Which modules. An *experts module* holds all experts of one layer as 3-D parameters whose leading dimension
is the expert, and is called as HuggingFace's MixtralExperts is:

    experts(hidden_states [T, h], top_k_index [T, k], top_k_weights [T, k]) -> [T, h]

with `num_experts` and a `down_proj` [E, ...] parameter: transformers' Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE,
DeepSeek-V3 experts (any of their `_experts_implementation`s) and partita's own preset (costmodel.models.gpt
MoEExperts). Routers, shared experts and everything else stay dense.

What `shard_experts` does to each: every parameter keeps only this rank's E / ep experts (a plain tensor,
marked with an `ExpertGroups` record under `EP_ATTR`), `num_experts` becomes E / ep, and forward becomes
`_ep_forward`, which keeps the routing the model computed and:

1. sorts the token x k routed rows by expert, so the rows for each ep rank are contiguous;
2. exchanges the per-expert row counts (one all_to_all of E integers), then dispatches the rows to the ranks
   owning their experts (all_to_all_single with those split sizes);
3. runs the module's own forward on the rows it received, over its local experts (each row with its local
   expert id, k = 1, weight 1: exactly the per-expert computation of the unsharded layer);
4. sends the results back (the reverse all_to_all) and restores the row order; the caller's routing weights
   multiply them and the k rows of each token are summed, as the unsharded layer does.

Both all_to_alls are autograd-aware (`_AllToAll`: the backward is the reverse all_to_all), so a token's
gradient comes back to the rank that routed it and an expert's weight gradient gathers every token routed to
it in the group.

Gradients (`sync_expert_grads`). Rank r's loss is the mean over its own tokens, L_r, and the global loss is
L = (1/dp) sum_r L_r. After the backward, a rank's expert gradient already sums dL_s/dW over the ep ranks s
of its group (their tokens came to it); the other dp/ep groups hold the same experts at the same ep index.
So dL/dW = (1/dp) x (the sum of that gradient over the replica group: same ep index across the ep groups) --
divided by dp, not by the replica group's size (an average there would be ep times too large). Dense
parameters are averaged over dp as without ep:

- zero_stage 0: DDP, told to ignore the expert shards; `sync_expert_grads` after the backward.
- zero_stage 2/3: each experts module is its own FSDP2 unit over the replica ranks (`apply`), created before
  the dp units, which then skip its parameters; its reduce-scatter sums over the replicas and divides by dp
  (`set_gradient_divide_factor`). As torchtitan shards MoE experts.

Supported: ep with data parallelism, zero_stage 0, 2 or 3, fp32 and bf16, gradient accumulation, recompute.
Refused in pre-flight (`check_plan`, one line): ep with tp, pp or cp > 1 (a pipeline stage is an exported
graph, in which the experts module's forward no longer exists as a call), on a model without experts modules,
or with E not divisible by ep; checkpoints of ep runs (`check_run`).

--verify (runtime.verify.checks) gathers the shards (`full_tensor`) to compare them with the reference and counts
each expert once in the checksum (`checksum_coords`). A router load-balancing loss (transformers'
output_router_logits) is computed over each rank's own tokens, with or without ep, so it is not the one-process
loss: `check_run` notes it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from partita.runtime.loop.recipe import is_dtensor
from partita.costmodel import PartitaError
from partita.planner.plan.executable import composition_refusal
from partita.planner.plan import Mesh, Plan, PlanError

EP_ATTR = "_partita_ep"
"""Attribute of an expert parameter shard: its `ExpertGroups`."""


@dataclass(eq=False)
class ExpertGroups:
    """This rank's expert-parallel groups."""

    ep: int
    index: int
    """This rank's place in its ep group: it holds experts index * E/ep .. (index + 1) * E/ep - 1."""
    block: int
    """Which ep group (dp_rank // ep)."""
    dp: int
    group: object
    """The ep ranks of this rank's group (same pp, cp, tp; same dp // ep): token dispatch and combine."""
    replicas: object
    """The ranks holding the same experts (same pp, cp, tp, same ep index): expert gradients summed here."""
    n_replicas: int
    replica_mesh: object = None
    """`replicas` as a 1-D DeviceMesh named "dp" (a sub-axis of dp): the FSDP mesh of the experts units."""


def is_experts(m: nn.Module) -> bool:
    """An experts module (module docstring): int `num_experts`, a 3-D `down_proj` of E experts, and every
    direct parameter with E rows; no parameters in child modules."""
    e, down = getattr(m, "num_experts", None), m._parameters.get("down_proj")
    if not isinstance(e, int) or isinstance(e, bool) or e < 1 or down is None or down.dim() != 3:
        return False
    return (all(p.dim() >= 1 and p.shape[0] == e for p in m._parameters.values() if p is not None)
            and not any(True for c in m.children() for _ in c.parameters()))


def experts_modules(model: nn.Module) -> dict[str, nn.Module]:
    return {fqn: m for fqn, m in model.named_modules() if is_experts(m)}


def check_plan(plan: Plan, spec, model: nn.Module) -> None:
    """Pre-flight (runtime.launcher.checks): PlanError, one line, for an ep plan this runtime does not run."""
    m = plan.mesh
    if m.ep <= 1:
        return
    why = composition_refusal(m.pp, m.tp, m.cp, m.ep)
    if why:
        raise PlanError(why)
    found = experts_modules(model)
    if not found:
        raise PlanError(f"mesh.ep={m.ep} but --model {spec.name} has no mixture-of-experts layers (experts "
                        "modules with num_experts and [E, ...] expert weights, as MixtralExperts)")
    for fqn, mod in found.items():
        if mod.num_experts % m.ep:
            raise PlanError(f"mesh.ep={m.ep} does not divide the {mod.num_experts} experts of {fqn!r}")


def check_run(plan: Plan, spec, checkpoint_dir: str | None, verify: bool) -> list[str]:
    """runtime.loop.session.prepare: PartitaError for run options an ep plan does not support yet (checkpoints: an
    expert shard -- a plain tensor, or with ZeRO a DTensor over the replica ranks only -- says nothing of the ep
    split, so DCP would save one rank's experts under the whole tensor's name); notes worth printing."""
    if plan.mesh.ep > 1 and checkpoint_dir:
        raise PartitaError(f"checkpoints of expert-parallel runs (mesh.ep={plan.mesh.ep}) are not supported yet: "
                           "drop --checkpoint-dir, or use an ep=1 plan")
    if not verify or plan.mesh.dp * plan.mesh.cp == 1:
        return []
    from partita.costmodel.models.meta import meta_build
    coef = max((float(getattr(m.config, "router_aux_loss_coef", 0) or 0) for m in meta_build(spec.build).modules()
                if getattr(getattr(m, "config", None), "output_router_logits", False)), default=0.0)
    if not coef:
        return []
    return [f"note: the model adds a router load-balancing loss (output_router_logits, coefficient {coef:g}) computed "
            "over each rank's own tokens, not over the global batch as one process computes it: --verify can fail "
            "on a correct data- or expert-parallel plan; verify with output_router_logits=false"]


_GROUPS: dict = {}


def expert_groups(m: Mesh, rank: int, device_type: str = "cpu") -> ExpertGroups:
    """This rank's ep and replica groups, from a DeviceMesh (pp, dp / ep, ep, cp, tp) over all ranks -- the plan's
    rank layout with dp split into (ep group, ep index) -- built once per default process group and mesh."""
    world = dist.distributed_c10d._get_default_group()
    key = (m.pp, m.dp, m.cp, m.tp, m.ep, device_type)
    cached = _GROUPS.get(key)
    if cached is not None and cached[0] is world:
        return cached[1]
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(device_type, (m.pp, m.dp // m.ep, m.ep, m.cp, m.tp),
                            mesh_dim_names=("pp", "dp", "ep", "cp", "tp"))
    block, index = m.ep_coords(rank)
    assert (mesh.get_local_rank("dp"), mesh.get_local_rank("ep")) == (block, index), "ep layout != plan layout"
    out = ExpertGroups(ep=m.ep, index=index, block=block, dp=m.dp, group=mesh.get_group("ep"),
                       replicas=mesh.get_group("dp"), n_replicas=m.dp // m.ep, replica_mesh=mesh["dp"])
    _GROUPS[key] = (world, out)
    return out


def apply(module: nn.Module, plan: Plan, topo) -> int:
    """runtime.parallel.apply.parallelize's step for ep (before FSDP): shard the experts (`shard_experts`); in a ZeRO 2/3
    plan each experts module is then its own FSDP2 unit over the replica ranks, whose reduce-scatter sums the
    expert gradients over them and divides by dp (module docstring), and which the dp units around it skip."""
    from partita.runtime.parallel.fsdp import sharded
    from partita.runtime.parallel.precision import fsdp_policy, is_pure, train_dtype
    n = shard_experts(module, plan.mesh, topo.rank, topo.device.type)
    if not n or not sharded(plan):
        return n
    from torch.distributed.fsdp import fully_shard
    g = expert_groups(plan.mesh, topo.rank, topo.device.type)
    for mod in experts_modules(module).values():
        fully_shard(mod, mesh=g.replica_mesh, reshard_after_forward=plan.zero_stage == 3,
                    mp_policy=fsdp_policy(train_dtype(plan), pure=is_pure(plan)))
        mod.set_gradient_divide_factor(float(g.dp))
        for p in mod.parameters():
            setattr(p, EP_ATTR, g)  # FSDP's sharded parameters are new tensors
    return n


def shard_experts(model: nn.Module, mesh: Mesh, rank: int, device_type: str = "cpu") -> int:
    """Shard every experts module of `model` over its ep group of the plan's `mesh` (module docstring) and tell
    DDP to leave the shards alone; returns the number of experts modules."""
    g = expert_groups(mesh, rank, device_type)
    found = experts_modules(model)
    ignored = []
    for fqn, mod in found.items():
        n = mod.num_experts // g.ep
        lo = g.index * n
        for name, p in list(mod._parameters.items()):
            shard = nn.Parameter(p.detach()[lo:lo + n].clone(), requires_grad=p.requires_grad)
            setattr(shard, EP_ATTR, g)
            setattr(mod, name, shard)
            ignored.append(f"{fqn}.{name}" if fqn else name)
        mod.num_experts = n
        mod.forward = functools.partial(_ep_forward, mod, mod.forward, g)
    if ignored:
        from torch.nn.parallel import DistributedDataParallel
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            model, [*getattr(model, "_ddp_params_and_buffers_to_ignore", []), *ignored])
    return len(found)


class _AllToAll(torch.autograd.Function):
    """all_to_all_single of rows with split sizes; its backward sends the gradients back the same way."""

    @staticmethod
    def forward(ctx, x, out_splits: list[int], in_splits: list[int], group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        return _all_to_all(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        return _all_to_all(grad, in_splits, out_splits, ctx.group), None, None, None


def _all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


def _ep_forward(mod: nn.Module, local_forward, g: ExpertGroups, hidden_states: torch.Tensor,
                top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts module's forward under expert parallelism (module docstring, steps 1-4)."""
    tokens, k = top_k_index.shape
    n_local = mod.num_experts
    ids, perm = torch.sort(top_k_index.reshape(-1), stable=True)
    rows = hidden_states[perm // k]
    per_expert = torch.bincount(ids, minlength=n_local * g.ep)
    recv_per_expert = torch.empty_like(per_expert)
    dist.all_to_all_single(recv_per_expert, per_expert, group=g.group)  # E / ep counts to each rank
    send = per_expert.view(g.ep, n_local).sum(1).tolist()
    recv = recv_per_expert.view(g.ep, n_local).sum(1).tolist()
    received = _AllToAll.apply(rows, recv, send, g.group)
    local_ids = torch.repeat_interleave(torch.arange(n_local, device=ids.device).repeat(g.ep), recv_per_expert)
    out = local_forward(received, local_ids.unsqueeze(1), received.new_ones(received.size(0), 1))
    if received.requires_grad and not out.requires_grad:
        out = out + received.sum() * 0  # no rows here: the backward must still run both all_to_alls
    back = _AllToAll.apply(out, send, recv, g.group)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel(), device=perm.device)
    back = back[inverse].view(tokens, k, -1)
    return (back * top_k_weights.unsqueeze(-1).to(back.dtype)).sum(dim=1).to(hidden_states.dtype)


@torch.no_grad()
def sync_expert_grads(params: list[torch.Tensor]) -> None:
    """Expert gradients as single-process training on the global batch: summed over the replica group, / dp
    (module docstring). A no-op without expert shards."""
    shards = [p for p in params if hasattr(p, EP_ATTR) and not is_dtensor(p)]  # DTensor: FSDP's
    if not shards:
        return
    g = getattr(shards[0], EP_ATTR)
    for p in shards:
        if p.grad is None:  # no token reached these experts on this rank; the replicas may have some
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in shards]
    flat = _flatten_dense_tensors(grads)
    if g.n_replicas > 1:
        dist.all_reduce(flat, group=g.replicas)
    flat.div_(g.dp)
    for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        grad.copy_(synced)


def full_tensor(p: torch.Tensor) -> torch.Tensor:
    """The whole of parameter `p` (collective): a DTensor's full tensor, an expert shard gathered over its ep
    group into all experts, any other tensor as it is."""
    t = p.full_tensor() if is_dtensor(p) else p
    g = getattr(p, EP_ATTR, None)
    if g is None:
        return t
    parts = [torch.empty_like(t) for _ in range(g.ep)]
    dist.all_gather(parts, t.detach().contiguous(), group=g.group)
    return torch.cat(parts)


def checksum_coords(p: torch.Tensor, coords: dict[str, int]) -> dict[str, int]:
    """runtime.verify.checks's checksum coordinates for `p`: an expert shard is sharded within its ep group and
    replicated across the groups, so it counts on group 0 (its "dp" coordinate is its group's number)."""
    g = getattr(p, EP_ATTR, None)
    return coords if g is None else {**coords, "dp": g.block}

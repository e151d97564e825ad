"""--save-final: the trained weights as one plain state dict, the way one process would have them.

`torch.save` of {name: tensor} with the model's own parameter and buffer names -- no FSDP, DTensor or pipeline
wrappers -- on rank 0, so that the model built by the same MODEL string loads it in one process with
`model.load_state_dict(torch.load(PATH))`. Each stage's pieces come from torch's
`torch.distributed.checkpoint.state_dict.get_model_state_dict(full_state_dict=True)`, which gathers DTensor
shards (FSDP2, tensor parallelism) into whole tensors; expert shards (runtime.parallel.ep) are gathered over
their ep group. Without pipeline parallelism rank 0 holds every parameter, and `cpu_offload=True` keeps the
whole tensors on rank 0 alone; with it, each stage's first data/tensor-parallel rank sends its stage's dict to
rank 0 (`gather_object`). The file is written beside its name and renamed into place, so a run killed while
saving leaves no half-written file under PATH.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from partita.runtime.parallel.ep import EP_ATTR, full_tensor


def _stage_state(module: torch.nn.Module, offload: bool) -> dict[str, torch.Tensor]:
    """Collective over the module's meshes: its whole tensors (on rank 0 only when `offload`)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=offload))
    for name, p in module.named_parameters():
        if getattr(p, EP_ATTR, None) is not None:  # a plain tensor holding this rank's experts only
            whole = full_tensor(p)
            if name in state:
                state[name] = whole.detach().cpu()
    return state


def consolidated_state(executor, topo) -> dict[str, torch.Tensor] | None:
    """Collective over all ranks: the whole model's state dict on rank 0 (CPU tensors), None elsewhere."""
    pipelined = topo.pp > 1
    state: dict[str, torch.Tensor] = {}
    for module in executor.modules:
        state.update(_stage_state(module, offload=not pipelined))
    state = {k: v.detach().cpu() for k, v in state.items()}
    if pipelined:
        leader = topo.dp_rank == 0 and topo.tp_rank == 0 and topo.cp_rank == 0
        parts = [None] * dist.get_world_size() if topo.rank == 0 else None
        dist.gather_object(state if leader else {}, parts, dst=0)
        if topo.rank == 0:
            state = {k: v for part in parts for k, v in part.items()}
    return state if topo.rank == 0 else None


def save_final(path: str, executor, topo) -> tuple[int, int] | None:
    """Collective: rank 0 writes the consolidated state dict to `path`; returns (tensors, bytes) on rank 0."""
    state = consolidated_state(executor, topo)
    if state is None:
        return None
    tmp = f"{path}.partita-tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)
    return len(state), sum(t.numel() * t.element_size() for t in state.values())

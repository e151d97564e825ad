"""Host-memory offload of a block's activations (`offload_activations`) and model states (`offload_states`).

Activations, by the block's recompute mode:
- "none": the forward runs under `torch.autograd.graph.save_on_cpu`: every tensor autograd saves for the
  backward is copied to host memory (pinned when CUDA is available) and back when the backward uses it.
- "selective" and "op": inside a checkpoint autograd saves only placeholders, and the outputs the policy
  keeps (linear layers, norms, attention; "op": every other matmul and attention) live in the checkpoint
  policy's cache, out of save_on_cpu's reach. So the policy reports each kept
  output (runtime.parallel.recompute) and `HostStash` moves their storage to host memory once the block's forward
  has returned, and back when the block's recompute starts. Outputs the block returns stay where they are
  (the next block still reads them).
- "full" is refused (planner.plan.executable.offload_refusal, in the pre-flight checks): the checkpoint keeps
  only the block's input, which is the previous block's output and still in use, so there is nothing to
  offload (the planner never emits it).
States: the block's FSDP2 unit gets `CPUOffloadPolicy` (runtime.parallel.fsdp): its sharded parameters, gradients
and optimizer state live in host memory and the optimizer step runs there.
"""
from __future__ import annotations

from functools import partial

import torch

from partita.planner.plan.executable import offload_refusal
from partita.planner.plan import PlanError
from partita.runtime.loop.memory import local
from partita.runtime.parallel.recompute import POLICIES, run_checkpointed, selective_contexts, tensors
from partita.runtime.parallel.wrap import Around, within


def pin() -> bool:
    """Pinned host buffers speed up device copies, but need an accelerator (TORCH-NOTES)."""
    return torch.cuda.is_available()


def state_policy(offload_states: bool):
    """FSDP2's offload policy for a unit (torch.distributed.fsdp, imported here: only sharded plans need it)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy
    return CPUOffloadPolicy(pin_memory=pin()) if offload_states else OffloadPolicy()


def _local_tensors(tree) -> list[torch.Tensor]:
    return [local(t) for t in tensors(tree)]


class HostStash:
    """Storages moved to host memory between a block's forward and its recompute."""

    def __init__(self):
        self.kept: list[torch.Tensor] = []
        self.stashed: list[tuple[torch.UntypedStorage, torch.UntypedStorage]] = []

    def keep(self, out) -> None:
        self.kept.extend(_local_tensors(out))

    def offload(self, outputs) -> None:
        """Copy each kept storage to host and free it on its device, unless the block returns it."""
        busy = {t.untyped_storage().data_ptr() for t in _local_tensors(outputs)}
        for t in self.kept:
            dev = t.untyped_storage()
            if dev.data_ptr() in busy or dev.nbytes() == 0:
                continue
            busy.add(dev.data_ptr())  # views of one storage move once
            host = torch.empty(dev.nbytes(), dtype=torch.uint8, device="cpu", pin_memory=pin()).untyped_storage()
            host.copy_(dev)
            dev.resize_(0)
            self.stashed.append((dev, host))
        self.kept = []

    def restore(self) -> None:
        for dev, host in self.stashed:
            dev.resize_(host.nbytes())
            dev.copy_(host)
        self.stashed = []


def _selective_on_host(inner, args, kwargs, policy=None):
    stash = HostStash()
    out = run_checkpointed(inner, args, kwargs,
                           context_fn=partial(selective_contexts, stash.keep, stash.restore, policy=policy))
    stash.offload(out)
    return out


def offload_activations(recompute: str) -> Around:
    """The forward wrapper (runtime.parallel.wrap) offloading a block's activations under its recompute mode."""
    if recompute == "none":
        return within(lambda: torch.autograd.graph.save_on_cpu(pin_memory=pin()))
    if recompute in POLICIES:
        if why := offload_refusal(recompute, True, "eager"):
            raise PlanError(why)
        return partial(_selective_on_host, policy=POLICIES[recompute])
    raise ValueError(f"activation offload with recompute {recompute!r} is not executed")

"""One rank's step primitives shared by a run's steps (runtime.loop.session) and --verify's pass
(runtime.verify.run): the model built as on every rank, the loss reduced over the ranks, and the extra step
measured under the allocator trace (`measure_step`), whose effects a `Snapshot` undoes."""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from partita.runtime.launcher.mesh import Topology
from partita.runtime.loop import memory
from partita.runtime.loop.recipe import build_model
from partita.runtime.parallel import batchnorm
from partita.runtime.parallel.cp import replica_mesh

if TYPE_CHECKING:
    from partita.costmodel.models import ModelSpec
    from partita.runtime.loop.options import RunOptions


def build(spec: ModelSpec, opts: RunOptions, topo: Topology):
    """The model on this rank's device, initialised as on every rank, its BatchNorm synchronised on request."""
    model = build_model(spec, seed=opts.seed).to(topo.device)
    if opts.sync_batchnorm:
        batchnorm.synchronise(model, replica_mesh(topo).get_group())
    return model


def reduce_loss(executor, loss: torch.Tensor, topo: Topology) -> float:
    """The step's global mean loss on every rank: one holder per (dp, cp) rank -- each cp rank's loss is the
    mean over its equal share of the tokens (runtime.parallel.cp) --, the sum over them / (dp x cp)."""
    held = loss if executor.holds_loss else torch.zeros_like(loss)
    dist.all_reduce(held)
    return held.item() / (topo.dp * topo.cp)


def pp_group(topo: Topology):
    """The pipeline's group, over which the stages' gradient norms add up (runtime.loop.clip); None when pp = 1."""
    return topo.group("pp") if topo.pp > 1 else None


def allreduce(values: list[float], op, device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return t.tolist()


class Snapshot:
    """Parameters, buffers, gradients, optimizer state and the RNG state of this rank, put back by `restore`."""

    def __init__(self, executor, opt: torch.optim.Optimizer):
        with torch.no_grad():
            tensors = [*executor.params, *(b for m in executor.modules for b in m.buffers())]
            self.tensors = [(t, memory.local(t).detach().clone()) for t in tensors]
            self.grads = [(p, p.grad) for p in executor.params]
            self.state = {p: {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in st.items()}
                          for p, st in opt.state.items()}
        self.opt, self.rng = opt, torch.get_rng_state()

    def restore(self) -> None:
        with torch.no_grad():
            for t, saved in self.tensors:
                memory.local(t).copy_(saved)
        for p, g in self.grads:
            p.grad = g
        for p in list(self.opt.state):
            if p in self.state:
                self.opt.state[p] = self.state[p]
            else:
                del self.opt.state[p]
        torch.set_rng_state(self.rng)


def ddp_bucket_bytes(executor) -> int:
    """Bytes of DDP's gradient buckets (allocated when DDP is built, so before any traced step)."""
    ddp = getattr(executor, "ddp", None)
    if ddp is None:
        return 0
    try:
        info = ddp._get_ddp_logging_data()
    except (AttributeError, RuntimeError):  # a private API: without it the buckets go uncounted
        return 0
    sizes = str(info.get("rebuilt_bucket_sizes") or info.get("bucket_sizes") or "")
    return sum(int(b) for b in sizes.replace(",", " ").split())


def measure_step(executor, opt: torch.optim.Optimizer, data, topo: Topology, k: int,
                  warm: bool) -> memory.StepMemory:
    """One more training step (forward, backward, loss reduce, optimizer) on the batch of step k + 1, after
    the run, under the allocator trace (runtime.loop.memory.trace_training_step); every rank takes it. The
    parameters, buffers, gradients, optimizer state and RNG state are put back afterwards, so the run's
    results are those of its reported steps, and the timed steps never run under the profiler. `warm`:
    fewer than two steps ran, so one untraced step goes first (DDP rebuilds its buckets in its second
    step; pipeline stages allocate their buffers in the first)."""
    snapshot = Snapshot(executor, opt)

    def one(trace=None):
        phase = trace.phase if trace is not None else (lambda name: contextlib.nullcontext())
        with phase("data"):
            batch = tuple(t.to(topo.device) for t in data.shard(k, topo.dp_rank, topo.dp))
        with phase("step"):
            loss = executor.step(batch)
        with phase("loss"):
            held = loss if executor.holds_loss else torch.zeros_like(loss)
            dist.all_reduce(held)
        with phase("optimizer"):
            opt.step()

    try:
        if warm:
            opt.zero_grad(set_to_none=True)
            one()
        return memory.trace_training_step(one, executor.params, opt, executor.modules, ddp_bucket_bytes(executor))
    finally:
        snapshot.restore()

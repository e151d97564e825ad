"""DiLoCo and streaming DiLoCo, the sync modes with an outer step (planner.plan.sync; their prices:
planner.estimate.sync): hooks of the trainer loop, registered in runtime.loop.sync.HOOKS."""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from partita.costmodel import PartitaError
from partita.planner.plan.sync import DILOCO, LOCALSGD, STREAMING, Sync
from partita.runtime.loop.sync.four_bit import FourBitMean
from partita.runtime.loop.memory import local
from partita.runtime.loop.sync.hook import SyncHook


OUTER_BUCKET = 1 << 26
"""Elements per outer all-reduce of DiLoCo and streaming DiLoCo (256 MiB in fp32): one collective per bucket."""


class DiLoCo(SyncHook):
    """DiLoCo (Douillard et al. 2023, arXiv:2311.08105, Algorithm 1) over the data-parallel replicas, split into
    `islands` blocks of consecutive replicas (option `islands`; default: each replica its own island):

    - inner steps: the plan's optimizer on gradients averaged inside the island only (DDP's `no_sync` keeps them
      local; an island of several replicas averages them over its own process group before the step);
    - every H = `every` steps, the outer step: delta = anchor - params (fp32), all-reduced to its mean across the
      islands (in `bits` 16 as bf16, 32, or 4: blockwise 4-bit integers, runtime.loop.sync.four_bit), then torch's SGD (Nesterov when momentum > 0) steps the anchor with
      delta as its gradient (lr `outer_lr`, momentum `outer_momentum`), and the parameters become the anchor.

    With H = 1, outer lr 1 and no momentum under an SGD inner optimizer this is synchronous DP: the anchor
    becomes the mean of one local step from the same weights, the step on the mean gradient. Runs on plans of one
    stage: with DDP (zero 0); with tensor or pipeline parallelism inside each replica (zero 0, `_split_groups`); or with FSDP
    (ZeRO 2/3) sharding each island's replicas among themselves (runtime.parallel.apply.fsdp_mesh: the
    reduce-scatter stays in the island). Under FSDP or TP the anchor, its momentum and the outer all-reduce are this
    rank's shard, exchanged with the ranks holding the same shard in the other islands. Checkpoints: after outer
    steps only (`save_refusal`), with each island's inner optimizer state and the outer momentum
    (`checkpoint_state`; under FSDP or TP each shard's under its own keys)."""

    MODE = DILOCO

    def __init__(self, executor, topo, options: dict, optimizer=None):
        super().__init__(executor, topo, options, optimizer)
        sync = self.sync = Sync(mode=self.MODE, options=options)
        self.every, self.bits = sync.option("every"), sync.option("bits")
        n = executor.n_replicas if executor is not None else 1
        self.sharded = bool(executor is not None and executor.fsdp)
        # replicas split by tensor and/or pipeline parallelism at zero 0: the executor averages the gradients itself
        self.split = bool(executor is not None and (topo.tp > 1 or topo.pp > 1) and topo.cp == 1
                           and not self.sharded and hasattr(executor, "average_within"))
        if n > 1 and getattr(executor, "ddp", None) is None and not self.sharded and not self.split:
            raise PartitaError(f"{self.MODE} runs on data-parallel plans with DDP, FSDP, or tensor or pipeline "
                               "parallelism at zero 0 today; this plan is none of these")
        self.islands = sync.option("islands") or n
        if n % self.islands:
            raise PartitaError(f"sync.options.islands = {self.islands} does not divide the plan's {n} data-parallel "
                               "replicas into equal islands")
        self.inner, self.outer = self._groups(n)
        with torch.no_grad():
            self.anchor = [local(p).detach().clone().float() for p in executor.params]
        momentum = sync.option("outer_momentum")
        self.outer_opt = torch.optim.SGD(self.anchor, lr=sync.option("outer_lr"), momentum=momentum,
                                         nesterov=momentum > 0)

    def _groups(self, n: int):
        """(the island's own group or None, the group of this replica's peers in the other islands or None); sets
        `island`, this rank's island's index, and `shard`, its place in the island."""
        self.island = self.shard = 0
        if n <= 1:
            return None, None
        if self.split:
            return self._split_groups(n)
        if self.islands <= 1:  # one island: under FSDP every rank holds its own shard of the anchor
            self.shard = dist.get_process_group_ranks(self.executor.replicas).index(dist.get_rank())
            return None, None
        per, ranks = n // self.islands, dist.get_process_group_ranks(self.executor.replicas)
        mine = ranks.index(dist.get_rank())
        self.island, self.shard = mine // per, mine % per
        if self.islands == n:
            return None, self.executor.replicas
        inner = outer = None
        for i in range(self.islands):  # every rank creates every group, in the same order (new_group's rule)
            g = dist.new_group(ranks[i * per:(i + 1) * per])
            inner = g if mine // per == i else inner
        for j in range(per):
            g = dist.new_group(ranks[j::per])
            outer = g if mine % per == j else outer
        return inner, outer

    def _split_groups(self, n: int):
        """Tensor- and/or pipeline-parallel replicas: a mesh (pp, islands, replicas per island, tp) over the ranks,
        laid out as the plan's (tp fastest, then dp, then pp; an island is consecutive replicas). The island's
        group holds its replicas of this rank's stage and tp shard, and the executor averages the inner gradients
        over it alone; the outer group holds the same stage and shard in the other islands."""
        from torch.distributed.device_mesh import init_device_mesh
        per, topo = n // self.islands, self.topo
        mesh = init_device_mesh(topo.device.type, (topo.pp, self.islands, per, topo.tp),
                                mesh_dim_names=("pp", "island", "replica", "tp"))
        self.island, self.shard = mesh.get_local_rank("island"), topo.tp_rank
        inner = mesh.get_group("replica") if per > 1 else None
        self.executor.average_within(inner, per if inner is not None else 1)
        return inner, (mesh.get_group("island") if self.islands > 1 else None)

    def during_backward(self, step: int):
        ddp = getattr(self.executor, "ddp", None)
        return ddp.no_sync() if ddp is not None and self.outer is not None else contextlib.nullcontext()

    def before_optimizer(self, step: int) -> None:
        if self.inner is None or self.sharded or self.split:  # FSDP reduce-scattered them over the island already,
            return  # and the tensor-parallel executor averaged them over it
        for p in self.executor.params:
            if p.grad is not None:
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG, group=self.inner)

    def after_optimizer(self, step: int) -> None:
        if step % self.every:
            return
        buckets = self._buckets(range(len(self.anchor)))
        wires = [self._wire(b) for b in buckets]
        for work in self._all_reduce(wires):
            work.wait()
        for k, bucket in enumerate(buckets):
            self._set_grads(bucket, wires[k])
            wires[k] = None  # a 16-bit wire goes once its fp32 copy is the gradients
        self.outer_opt.step()
        with torch.no_grad():
            for anchor, p in zip(self.anchor, self.executor.params):
                local(p).copy_(anchor)
                anchor.grad = None

    # The outer all-reduce goes in flat buckets of up to OUTER_BUCKET elements, one collective each: on a link of
    # 20 ms, one all-reduce per tensor would pay the latency hundreds of times per outer step (the price counts one).

    def _buckets(self, indices) -> list[list[int]]:
        """`indices` (into the parameters) in consecutive buckets of at most OUTER_BUCKET elements (a larger
        tensor alone)."""
        out, size = [[]], 0
        for i in indices:
            n = self.anchor[i].numel()
            if out[-1] and size + n > OUTER_BUCKET:
                out.append([])
                size = 0
            out[-1].append(i)
            size += n
        return out if out[0] else []

    def _wire(self, bucket: list[int]) -> torch.Tensor:
        """The bucket's parameter change, anchor - params, flat (bf16 at 16 bits)."""
        with torch.no_grad():
            flat = torch.cat([(self.anchor[i] - local(self.executor.params[i]).detach().float()).reshape(-1)
                              for i in bucket])
        return flat.to(torch.bfloat16) if self.bits == 16 else flat

    def _all_reduce(self, wires: list[torch.Tensor]) -> list:
        """Start each wire's mean across the islands (none on one island): an all-reduce, or at 4 bits the two
        phases of runtime.loop.sync.four_bit, whose second runs when it is waited for."""
        if self.outer is None:
            return []
        if self.bits == 4:
            return [FourBitMean(w, self.outer) for w in wires]
        return [dist.all_reduce(w, op=dist.ReduceOp.AVG, group=self.outer, async_op=True) for w in wires]

    def _set_grads(self, bucket: list[int], wire: torch.Tensor) -> None:
        """The anchors' gradients: the bucket's mean change, cut back into the tensors."""
        mean, at = wire.float(), 0
        for i in bucket:
            n = self.anchor[i].numel()
            self.anchor[i].grad = mean[at:at + n].view_as(self.anchor[i])
            at += n

    # Checkpoints are written right after an outer step, where every replica's parameters equal the anchor (so the
    # model state is the anchor, and one replica's copy is every replica's). What differs between islands is the
    # inner optimizer's state (Adam's moments of each island's own gradients): each island's is kept under its own
    # keys, and the outer momentum (the same on every rank) under the mode's.

    def save_refusal(self, step: int) -> str | None:
        if step % self.every:
            return (f"{self.MODE} writes checkpoints after outer steps only (every H = {self.every} steps), where the "
                    f"replicas agree; step {step} is inside a window")
        return None

    def _inner_keys(self) -> dict[str, torch.Tensor]:
        from partita.runtime.checkpoint import train_state
        if self.optimizer is None:
            return {}
        state = train_state(self.executor.modules, self.optimizer)
        return {f"sync.{self.MODE}.island{self.island}.{k}": v for k, v in state.items() if k.startswith("optim.")}

    def _outer_keys(self, create: bool = False) -> dict[str, torch.Tensor]:
        out = {}
        for i, anchor in enumerate(self.anchor):
            state = self.outer_opt.state[anchor]
            if create and self.outer_opt.defaults["momentum"] > 0 and "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(anchor)
            out.update({f"sync.{self.MODE}.outer.{i}.{k}{self._shard_key}": v for k, v in state.items()
                        if isinstance(v, torch.Tensor)})
        return out

    @property
    def _shard_key(self) -> str:
        """The suffix of a key that holds this rank's shard (FSDP, or a tp rank's: each shard its own plain tensor),
        else ""."""
        if self.sharded:
            return f".shard{self.shard}"
        if not self.split:
            return ""
        topo = self.topo  # one stage: the keys tensor-parallel plans had before pipelines ran in islands
        return (f".pp{topo.pp_rank}" if topo.pp > 1 else "") + (f".tp{topo.tp_rank}" if topo.tp > 1 else "")

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        return {**self._outer_keys(), **self._inner_keys()}

    def load_state(self, path) -> None:
        import torch.distributed.checkpoint as dcp
        from partita.runtime.checkpoint import read_metadata
        saved = read_metadata(path).state_dict_metadata
        want = {**self._outer_keys(create=True), **self._inner_keys()}
        missing = sorted(k for k in want if k not in saved)
        if missing:
            raise PartitaError(f"checkpoint {path} holds no {self.MODE} state ({missing[0]} ...): it was not written "
                               f"by a {self.MODE} run of this plan's islands; resume it with the plan that wrote it")
        dcp.load(want, storage_reader=dcp.FileSystemReader(str(path)))


class LocalSGD(DiLoCo):
    """Local SGD (periodic model averaging): DiLoCo above with its outer step at lr 1 without momentum (the mode's
    fixed defaults, planner.plan.sync), so every H steps each replica's parameters become the replicas' mean; its
    checkpoint keys under its own name."""

    MODE = LOCALSGD


def fragments_of(executor, count: int) -> list[list[int]]:
    """The indices (into `executor.params`) of each of `count` fragments: a parameter of a numbered layer (the first
    number in its name, `layers.7.mlp.w1`) goes to fragment layer mod count -- strided, which Douillard et al. 2025
    found better than consecutive layers -- and the others (embeddings, norms, a head), largest first, each to the
    fragment holding the fewest elements so far. The same on every rank: it reads only names and shapes."""
    names = {id(p): name for m in executor.modules for name, p in m.named_parameters()}
    out, sizes, rest = [[] for _ in range(count)], [0] * count, []
    for i, p in enumerate(executor.params):
        layer = re.search(r"(?:^|\.)(\d+)(?:\.|$)", names.get(id(p), ""))
        if layer is None:
            rest.append(i)
            continue
        f = int(layer.group(1)) % count
        out[f].append(i)
        sizes[f] += p.numel()
    for i in sorted(rest, key=lambda i: -executor.params[i].numel()):
        f = min(range(count), key=sizes.__getitem__)
        out[f].append(i)
        sizes[f] += executor.params[i].numel()
    return [sorted(f) for f in out]


@dataclass
class InFlight:
    """A fragment's outer all-reduce, merged after step `merge_at`."""

    fragment: int
    merge_at: int
    buckets: list[list[int]]
    wires: list[torch.Tensor]
    """Each bucket's parameter change, flat (bf16 at 16 bits): this rank's until `works` complete, then the mean."""
    works: list = field(default_factory=list)


class StreamingDiLoCo(DiLoCo):
    """Streaming DiLoCo (Douillard et al. 2025, arXiv:2501.18512), the asynchronous mode: DiLoCo (above) with the
    parameters in F = `fragments` fragments (`fragments_of`), fragment p taking its outer step at the steps
    p * (H // F) + k H. After such a step this rank's change of that fragment, anchor - params, in flat buckets,
    starts its all-reduce across the islands (async_op) and training goes on; after `delay` more steps (tau; 0:
    at once) it is waited for, torch's SGD (Nesterov with momentum) steps that fragment's anchors with the mean as
    their gradient, and each parameter becomes alpha x itself + (1 - alpha) x its anchor (the merge; alpha 0 takes
    the global weights, as plain DiLoCo does).

    With one fragment, delay 0 and alpha 0 this is DiLoCo exactly, in the same order of operations.

    No window refuses a checkpoint. The replicas of different islands hold different weights whenever alpha > 0 or
    a fragment is between its outer steps, so a checkpoint holds each island's parameters under its own keys, the
    anchors, the outer momentum and, when a fragment is in flight, its received mean and the step it merges at
    (the all-reduce is waited for first: that costs time, never a different number). A resumed run merges it
    where the uninterrupted one would. The checkpoint's model keys hold one island's weights (torch's checkpoint
    keeps one copy of a key every rank saves, from whichever rank it picks): resuming this plan restores each
    island's own from its keys. The weights a run writes out (--save-weights) are rank 0's, island 0's."""

    MODE = STREAMING

    def __init__(self, executor, topo, options: dict, optimizer=None):
        super().__init__(executor, topo, options, optimizer)
        count = self.sync.option("fragments")
        self.delay, self.alpha = self.sync.option("delay"), float(self.sync.option("alpha"))
        self.fragments = fragments_of(executor, count)
        self.offsets = [f * (self.every // count) for f in range(count)]
        self.pending: InFlight | None = None

    def save_refusal(self, step: int) -> str | None:
        return None

    def _sent_after(self, step: int) -> int | None:
        """The fragment whose all-reduce starts after `step`, if any."""
        return next((f for f, off in enumerate(self.offsets) if step >= off and (step - off) % self.every == 0
                     and self.fragments[f]), None)

    def after_optimizer(self, step: int) -> None:
        if self.pending is not None and step == self.pending.merge_at:
            self._merge()
        fragment = self._sent_after(step)
        if fragment is not None:
            self._send(fragment, step)
            if self.delay == 0:
                self._merge()

    def _send(self, fragment: int, step: int) -> None:
        buckets = self._buckets(self.fragments[fragment])
        wires = [self._wire(b) for b in buckets]
        self.pending = InFlight(fragment=fragment, merge_at=step + self.delay, buckets=buckets, wires=wires,
                                works=self._all_reduce(wires))

    def _land(self) -> None:
        """Wait for the all-reduce in flight (its wire then holds the mean)."""
        if self.pending is not None:
            for work in self.pending.works:
                work.wait()
            self.pending.works = []

    def _merge(self) -> None:
        self._land()
        indices = self.fragments[self.pending.fragment]
        for bucket, wire in zip(self.pending.buckets, self.pending.wires):
            self._set_grads(bucket, wire)
        self.outer_opt.step()  # SGD steps only the anchors that have a gradient: this fragment's
        with torch.no_grad():
            for i in indices:
                p, anchor = local(self.executor.params[i]), self.anchor[i]
                if self.alpha == 0:
                    p.copy_(anchor)
                else:
                    p.copy_(p.float().mul_(self.alpha).add_(anchor, alpha=1 - self.alpha))
                anchor.grad = None
        self.pending = None

    def close(self) -> None:
        self._land()

    @property
    def _stage(self) -> str:
        """The suffix of a key of this stage's own (its parameters, its fragment in flight); "" with one stage."""
        return f".pp{self.topo.pp_rank}" if self.topo.pp > 1 else ""

    def _own_keys(self) -> dict[str, torch.Tensor]:
        fragment, merge_at = (self.pending.fragment, self.pending.merge_at) if self.pending else (-1, -1)
        return {**{f"sync.{self.MODE}.anchor.{i}{self._shard_key}": a for i, a in enumerate(self.anchor)},
                **{f"sync.{self.MODE}.island{self.island}.param.{i}{self._stage}": p.detach()
                   for i, p in enumerate(self.executor.params)},
                f"sync.{self.MODE}.pending{self._stage}": torch.tensor([fragment, merge_at], dtype=torch.int64)}

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        self._land()
        out = {**self._outer_keys(create=True), **self._inner_keys(), **self._own_keys()}
        if self.pending is not None:
            out.update({f"sync.{self.MODE}.pending.wire.{j}{self._shard_key}": w
                        for j, w in enumerate(self.pending.wires)})
        return out

    def load_state(self, path) -> None:
        import torch.distributed.checkpoint as dcp
        from partita.runtime.checkpoint import read_metadata
        saved = read_metadata(path).state_dict_metadata
        want = {**self._outer_keys(create=True), **self._inner_keys(), **self._own_keys()}
        missing = sorted(k for k in want if k not in saved)
        if missing:
            raise PartitaError(f"checkpoint {path} holds no {self.MODE} state ({missing[0]} ...): it was not written "
                               f"by a {self.MODE} run of this plan's islands; resume it with the plan that wrote it")
        reader = lambda: dcp.FileSystemReader(str(path))  # noqa: E731 -- one reader per load
        dcp.load(want, storage_reader=reader())
        fragment, merge_at = (int(x) for x in want[f"sync.{self.MODE}.pending{self._stage}"])
        self.pending = None
        if fragment >= 0:
            buckets = self._buckets(self.fragments[fragment])
            dtype = torch.bfloat16 if self.bits == 16 else torch.float32
            wires = {f"sync.{self.MODE}.pending.wire.{j}{self._shard_key}":
                     torch.empty(sum(self.anchor[i].numel() for i in b), dtype=dtype, device=self.anchor[b[0]].device)
                     for j, b in enumerate(buckets)}
            dcp.load(wires, storage_reader=reader())
            self.pending = InFlight(fragment=fragment, merge_at=merge_at, buckets=buckets, wires=list(wires.values()))

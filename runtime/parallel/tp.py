"""Tensor parallelism: the plan's placements become DTensor shardings on the tp mesh.

Placement styles (`plan.placements[fqn]`):

- "colwise" / "rowwise" (nn.Linear) -- Megatron tensor parallelism (Shoeybi et al. 2019). A column-parallel
  layer whose parent module also holds a row-parallel layer (q/k/v -> proj, fc1 -> fc2) hands its local
  shard on; a lone column-parallel layer (e.g. an LM head) gathers its output, and a lone row-parallel
  layer takes a replicated input, so the user's forward runs unchanged.
- "sequence" (a norm: nn.LayerNorm, nn.RMSNorm, or a module named *LayerNorm / *RMSNorm) -- Megatron
  sequence parallelism (Korthikanti et al. 2022, sec. 4.2.2): the norm runs on this rank's 1/tp of the
  sequence; its weights are replicated.
- "vocab" -- vocabulary parallelism: on an nn.Embedding the table is split by rows (Megatron's
  VocabParallelEmbedding: masked lookup, then the partial sums are combined); on the LM head nn.Linear
  (the layer whose output is the logits) the output features are split and the logits stay a DTensor
  sharded on the vocabulary, for `loss_parallel()` (parallel cross-entropy).

The layout rule for "sequence". Activations of shape [batch, seq, hidden] that are sequence-sharded are
always DTensors with placement Shard(1) on the tp mesh, never plain tensors, so no layer has to guess
whether a plain tensor is whole or a shard: a plain activation is always the whole (replicated) one.

1. A "sequence" norm takes its input as Shard(1) (a plain input is whole: this rank keeps its chunk,
   without communication) and returns a Shard(1) DTensor.
2. A module holding a "sequence" norm as a direct child (a transformer block; never the model itself)
   is a sequence-parallel block: all its norm children must be "sequence", and its residual stream is
   sequence-sharded -- the block's floating-point 3-D tensor arguments (the hidden states; not RoPE
   tables, masks or token ids) enter as Shard(1) DTensors, so residual adds and dropout run on sequence
   shards; a row-parallel layer whose nearest norm-holding ancestor is such a block reduce-scatters its
   output to Shard(1) instead of all-reducing it (Megatron's g-bar).
3. A column-parallel layer (colwise, or a vocab head) all-gathers a Shard(1) input (Megatron's g), a
   plain input being replicated already. The parent of column-parallel layers (attention, MLP) gathers
   each of its sequence-sharded arguments once, so q/k/v (fc1/gate) share one all-gather.
4. Sequence-sharded outputs are handed on only to a module that takes them (rules 1-3): the module that
   runs next -- the next sibling in registration order (or, after the last child, its parent's next
   sibling; a layer list is entered at its first layer) -- must be a sequence-parallel block, a
   "sequence" norm, a column-parallel layer, or a module without norms that holds column-parallel layers
   (attention, MLP). Otherwise the output is all-gathered to a plain tensor: a block before a
   non-sequence-parallel block or at a pipeline stage's end, a final norm before a replicated head.
   A "vocab" embedding likewise reduce-scatters to Shard(1) when its next module takes it (e.g. Llama's
   first block), else all-reduces (GPT's token embedding, to which a position embedding is added).

Rule 4 reads execution order from registration order. Where the two differ, a plain tensor still means
the whole activation and a DTensor still describes its own layout, so the values stay right; what can go
wrong fails loudly (DTensor's "mixed torch.Tensor and DTensor" error). The vocab head's loss: see
`loss_context`; the gradients of replicated weights used on sequence shards: see `settle_grads`.

Dropout in a sequence-sharded region draws from each rank's generator: on CUDA, DTensor's RNG tracker
gives each shard its part of one mask; on CPU (which DTensor's random ops do not support: torch warns)
every tp rank draws the same pattern for its own shard. The model presets train without dropout.

Works on the user's modules and on the outlined copies that `pipeline()` makes of them (`InterpreterModule`s
holding the same parameters and calling `aten.linear` / `aten.embedding` / the norm's ops).
"""
from __future__ import annotations

import contextlib
from functools import partial

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                               loss_parallel, parallelize_module)
from torch.distributed.tensor.parallel.style import ParallelStyle
from torch.utils._pytree import tree_map_only

from partita.runtime.parallel.layers import class_name, is_embedding, is_norm  # noqa: F401 (re-exported)

SEQ = Shard(1)
"""The sequence dimension of [batch, seq, hidden] activations."""


# ---- module kinds -------------------------------------------------------------------------------
def _parent(fqn: str) -> str:
    return fqn.rpartition(".")[0]


def _child(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name


# ---- the styles ---------------------------------------------------------------------------------
class _LinearLike:
    """Mixin: apply the nn.Linear sharding to any module that holds Linear's weight/bias."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if isinstance(module, nn.Linear):
            return super()._apply(module, device_mesh)
        if isinstance(self, RowwiseParallel):
            self.desired_input_layouts = (Shard(-1),)
        return distribute_module(
            module, device_mesh, self._partition_linear_fn,
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))


class Colwise(_LinearLike, ColwiseParallel):
    """Column-parallel Linear (rule 3): a DTensor input (sequence-sharded) is all-gathered, a plain one is
    replicated."""

    @staticmethod
    def _prepare_input_fn(input_layouts, desired_input_layouts, mod, inputs, device_mesh):
        x = inputs[0]
        if not isinstance(x, DTensor):
            return ColwiseParallel._prepare_input_fn(input_layouts, desired_input_layouts, mod, inputs, device_mesh)
        if tuple(x.placements) == tuple(desired_input_layouts):
            return x  # gathered by the parent already; a no-op redistribute would all-reduce its gradient here
        return x.redistribute(placements=desired_input_layouts, async_op=True)


class Rowwise(_LinearLike, RowwiseParallel):
    pass


class VocabEmbedding(RowwiseParallel):
    """Embedding table split by rows (vocabulary); also on a pipeline's outlined copy of an Embedding."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        self.desired_input_layouts = (Replicate(),)
        return distribute_module(
            module, device_mesh, self._partition_embedding_fn,
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))


class SequenceNorm(SequenceParallel):
    """A "sequence" norm (rule 1); `keep`: hand the Shard(1) output on, else all-gather it (rule 4)."""

    def __init__(self, keep: bool):
        super().__init__(sequence_dim=1)
        self.keep = keep

    @staticmethod
    def _prepare_input_fn(sequence_sharding, mod, inputs, device_mesh):
        return (to_sequence_shards(inputs[0], device_mesh),) + tuple(inputs[1:])

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(module, device_mesh, self._replicate_module_fn,
                                 partial(self._prepare_input_fn, self.sequence_sharding),
                                 lambda mod, out, mesh: out if self.keep else gather(out))


class SequenceBlock(ParallelStyle):
    """A sequence-parallel block (rule 2): hidden-state arguments enter as Shard(1) DTensors; the output
    is handed on (`keep`) or all-gathered (rule 4)."""

    def __init__(self, keep: bool):
        self.keep = keep

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def enter(mod, args, kwargs):
            shard = lambda a: to_sequence_shards(a, device_mesh) if _hidden(a) else a  # noqa: E731
            return tuple(map(shard, args)), {k: shard(v) for k, v in kwargs.items()}

        module.register_forward_pre_hook(enter, with_kwargs=True)
        if not self.keep:
            module.register_forward_hook(lambda mod, args, out: gather(out))
        return module


class GatherSequence(ParallelStyle):
    """The parent of column-parallel layers (rule 3): each sequence-sharded argument is all-gathered once
    (to a replicated DTensor, so the layers use it as it is)."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def once(t: DTensor):
            return t.redistribute(placements=(Replicate(),), async_op=True) if t.placements == (SEQ,) else t

        module.register_forward_pre_hook(lambda mod, args, kwargs: tree_map_only(DTensor, once, (args, kwargs)),
                                          with_kwargs=True)
        return module


def _hidden(a) -> bool:
    return isinstance(a, torch.Tensor) and a.dim() == 3 and a.is_floating_point()


def to_sequence_shards(x: torch.Tensor, mesh: DeviceMesh) -> DTensor:
    """`x` as a Shard(1) DTensor: a plain tensor is whole (this rank keeps its chunk, no communication)."""
    if not isinstance(x, DTensor):
        x = DTensor.from_local(x, mesh, (Replicate(),), run_check=False)
    return x if x.placements == (SEQ,) else x.redistribute(placements=(SEQ,), async_op=True)


def gather(out):
    """Every DTensor in a module's output all-gathered to a plain (replicated) tensor."""
    return tree_map_only(DTensor, lambda t: t.full_tensor(), out)


# ---- the rule -----------------------------------------------------------------------------------
class Layout:
    """Rules 1-4 (module docstring) on one module tree: the user's model or a pipeline stage."""

    def __init__(self, placements: dict[str, str], module: nn.Module | None = None):
        self.tree = dict(module.named_modules()) if module is not None else {}
        pl = {f: s for f, s in placements.items() if module is None or f in self.tree}  # this stage's
        self.placements = pl
        self.sequence = {f for f, s in pl.items() if s == "sequence"}
        self.blocks = {_parent(f) for f in self.sequence if _parent(f)}
        self.column = {f for f, s in pl.items() if s == "colwise" or (s == "vocab" and not self._embedding(f))}

    def _embedding(self, fqn: str) -> bool:
        mod = self.tree.get(fqn)
        return mod is not None and is_embedding(mod, fqn)

    def _norm_children(self, fqn: str) -> bool:
        return any(is_norm(c, _child(fqn, n)) for n, c in self.tree[fqn].named_children())

    def runs_next(self, fqn: str) -> str | None:
        """The module that runs after `fqn`: its next sibling in registration order, else its parent's."""
        while fqn:
            parent, _, name = fqn.rpartition(".")
            names = [n for n, _ in self.tree[parent].named_children()]
            i = names.index(name)
            if i + 1 < len(names):
                return _child(parent, names[i + 1])
            fqn = parent
        return None

    def takes_sequence_shards(self, fqn: str | None) -> bool:
        """Whether module `fqn` takes a Shard(1) DTensor input (rule 4)."""
        if fqn is None or fqn not in self.tree:
            return False
        if fqn in self.blocks or fqn in self.sequence or fqn in self.column:
            return True
        children = [n for n, _ in self.tree[fqn].named_children()]
        if not children:
            return False
        if all(n.isdigit() for n in children) or isinstance(self.tree[fqn], (nn.ModuleList, nn.Sequential)):
            return self.takes_sequence_shards(_child(fqn, children[0]))  # a layer list: its first layer
        prefix = fqn + "."
        return not self._norm_children(fqn) and any(c.startswith(prefix) for c in self.column)

    def keeps(self, fqn: str) -> bool:
        return self.takes_sequence_shards(self.runs_next(fqn))

    def in_sequence_block(self, fqn: str) -> bool:
        """Whether the nearest norm-holding ancestor of `fqn` is a sequence-parallel block (rule 2)."""
        a = _parent(fqn)
        while a:
            if a in self.blocks:
                return True
            if a in self.tree and self._norm_children(a):
                return False
            a = _parent(a)
        return False

    def styles(self) -> dict[str, ParallelStyle]:
        """ParallelStyle per module FQN: the placed modules, then the blocks and colwise parents of rules 2-3."""
        pl = self.placements
        parents = {style: {_parent(f) for f, s in pl.items() if s == style} for style in ("colwise", "rowwise")}
        out: dict[str, ParallelStyle] = {}
        for fqn, style in pl.items():
            parent = _parent(fqn)
            if style == "colwise":
                out[fqn] = Colwise() if parent in parents["rowwise"] else Colwise(output_layouts=Replicate())
            elif style == "rowwise":
                inp = {} if parent in parents["colwise"] else {"input_layouts": Replicate()}
                seq = self.in_sequence_block(fqn)
                out[fqn] = Rowwise(**inp, output_layouts=SEQ if seq else Replicate(), use_local_output=not seq)
            elif style == "sequence":
                out[fqn] = SequenceNorm(keep=self.keeps(fqn))
            elif self._embedding(fqn):  # vocab
                keep = bool(self.sequence) and self.keeps(fqn)
                out[fqn] = VocabEmbedding(input_layouts=Replicate(), output_layouts=SEQ if keep else Replicate(),
                                          use_local_output=not keep)
            else:  # vocab head: logits stay sharded on the vocabulary for loss_parallel
                out[fqn] = Colwise(output_layouts=Shard(-1), use_local_output=False)
        if self.sequence:
            for block in self.blocks:
                out[block] = SequenceBlock(keep=self.keeps(block))
            for parent in {_parent(f) for f in self.column} - self.blocks - {""}:
                if parent in self.tree and not self._norm_children(parent):
                    out[parent] = GatherSequence()
        return out


def styles(placements: dict[str, str], module: nn.Module | None = None) -> dict[str, ParallelStyle]:
    """ParallelStyle per module FQN of `module` (the model or a pipeline stage) under the module docstring's
    rules. Without `module` (which rules 2-4 and the vocab embedding/head distinction need) only
    colwise/rowwise placements are understood."""
    return Layout(placements, module).styles()


def apply_tp(module: nn.Module, placements: dict[str, str], tp_mesh: DeviceMesh) -> int:
    """Shard the placed layers that `module` holds (all, or one pipeline stage's); returns how many."""
    layout = Layout(placements, module)
    plan = layout.styles()
    if plan:
        parallelize_module(module, tp_mesh, plan)
    return len(layout.placements)


def vocab_head(placements: dict[str, str], module: nn.Module) -> bool:
    """Whether `module` holds a "vocab" Linear (a vocab-parallel LM head)."""
    have = dict(module.named_modules())
    return any(s == "vocab" and f in have and not is_embedding(have[f], f) for f, s in placements.items())


def loss_context(parallel: bool):
    """Where forward and backward run: inside `loss_parallel()` when the logits are vocab-sharded (the
    cross-entropy's log-softmax is then computed shard-wise, with all-reduces of the max and the sum of
    exponentials, Megatron's vocab-parallel cross-entropy), else nothing."""
    return loss_parallel() if parallel else contextlib.nullcontext()


@torch.no_grad()
def settle_grads(params: list[torch.Tensor]) -> None:
    """Give every DTensor gradient its parameter's placements, once per step, before the optimizer.

    A replicated weight applied to sequence shards (a "sequence" norm's) gets a Partial gradient, each tp
    rank's sum over its own tokens: these are summed in one all-reduce per mesh and dtype (left Partial,
    the optimizer would all-reduce them in every op that reads them). A vocab embedding's gradient comes
    out of the embedding backward whole (Replicate): each rank keeps its rows, without communication.
    Under FSDP the gradients are already sharded as their parameters (FSDP redistributes them itself)."""
    buckets: dict[tuple, list[torch.Tensor]] = {}
    for p in params:
        g = p.grad
        if not isinstance(g, DTensor) or g.placements == p.placements:
            continue
        if g.device_mesh.ndim == 1 and g.placements[0].is_partial() and p.placements[0].is_replicate():
            buckets.setdefault((g.device_mesh, g.dtype), []).append(p)
        else:
            p.grad = g.redistribute(placements=p.placements)
    for (mesh, _), ps in buckets.items():
        local = [p.grad.to_local() for p in ps]
        flat = torch.cat([t.reshape(-1) for t in local])
        dist.all_reduce(flat, group=mesh.get_group())
        for p, t, part in zip(ps, local, flat.split([t.numel() for t in local])):
            p.grad = DTensor.from_local(part.view_as(t), mesh, p.placements, run_check=False)


def plain(t: torch.Tensor) -> torch.Tensor:
    """A (replicated) DTensor loss as a plain tensor, differentiably."""
    return t.full_tensor() if isinstance(t, DTensor) else t

"""Activation recomputation of one block (`plan.blocks[i].recompute`), as planner/enumerate/strategies.py costs it.

- "full": `torch.utils.checkpoint.checkpoint(use_reentrant=False)` around the block's forward: the block
  keeps only its input and runs its forward again in the backward pass.
- "selective": the same checkpoint with a policy (`create_selective_checkpoint_contexts`) that SAVES the
  outputs of operators with parameters -- linear layers (aten mm/addmm/linear with a weight), norms,
  embeddings: any op taking both a parameter and an activation -- and of fused attention (the aten
  `_scaled_dot_product_*` kernels), and RECOMPUTES everything else: activations, elementwise ops,
  residual adds, views, and a materialised attention core (q k^T, softmax, scores x v). That is the
  planner's "selective" (`keeps_output_under_selective`). A parameter is recognised through what is
  computed from parameters alone (autocast's casts, transposes). Two additions the planner's memory
  model does not see: the outputs of tensor-parallel collectives are saved too, so the re-run repeats no
  communication (the planner charges repeated all-reduces to "full" only); and attention with dropout is
  recomputed, because a saved random op would shift the random numbers every later op of the re-run
  draws (checkpointing replays the RNG from the block's start).
- "op": torchtitan's per-op selective checkpointing, the same checkpoint with `AlternatePolicy`: of the
  matrix products taking a weight (aten mm/addmm/bmm/... fed a parameter), counted in forward order, it
  saves the 1st, 3rd, 5th ..., and fused attention and collectives as "selective" does; everything
  else, norms included, is recomputed (the planner's "op", planner/enumerate/strategies.py `is_weight_matmul`).
  The forward and the re-run count separately, so both pick the same products.
"""
from __future__ import annotations

import weakref
from functools import partial
from typing import Any, Callable

import torch
import torch.nn as nn
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from partita.runtime.parallel.wrap import Around

_ATTENTION = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
              "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
              "_scaled_dot_product_fused_attention_overrideable")
_COLLECTIVES = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single")


def _packets(namespace, names) -> set:
    return {getattr(namespace, n) for n in names if hasattr(namespace, n)}


FUSED_ATTENTION = _packets(torch.ops.aten, _ATTENTION)
MATMULS = _packets(torch.ops.aten, ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_grouped_mm"))
COLLECTIVES = _packets(torch.ops._c10d_functional, _COLLECTIVES)


def tensors(tree) -> list[torch.Tensor]:
    """The tensors among the leaves of a pytree (args, kwargs, op outputs)."""
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _draws_random(op, args: tuple, kwargs: dict) -> bool:
    """Whether an attention call applies dropout (its schema's dropout_p is positive)."""
    for i, a in enumerate(op._schema.arguments):
        if a.name == "dropout_p":
            p = kwargs.get("dropout_p", args[i] if i < len(args) else a.default_value)
            return bool(p)
    return False


class SelectivePolicy:
    """The policy function of one checkpointed forward (module docstring). `keep`, if given, is called
    with the output of every op it saves, in the forward pass."""

    def __init__(self, keep: Callable[[Any], None] | None = None):
        self.keep = keep
        self._weights: dict[int, weakref.ref] = {}  # tensors computed from parameters alone

    def _is_weight(self, t: torch.Tensor) -> bool:
        if isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter):
            return True
        ref = self._weights.get(id(t))
        return ref is not None and ref() is t

    def keeps_parametric(self, packet, recompute: bool) -> bool:
        """Whether an op fed a weight and an activation is saved (`recompute`: called in the re-run)."""
        return True

    def saves(self, op, args: tuple, kwargs: dict, out, recompute: bool = False) -> bool:
        weight = [self._is_weight(t) for t in tensors((args, kwargs))]
        if weight and all(weight):  # a cast or view of parameters: cheap to redo, and itself a weight
            self._weights.update((id(t), weakref.ref(t)) for t in tensors(out))
            return False
        packet = getattr(op, "overloadpacket", None)
        if packet in FUSED_ATTENTION:
            return not _draws_random(op, args, kwargs)
        return packet in COLLECTIVES or (any(weight) and self.keeps_parametric(packet, recompute))

    def __call__(self, ctx, op, *args, **kwargs) -> CheckpointPolicy:
        out = getattr(ctx, "op_output", None)
        if not self.saves(op, args, kwargs, out, ctx.is_recompute):
            return CheckpointPolicy.PREFER_RECOMPUTE
        if self.keep is not None and not ctx.is_recompute:
            self.keep(out)
        return CheckpointPolicy.MUST_SAVE


class AlternatePolicy(SelectivePolicy):
    """The "op" policy (module docstring): of the ops with a weight, only every other matrix product."""

    def __init__(self, keep: Callable[[Any], None] | None = None):
        super().__init__(keep)
        self._products = {False: 0, True: 0}  # weight matmuls seen in the forward, and in the re-run

    def keeps_parametric(self, packet, recompute: bool) -> bool:
        if packet not in MATMULS:
            return False  # norms, a weight's elementwise use: re-run
        self._products[recompute] += 1
        return self._products[recompute] % 2 == 1


def selective_contexts(keep: Callable[[Any], None] | None = None,
                       before_recompute: Callable[[], None] | None = None, policy=None):
    """The (forward, recompute) context pair for `checkpoint(context_fn=...)` under the selective policy
    (or `policy`, a SelectivePolicy class such as AlternatePolicy); `before_recompute` runs as the re-run
    starts (e.g. to bring kept tensors back from host memory)."""
    forward, recompute = create_selective_checkpoint_contexts((policy or SelectivePolicy)(keep))
    if before_recompute is not None:
        recompute = _after(before_recompute, recompute)
    return forward, recompute


class _after:
    """A context manager that calls `fn` and then enters `ctx`."""

    def __init__(self, fn, ctx):
        self.fn, self.ctx = fn, ctx

    def __enter__(self):
        self.fn()
        return self.ctx.__enter__()

    def __exit__(self, *exc):
        return self.ctx.__exit__(*exc)


def run_checkpointed(inner, args: tuple, kwargs: dict, context_fn=None):
    """`inner(*args, **kwargs)` under non-reentrant checkpointing (selective when `context_fn` is given)."""
    extra = {"context_fn": context_fn} if context_fn is not None else {}
    return checkpoint(inner, *args, use_reentrant=False, **extra, **kwargs)


POLICIES = {"selective": SelectivePolicy, "op": AlternatePolicy}
"""The checkpoint policy of each selective recompute mode."""


def recompute(mode: str) -> Around:
    """The forward wrapper (runtime.parallel.wrap) of a recompute mode: "full", or one of POLICIES."""
    if mode == "full":
        return run_checkpointed
    if mode in POLICIES:
        return partial(run_checkpointed, context_fn=partial(selective_contexts, policy=POLICIES[mode]))
    raise ValueError(f"recompute mode {mode!r}")

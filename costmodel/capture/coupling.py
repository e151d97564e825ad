"""Does the loss couple the samples of a batch? Found on fake tensors, announced before training.

Data parallelism computes the loss of each rank's own micro-batch and averages the gradients. That equals the
loss of the whole batch only when the loss is a mean of per-sample terms: loss(B) = 1/|B| sum_i l(x_i). A
contrastive loss (CLIP, SimCLR, in-batch negatives) is not: sample i's term reads every other sample of its
batch (its negatives), so under --dp N each rank sees 1/N of them and training differs from one device.

How it is found: the model with its loss runs twice on fake tensors (no memory, no FLOPs), on batches of
B = 2 and B = 3 samples, and every operator's output is compared between the two runs. A tensor whose size
grows as B (numel ratio 3/2) holds per-sample values; one that does not grow holds none. The loss couples
samples when, before its final reduction,
- a tensor grows as B^2 or faster (numel ratio 9/4: a [B, B] similarity of embeddings with their transpose);
- a softmax, log-softmax, log-sum-exp or cumulative sum runs along a dimension that grows with B;
- a statistic over the batch (an output that does not grow, computed from one that does) meets a per-sample
  tensor again in a later operator (x - x.mean(0), a loss normalised by the batch's own scores).
BatchNorm reduces over the batch by design and has its own remedy (--sync-batchnorm): its operator is opaque
here. The final mean, and scalars combined with scalars afterwards (an auxiliary loss), are not coupling.

Partita's own models (`hf:`, presets, `gpt:` / `llama:` families: a config naming its family; CNN presets:
partita's classification loss) train per-token or per-image cross-entropy and are not run, except the `hf:` dual
encoders (hf:clip, hf:siglip: costmodel.models.hf_dual), whose contrastive loss is judged as a user's is (for a user's model
the two fake runs cost about what the capture does: 4.4 s for resnet50's shapes); a model that cannot run at
B = 2 and B = 3 (a fixed batch size, tensor values read by Python) is not judged: `find` returns None.
"""
from __future__ import annotations

import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

BATCHES = (2, 3)
_SCANS = ("_softmax", "_log_softmax", "logsumexp", "cumsum", "softmax", "log_softmax")
"""Operators whose `dim` argument (their second) reads along a dimension: across samples when it grows with B."""
_OPAQUE = ("batch_norm",)
"""Operators that reduce over the batch by design (module docstring)."""


class _Recorder(TorchDispatchMode):
    """Each aten call: (name, input tensor ids, output ids and shapes, the `dim` argument of a scan)."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, list[int], list[tuple[int, tuple[int, ...]]], int | None]] = []
        self.alive: list[torch.Tensor] = []  # keeps ids unique for the run's duration

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        name = func.overloadpacket.__name__
        dim = args[1] if name in _SCANS and len(args) > 1 else None
        dim = dim[0] if isinstance(dim, (list, tuple)) and len(dim) == 1 else dim
        shape = tuple(args[0].shape) if ins and isinstance(args[0], torch.Tensor) else ()
        dim = (dim % len(shape) if shape else None) if isinstance(dim, int) else None
        self.alive += ins + outs
        self.ops.append((name, [id(t) for t in ins], [(id(t), tuple(t.shape)) for t in outs],
                         None if dim is None else shape[dim]))
        return out


def _run(spec, batch: int) -> list:
    """The ops of one fake forward (model and loss) at `batch` samples."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from partita.costmodel.capture.fake import build_fake, wrap_for_capture
    from partita.costmodel.models.registry import original_module
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    model, inputs = build_fake(spec, "fp32", mode, batch)
    model = original_module(model)  # a torch.compile'd whole model: its own ops
    with mode:
        root, args, _, _ = wrap_for_capture(spec, model, inputs)
        root.train()
        recorder = _Recorder()
        with recorder:
            root(*args)
    return recorder.ops


def _degree(small: tuple[int, ...], large: tuple[int, ...]) -> float:
    """How a tensor grows with the batch: numel(B=3) = numel(B=2) x (3/2)^degree."""
    a, b = math.prod(small), math.prod(large)
    return 0.0 if a == 0 or b == 0 else math.log(b / a) / math.log(BATCHES[1] / BATCHES[0])


def find(spec) -> str | None:
    """Why `spec`'s loss couples the samples of a batch (one phrase naming the operator), or None: it does not,
    or the model could not be run at two batch sizes (module docstring)."""
    contrastive = spec.config.get("task") == "contrastive"  # hf:clip, hf:siglip: judged like a user's model
    if not contrastive and (spec.config.get("family")
                            or getattr(spec.loss_fn, "__module__", "").startswith("partita.")):
        return None
    try:
        small, large = (_run(spec, b) for b in BATCHES)
    except Exception:  # noqa: BLE001 -- a model that does not run at these batches is not judged
        return None
    if [op[0] for op in small] != [op[0] for op in large]:
        return None  # control flow that depends on the batch size: the two runs do not pair up
    return _judge(small, large)


def _judge(small: list, large: list) -> str | None:
    """The first coupling found in the paired runs (module docstring's three rules)."""
    per_sample: set[int] = set()      # ids (in the small run) of tensors that grow with B
    statistic: set[int] = set()       # ids of tensors derived from a statistic over the batch
    for (name, ins, outs, along), (_, _, outs_large, along_large) in zip(small, large):
        degrees = [_degree(s, big[1]) for (_, s), big in zip(outs, outs_large)]
        if any(d > 1.5 for d in degrees):
            return f"{name} makes a tensor that grows as the batch squared, a similarity of every pair of samples"
        if along is not None and along_large is not None and along_large > along:
            return f"{name} runs along the batch dimension, across samples"
        opaque = any(o in name for o in _OPAQUE)
        grows = any(i in per_sample for i in ins)
        if not opaque and grows and any(i in statistic for i in ins):
            return f"{name} combines a statistic over the batch with per-sample values"
        for (tid, _), d in zip(outs, degrees):
            if d > 0.5:
                per_sample.add(tid)
            elif not opaque and (grows or any(i in statistic for i in ins)):
                statistic.add(tid)
    return None

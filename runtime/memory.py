"""Memory a rank holds during training, as far as it can be measured.

On GPU: `torch.cuda.max_memory_allocated`. On CPU there is no allocator counter, so the number is
*tracked*: bytes of this rank's parameters + gradients + optimizer state (local shards) plus the peak
of live saved-for-backward tensors seen by `saved_tensors_hooks` (deduplicated by storage; parameters,
and FSDP's gathered parameters and their views, excluded). It leaves out temporaries that autograd does
not save, communication buffers, and what a block hands to its own hooks instead (checkpointed blocks
keep their tensors out of sight; offloaded ones keep them in host memory).
"""
from __future__ import annotations

import resource
from collections import defaultdict
from typing import Iterable

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

CPU_METHOD = "tracked: parameters + gradients + optimizer state + peak live saved activations"
GPU_METHOD = "torch.cuda.max_memory_allocated"


def local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


def _storage(t: torch.Tensor) -> tuple[int, int]:
    s = local(t).untyped_storage()
    return s.data_ptr(), s.nbytes()


def state_bytes(params: Iterable[torch.Tensor], optimizer: torch.optim.Optimizer) -> int:
    """Bytes of parameters, their gradients and the optimizer state held by this rank."""
    total = 0
    for p in params:
        total += local(p).nbytes + (local(p.grad).nbytes if p.grad is not None else 0)
    for state in optimizer.state.values():
        total += sum(local(v).nbytes for v in state.values() if isinstance(v, torch.Tensor))
    return total


class SavedActivations:
    """Context manager counting live bytes of tensors autograd saves for backward; keeps the peak."""

    def __init__(self, params: Iterable[torch.Tensor]):
        self.exclude = {_storage(p)[0] for p in params}
        self.refs: dict[int, int] = defaultdict(int)
        self.live = 0
        self.peak = 0
        self._hooks = None

    def _pack(self, t):
        if isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter):
            return t, None
        try:
            ptr, nbytes = _storage(t)
        except (RuntimeError, NotImplementedError):  # a tensor without storage: not counted
            return t, None
        if ptr in self.exclude or ptr == 0:
            return t, None
        if self.refs[ptr] == 0:
            self.live += nbytes
            self.peak = max(self.peak, self.live)
        self.refs[ptr] += 1
        return t, (ptr, nbytes)

    def _unpack(self, packed):
        t, key = packed
        if key is not None and self.refs.get(key[0], 0) > 0:
            self.refs[key[0]] -= 1
            if self.refs[key[0]] == 0:
                self.live -= key[1]
                del self.refs[key[0]]
        return t

    def __enter__(self):
        self.refs.clear()
        self.live = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (Linux reports KiB); includes the torch runtime itself."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

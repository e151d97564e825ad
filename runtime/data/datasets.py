"""A user's `torch.utils.data` dataset as the run's data: `--data package.module:factory`.

The factory takes no arguments and returns a map-style `Dataset` (`__getitem__` and `__len__`) or an
`IterableDataset`. One sample is one row of a batch: the tensors the model's loss takes after the module,
without the batch dimension -- `(image, label)` for a factory model with `loss_fn(module, images, labels)`,
`(input_ids, target_ids)` for a token LM (each [seq]); numbers become tensors (torch's default_collate),
floating tensors take the dtype of the model's example inputs.

Order (the token files' property, runtime.data: a batch depends on the seed and the step, never on the
world size). The samples are one stream of epochs: sample position p = step x global_batch + row, in epoch
p // N at place p % N of that epoch's order, and a data-parallel rank reads only the rows of its slice of
the global batch. So every rank of any world size sees its part of the same global batches, a resumed run
continues the stream where the checkpoint left it, and the single-process reference sees the same batches.

- map-style: each epoch is a permutation of the N indices drawn from `torch.randperm` seeded by
  (seed, epoch), as `DistributedSampler(shuffle=True)` draws it from seed + epoch, and each sample is read
  once per epoch across all ranks together; the last partial batch of an epoch continues into the next.
- iterable: the dataset's own order, read again from its start each epoch (`set_epoch(epoch)` first when the
  dataset has one); every rank reads the stream up to its rows and keeps them, so resuming at step k reads
  k x global_batch samples to get there. Shard a large stream yourself (e.g. by file) if that is too slow.
"""
from __future__ import annotations

import importlib
import os
import re
import sys
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, default_collate

from partita.costmodel.errors import PartitaError
from partita.runtime.data import _Source, derived_seed

FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
"""A `package.module:factory` name (a --data value that is no existing file)."""


def is_factory(name: str) -> bool:
    return bool(FACTORY.match(name)) and not os.path.exists(name)


def load(name: str):
    """The dataset `package.module:factory()` returns (the working directory importable, as for models)."""
    module_name, _, attr = name.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise PartitaError(f"cannot import dataset factory {name!r}: {e}") from None
    try:
        dataset = factory()
    except Exception as e:  # noqa: BLE001 -- the user's code
        raise PartitaError(f"dataset factory {name!r} failed: {type(e).__name__}: {e}") from None
    if not isinstance(dataset, (Dataset, IterableDataset)):
        raise PartitaError(f"dataset factory {name!r} returned {type(dataset).__name__}; return a "
                           "torch.utils.data.Dataset (map-style) or IterableDataset")
    return dataset


class DatasetSource(_Source):
    """The run's batches from a torch dataset (module docstring), a runtime.data source."""

    def __init__(self, dataset, name: str, expected: list[tuple[tuple[int, ...], torch.dtype]], global_batch: int,
                 seed: int = 0):
        self.dataset, self.name, self.expected = dataset, name, expected
        self.global_batch, self.seed = global_batch, seed
        self.iterable = isinstance(dataset, IterableDataset)
        self._orders: dict[int, torch.Tensor] = {}
        self._stream: tuple[int, int, Any] | None = None  # an iterable's (epoch, next place in it, iterator)
        self._read = 0  # the stream position self._stream reads next
        if not self.iterable:
            try:
                self.length = len(dataset)
            except TypeError:
                raise PartitaError(f"dataset {name!r} is map-style but has no __len__; give it one, or make it "
                                   "an IterableDataset") from None
            if self.length < 1:
                raise PartitaError(f"dataset {name!r} is empty")
        else:
            self.length = None
        self._check(self._first())

    # ---- reading samples by stream position ----------------------------------------------------------
    def _order(self, epoch: int) -> torch.Tensor:
        if epoch not in self._orders:
            gen = torch.Generator().manual_seed(derived_seed(self.seed, epoch))
            self._orders = {epoch: torch.randperm(self.length, generator=gen)}  # keep one epoch's order
        return self._orders[epoch]

    def _first(self):
        if not self.iterable:
            return self.dataset[int(self._order(0)[0])]
        for value in self._restart(0)[2]:
            return value
        raise PartitaError(f"dataset {self.name!r} yields no samples")

    def _restart(self, epoch: int):
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)
        return (epoch, 0, iter(self.dataset))

    def rows(self, step: int, start: int, stop: int) -> tuple:
        first = step * self.global_batch
        if self.iterable:
            samples = self._iterable_rows(first + start, first + stop)
        else:
            samples = [self.dataset[int(self._order(p // self.length)[p % self.length])]
                       for p in range(first + start, first + stop)]
        return self._collate(samples)

    def _iterable_rows(self, lo: int, hi: int) -> list:
        """Stream positions lo..hi-1 of an IterableDataset: read from its start (or from where the last read
        stopped), across epochs, counting positions over the whole stream."""
        if self._stream is None or self._read > lo:
            self._stream, self._read = self._restart(0), 0
        out = []
        while self._read < hi:
            e, p, it = self._stream
            try:
                value = next(it)
            except StopIteration:
                if p == 0:
                    raise PartitaError(f"dataset {self.name!r} yields no samples") from None
                self._stream = self._restart(e + 1)
                continue
            self._stream = (e, p + 1, it)
            if self._read >= lo:
                out.append(value)
            self._read += 1
        return out

    # ---- the shape of a sample ----------------------------------------------------------------------
    def _collate(self, samples: list) -> tuple:
        batch = default_collate(samples)
        batch = tuple(batch) if isinstance(batch, (list, tuple)) else (batch,)
        return tuple(t.to(dtype) if t.dtype.is_floating_point and dtype.is_floating_point and t.dtype != dtype else t
                     for t, (_, dtype) in zip(batch, self.expected))

    def _check(self, sample) -> None:
        if isinstance(sample, dict):
            raise PartitaError(f"dataset {self.name!r} yields a dict; yield a tuple of tensors in the order the "
                               "model's loss takes them")
        try:
            batch = self._collate([sample])
        except (TypeError, RuntimeError) as e:
            raise PartitaError(f"dataset {self.name!r}: a sample cannot be made into a batch ({e}); yield a tuple "
                               "of tensors or numbers") from None
        got = [(tuple(t.shape[1:]), t.dtype) for t in batch]
        want = ", ".join(_shape(s, d) for s, d in self.expected)
        have = ", ".join(_shape(s, d) for s, d in got)
        if len(got) != len(self.expected) or any(
                gs != ws or gd.is_floating_point != wd.is_floating_point
                for (gs, gd), (ws, wd) in zip(got, self.expected)):
            raise PartitaError(f"dataset {self.name!r} yields samples ({have}), but the model trains on samples "
                               f"({want}): one row of its batch, without the batch dimension")

    def describe(self) -> dict:
        return {"kind": "dataset", "factory": self.name, "samples": self.length, "seed": self.seed}


def _shape(shape: tuple[int, ...], dtype: torch.dtype) -> str:
    return f"{'x'.join(map(str, shape)) or 'scalar'} {str(dtype).removeprefix('torch.')}"

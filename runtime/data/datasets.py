"""A user's dataset as the run's data: `--data package.module:factory`.

The factory takes no arguments and returns a dataset, recognised by what it can do:
- map-style: anything with `__getitem__` and `__len__` -- a torch `Dataset`, a HuggingFace `datasets.Dataset`,
  a list;
- iterable: a torch or HuggingFace `IterableDataset`, or any other object iterated afresh each epoch (not a
  generator or iterator, which can be read only once).

One sample is one row of a batch: the tensors the model's loss takes after the module, without the batch
dimension, as
- a tuple in the order the loss takes them: `(image, label)` for a factory model with `loss_fn(module, images,
  labels)`, `(input_ids, target_ids)` for a token LM (each [seq]); or
- a dict whose keys name them (`ModelSpec.named_inputs`): an `hf:` model's `input_ids` and `labels` (Whisper's
  `input_features` and `labels`, an image classifier's `pixel_values` and `labels`), a factory model's loss_fn
  parameters (`images`, `labels`). Other keys are not used -- the model is planned and run on its named inputs
  alone, so a key it is not given cannot change what it computes; the run says once which (a note before
  training). A key the model would assume a value for when left out is refused instead where the samples hold
  another value (`ASSUMED`: an `attention_mask` that masks padding, `token_type_ids` that are not 0), since
  leaving it out would change the result.
Numbers and python lists of numbers (HuggingFace rows hold token ids as lists) become tensors (torch's
default_collate); floating tensors take the dtype of the model's example inputs.

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
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, default_collate

from partita.costmodel.errors import PartitaError
from partita.runtime.data import Layout, _Source, derived_seed

FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
"""A `package.module:factory` name (a --data value that is no existing file)."""

ACCEPTED = ("a map-style dataset (__getitem__ and __len__: a torch Dataset, a HuggingFace datasets.Dataset, a list) "
            "or an iterable one (a torch or HuggingFace IterableDataset)")

ASSUMED = {
    "attention_mask": (1, "it masks padding: give samples without padding (e.g. the tokens packed into "
                          "full-length windows), or remove the column to train on the padding as tokens"),
    "token_type_ids": (0, "give a model that takes them (a package.module:factory whose loss_fn names "
                          "token_type_ids), or remove the column"),
}
"""Keys a model not given them computes as if they held one value everywhere (HuggingFace's defaults), and what
to do when a dataset's samples hold another."""


def is_factory(name: str) -> bool:
    return bool(FACTORY.match(name)) and not os.path.exists(name)


def kind(dataset) -> str | None:
    """"map" or "iterable" (module docstring); None for anything else. A torch IterableDataset is iterable
    even though torch gives it a `__getitem__`; a str and a dict (a HuggingFace DatasetDict) are neither."""
    if isinstance(dataset, IterableDataset):
        return "iterable"
    if isinstance(dataset, (str, bytes, Mapping)):
        return None
    if isinstance(dataset, Dataset) or all(hasattr(type(dataset), a) for a in ("__getitem__", "__len__")):
        return "map"
    if isinstance(dataset, Iterable) and not isinstance(dataset, Iterator):
        return "iterable"
    return None


def refusal(dataset) -> str:
    """Why `dataset` is no dataset (`kind` None), and what to give instead: the end of a one-line error."""
    what = type(dataset).__name__
    if isinstance(dataset, Mapping):
        keys = ", ".join(repr(k) for k in list(dataset)[:6])
        return (f"{what} (keys {keys}), not one dataset: give one split (e.g. dataset['train']), or make "
                f"columns into rows (datasets.Dataset.from_dict); accepted: {ACCEPTED}")
    if isinstance(dataset, Iterator):
        return (f"{what}, an iterator that can be read only once, but the run reads its data again each epoch "
                f"and on resume: give an object whose __iter__ starts afresh; accepted: {ACCEPTED}")
    return f"{what}; give {ACCEPTED}"


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
    if kind(dataset) is None:
        raise PartitaError(f"dataset factory {name!r} returned {refusal(dataset)}")
    return dataset


def _as_tensor(value):
    """A python list or tuple of numbers as one tensor (default_collate would make one tensor per position of
    it); anything else as it is."""
    if isinstance(value, (list, tuple)):
        try:
            return torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError):
            return value
    return value


class DatasetSource(_Source):
    """The run's batches from a dataset (module docstring), a runtime.data source for the model `layout` describes."""

    def __init__(self, dataset, name: str, layout: Layout, global_batch: int, seed: int = 0):
        self.dataset, self.name, self.global_batch, self.seed = dataset, name, global_batch, seed
        self.expected = layout.sample()
        self.model, self.token_lm = layout.spec.name, layout.kind == "lm"
        self.names = layout.spec.named_inputs()
        self.iterable = kind(dataset) == "iterable"
        self.notes: list[str] = []
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
            index = int(self._order(0)[0])
            try:
                return self.dataset[index]
            except Exception as e:  # noqa: BLE001 -- the user's object: say which read failed, in one line
                raise PartitaError(f"dataset {self.name!r} ({type(self.dataset).__name__}): reading sample "
                                   f"dataset[{index}] failed: {_line(e)}") from None
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
        return self._collate(samples, f"the samples of step {step}")

    def _iterable_rows(self, lo: int, hi: int) -> list:
        """Stream positions lo..hi-1 of an iterable dataset: read from its start (or from where the last read
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

    # ---- from samples to a batch ---------------------------------------------------------------------
    def _fields(self, sample):
        """One sample as the tuple of the model's inputs: a dict's by name (`_named`), a tuple's or list's
        in order; lists of numbers in it as tensors."""
        if isinstance(sample, Mapping):
            return self._named(sample)
        if isinstance(sample, (tuple, list)):
            return tuple(_as_tensor(v) for v in sample)
        return sample

    def _named(self, sample: Mapping) -> tuple:
        """A dict sample's values of the model's input names, in their order (module docstring)."""
        keys = ", ".join(map(str, sample)) or "none"
        if self.names is None:
            raise PartitaError(f"dataset {self.name!r} yields dicts (keys {keys}), but model {self.model!r} does "
                               f"not name its inputs{self._unnamed()}")
        missing = [n for n in self.names if n not in sample]
        if missing:
            raise PartitaError(f"dataset {self.name!r} yields dicts without {', '.join(missing)} (keys: {keys}); "
                               f"model {self.model!r} takes {', '.join(self.names)}: give every sample those keys")
        for key, (value, why) in ASSUMED.items():
            if key in sample and key not in self.names and _differs(sample[key], value):
                raise PartitaError(f"dataset {self.name!r}: a sample's {key} is not {value} everywhere, but model "
                                   f"{self.model!r} takes only {', '.join(self.names)} and computes as if it "
                                   f"were; {why}")
        return tuple(_as_tensor(sample[n]) for n in self.names)

    def _unnamed(self) -> str:
        """The end of the error for dict samples given a model without input names: what to yield instead."""
        want = ", ".join(_shape(s, d) for s, d in self.expected)
        if self.token_lm:
            return (f" (a token LM: it trains on unnamed (inputs, targets) windows, targets the inputs shifted by one "
                    f"token): yield a tuple (inputs, targets) of {want}")
        return (f" (its loss_fn takes the batch as *args): yield a tuple in the order the loss takes them ({want}), "
                "or give loss_fn one named parameter per input, loss_fn(module, name, ...), named as the keys")

    def _collate(self, samples: list, what: str) -> tuple:
        rows = [self._fields(s) for s in samples]
        try:
            batch = default_collate(rows)
        except (TypeError, RuntimeError) as e:
            raise PartitaError(f"dataset {self.name!r}: {what} cannot be made into a batch ({_line(e)}); "
                               "yield tensors, numbers or lists of numbers, of one shape in every sample") from None
        batch = tuple(batch) if isinstance(batch, (list, tuple)) else (batch,)
        if (bad := next((b for b in batch if not isinstance(b, torch.Tensor)), None)) is not None:
            value = bad[0] if isinstance(bad, (list, tuple)) and bad else bad
            raise PartitaError(f"dataset {self.name!r}: {what} cannot be made into a batch (a {type(value).__name__} "
                               "is not a number); yield tensors, numbers or lists of numbers")
        return tuple(t.to(dtype) if t.dtype.is_floating_point and dtype.is_floating_point and t.dtype != dtype else t
                     for t, (_, dtype) in zip(batch, self.expected))

    def _check(self, sample) -> None:
        batch = self._collate([sample], "a sample")
        got = [(tuple(t.shape[1:]), t.dtype) for t in batch]
        label = (lambda i: f"{self.names[i]} ") if isinstance(sample, Mapping) else (lambda i: "")
        want = ", ".join(label(i) + _shape(s, d) for i, (s, d) in enumerate(self.expected))
        have = ", ".join(label(i) + _shape(s, d) for i, (s, d) in enumerate(got))
        if len(got) != len(self.expected) or any(
                gs != ws or gd.is_floating_point != wd.is_floating_point
                for (gs, gd), (ws, wd) in zip(got, self.expected)):
            raise PartitaError(f"dataset {self.name!r} yields samples ({have}), but the model trains on "
                               f"samples ({want}): one row of its batch, without the batch dimension")
        if isinstance(sample, Mapping) and (unused := [str(k) for k in sample if k not in self.names]):
            self.notes.append(f"note: dataset {self.name!r}: model {self.model!r} takes {', '.join(self.names)} from "
                              f"each sample by key; {', '.join(unused)} {'is' if len(unused) == 1 else 'are'} not "
                              "used (the model is planned on its inputs alone)")

    def describe(self) -> dict:
        return {"kind": "dataset", "factory": self.name, "samples": self.length, "seed": self.seed}


def _line(e: BaseException) -> str:
    """An exception in one line: its type and the first line of its message."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def _differs(value, assumed: int) -> bool:
    """Whether a sample's value (a tensor, number or list of numbers) holds anything but `assumed`."""
    t = _as_tensor(value)
    if not isinstance(t, torch.Tensor):
        try:
            t = torch.as_tensor(t)
        except (TypeError, ValueError, RuntimeError):
            return True
    return bool((t != assumed).any())


def _shape(shape: tuple[int, ...], dtype: torch.dtype) -> str:
    return f"{'x'.join(map(str, shape)) or 'scalar'} {str(dtype).removeprefix('torch.')}"

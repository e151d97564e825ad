"""Training batches whose content depends only on (seed, step, global batch): never on the world size or plan.

A batch is a tuple of tensors, each with the sample dimension first; a data-parallel rank takes its
contiguous slice of the global batch (`shard`), and microbatches are contiguous slices of that
(`microbatches`), the same split torch.distributed.pipelining makes. Under context parallelism (cp > 1)
the cp ranks of a dp rank share its slice and each keeps two chunks of every sequence (`context_shard`).
How a batch is made from a model:

- token LMs (`spec.vocab` set, no `spec.loss_fn`; our GPT/Llama presets, and `package.module:factory`
  models with one [batch, seq] integer input and a vocabulary): `(inputs, targets)`, both
  [global_batch, seq_len], from windows of seq_len + 1 tokens: inputs = window[:, :-1], targets =
  window[:, 1:]. The loss is runtime.loop.recipe.lm_loss on the logits.
- models with their own loss (`spec.loss_fn`; HuggingFace `hf:` specs, CNNs): the structure of the spec's
  example batch (`spec.example_inputs(batch)`). Every integer tensor of shape [batch, seq_len] holds the
  same window of seq_len tokens (an HF causal LM's labels are its input_ids: the model shifts them);
  other integer tensors get random ids below the model's class count, float tensors standard normals.
  The loss is `spec.loss_fn(module, *batch)`.

Sources:
- `SyntheticTokens`: random tokens from `torch.Generator().manual_seed(derived_seed(seed, step))`; for
  token LMs exactly `spec.tokens(global_batch, generator)`.
- `DatasetSource` (`--data package.module:factory`, runtime.data.datasets): a user's map-style or iterable
  dataset (torch, HuggingFace `datasets`, a list) of tuple or dict samples, in an order that depends on
  (seed, step) alone as well.
- `TokenFile` (`--data FILE`): a 1-D token array read through numpy memmap -- `.npy` (any integer
  dtype), or raw little-endian uint16 (default) / uint32 (`--data-dtype uint32`), e.g. a file written
  with `np.memmap` or `array.tofile()`. At step k the global batch's window start offsets are drawn
  uniformly from numpy's PCG64 seeded by SeedSequence([seed, k]); a rank reads only its own rows.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from partita.costmodel.errors import PartitaError
from partita.costmodel.models import ModelSpec

Batch = tuple  # of tensors, sample dimension first


def microbatches(t: torch.Tensor, n: int) -> list[torch.Tensor]:
    """`n` contiguous, equal slices along dim 0 (the same split torch.distributed.pipelining makes)."""
    if t.size(0) % n:
        raise ValueError(f"batch of {t.size(0)} is not divisible into {n} microbatches")
    return list(t.tensor_split(n))


def split_batch(batch: Batch, n: int) -> list[Batch]:
    """The `n` contiguous microbatches of a batch tuple."""
    return list(zip(*(microbatches(t, n) for t in batch)))


def context_positions(seq: int, cp: int, cp_rank: int) -> torch.Tensor:
    """The global positions of the tokens context-parallel rank `cp_rank` of `cp` holds: the sequence is cut
    into 2 * cp equal chunks and the rank takes chunks cp_rank and 2 * cp - 1 - cp_rank (one near the head,
    one near the tail, so every rank does the same causal-attention work), in that order."""
    if seq % (2 * cp):
        raise ValueError(f"sequence of {seq} tokens is not divisible into 2 x cp = {2 * cp} chunks")
    c = seq // (2 * cp)
    head, tail = cp_rank * c, (2 * cp - 1 - cp_rank) * c
    return torch.cat((torch.arange(head, head + c), torch.arange(tail, tail + c)))


def context_shard(batch: Batch, cp: int, cp_rank: int) -> Batch:
    """A context-parallel rank's part of a token-LM batch: every tensor ([batch, seq], inputs and the already
    shifted targets) at the positions `context_positions` gives, along the sequence dimension."""
    if cp == 1:
        return batch
    idx = context_positions(batch[0].size(1), cp, cp_rank).to(batch[0].device)
    return tuple(t.index_select(1, idx) for t in batch)


def _bound(spec: ModelSpec, key: str) -> int | None:
    v = spec.config.get(key) if isinstance(spec.config, dict) else None
    return v if isinstance(v, int) and v > 0 else None


class Layout:
    """How a batch of `n` samples is made from token windows (module docstring)."""

    def __init__(self, spec: ModelSpec):
        self.spec = spec
        if spec.loss_fn is None:
            if spec.vocab is None:
                raise PartitaError(f"model {spec.name!r} gives no loss_fn and no vocabulary size (neither "
                                   "model.config.vocab_size nor a vocab_size attribute): a model factory returns "
                                   "(module, example_inputs, loss_fn) to train with its loss (loss_fn(module, "
                                   "*batch) -> scalar); without one the runtime trains a token LM (one [batch, seq] "
                                   "integer input -> logits)")
            if spec.seq_len is None:
                raise PartitaError(f"model {spec.name!r} has a vocabulary but no sequence length: the runtime "
                                   "cannot make its token batches")
            self.kind, self.window, self.vocab = "lm", spec.seq_len + 1, spec.vocab
            self.slots: list[tuple[str, Any]] = []
            return
        self.kind = "example"
        template = spec.example_inputs(1)
        template = template if isinstance(template, tuple) else (template,)
        seq, self.slots = spec.seq_len, []
        for t in template:
            if not isinstance(t, torch.Tensor):
                raise PartitaError(f"model {spec.name!r}: example input {type(t).__name__} is not a tensor")
            if not t.dtype.is_floating_point and seq is not None and tuple(t.shape) == (1, seq):
                self.slots.append(("tokens", t.dtype))
            elif not t.dtype.is_floating_point:
                self.slots.append(("ids", (t.dtype, tuple(t.shape[1:]))))
            else:
                self.slots.append(("normal", (t.dtype, tuple(t.shape[1:]))))
        self.window = seq if any(k == "tokens" for k, _ in self.slots) else None
        self.vocab = spec.vocab or _bound(spec, "vocab_size")
        if self.window is not None and self.vocab is None:
            raise PartitaError(f"model {spec.name!r} takes token ids but gives no vocabulary size "
                               "(spec.vocab or config['vocab_size'])")
        self.classes = _bound(spec, "classes") or _bound(spec, "num_labels") or self.vocab
        if any(k == "ids" for k, _ in self.slots) and self.classes is None:
            raise PartitaError(f"model {spec.name!r} takes integer inputs but gives no bound for them")

    def sample(self) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """(shape, dtype) of each tensor of one sample (a batch row): what a dataset must yield (runtime.data.datasets)."""
        if self.kind == "lm":
            return [((self.window - 1,), torch.long), ((self.window - 1,), torch.long)]
        template = self.spec.example_inputs(1)
        return [(tuple(t.shape[1:]), t.dtype) for t in (template if isinstance(template, tuple) else (template,))]

    @property
    def token_only(self) -> bool:
        """Whether every tensor of a batch comes from the token window (so a token file can feed it)."""
        return self.kind == "lm" or (self.window is not None and all(k == "tokens" for k, _ in self.slots))

    def assemble(self, window: torch.Tensor | None, n: int, gen: torch.Generator | None) -> Batch:
        """The batch of `n` samples from token windows [n, self.window] (int64); `gen` draws the rest."""
        if self.kind == "lm":
            return window[:, :-1], window[:, 1:]
        out = []
        for kind, info in self.slots:
            if kind == "tokens":
                out.append(window.to(info))
            elif kind == "ids":
                dtype, shape = info
                out.append(torch.randint(0, self.classes, (n, *shape), generator=gen).to(dtype))
            else:
                dtype, shape = info
                out.append(torch.randn((n, *shape), generator=gen).to(dtype))
        return tuple(out)


class _Source:
    """batch(step): the global batch; shard(step, dp_rank, dp): a data-parallel rank's contiguous slice."""

    layout: Layout
    global_batch: int
    notes: tuple[str, ...] | list[str] = ()
    """Lines the run prints once before training (a dataset's keys it does not use)."""

    def rows(self, step: int, start: int, stop: int) -> Batch:
        raise NotImplementedError

    def batch(self, step: int) -> Batch:
        return self.rows(step, 0, self.global_batch)

    def shard(self, step: int, dp_rank: int, dp: int) -> Batch:
        if self.global_batch % dp:
            raise ValueError(f"global batch {self.global_batch} is not divisible by dp={dp}")
        n = self.global_batch // dp
        return self.rows(step, dp_rank * n, (dp_rank + 1) * n)

    def describe(self) -> dict:
        raise NotImplementedError


def derived_seed(seed: int, k: int, stride: int = 1_000_003) -> int:
    """The seed of the generator for step (or epoch) `k` of a run seeded `seed`: seed x stride + k, modulo 2^64 --
    what torch.manual_seed does with a negative seed, and what keeps any seed it takes (runtime.launcher.inputs.
    SEED_RANGE) in its range (2^64 / stride and above overflowed it in the workers)."""
    return (seed * stride + k) % 2**64


class SyntheticTokens(_Source):
    def __init__(self, spec: ModelSpec, global_batch: int, seed: int = 0):
        self.spec, self.global_batch, self.seed = spec, global_batch, seed
        try:
            self.layout = Layout(spec)
        except PartitaError as e:
            raise ValueError(str(e)) from None

    def rows(self, step: int, start: int, stop: int) -> Batch:
        gen = torch.Generator().manual_seed(derived_seed(self.seed, step))
        lay = self.layout
        if lay.kind == "lm":
            window = self.spec.tokens(self.global_batch, gen)
        else:
            window = (torch.randint(0, lay.vocab, (self.global_batch, lay.window), generator=gen)
                      if lay.window is not None else None)
        full = lay.assemble(window, self.global_batch, gen)
        return tuple(t[start:stop] for t in full)

    def describe(self) -> dict:
        return {"kind": "synthetic", "seed": self.seed}


DTYPES = {"uint16": "<u2", "uint32": "<u4"}


def _text_hint(path: str) -> str:
    """"; it looks like text: ..." when the file's first 4 KiB are printable UTF-8 (a raw token file of ids
    below 65536 almost always holds bytes below 0x20 that are not whitespace), else ""."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
        text = head.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return ""
    if not text or any(ord(c) < 32 and c not in "\t\n\r" for c in text):
        return ""
    return ("; it looks like text: --data takes token ids, so tokenize it first (e.g. the model's tokenizer, "
            "ids saved with numpy.save as a .npy file)")


class TokenFile(_Source):
    """A token file read with numpy memmap (module docstring). Raises PartitaError, one line, for a file
    that is missing, empty, too short for one sample, not 1-D integers, or holds ids beyond the vocabulary."""

    def __init__(self, path: str | os.PathLike, spec: ModelSpec, global_batch: int, seed: int = 0,
                 dtype: str | None = None, check_all: bool = True, hash_content: bool = False):
        self.path, self.spec, self.global_batch, self.seed = str(path), spec, global_batch, seed
        self.sha256: str | None = None
        """The file's content digest (`hash_content`): recorded in checkpoints and compared between nodes."""
        self.layout = Layout(spec)
        if not self.layout.token_only:
            raise PartitaError(f"--data holds token ids, but model {spec.name!r} also takes non-token inputs")
        self.tokens = self._open(dtype)
        self.window = self.layout.window
        if len(self.tokens) < self.window:
            raise PartitaError(f"token file {self.path} holds {len(self.tokens)} tokens; one sample needs "
                               f"{self.window}{_text_hint(self.path)}")
        if check_all:
            self._check_range()
        if hash_content:
            self.sha256 = content_digest(self.path)

    def _open(self, dtype: str | None) -> np.ndarray:
        if os.path.isdir(self.path):
            raise PartitaError(f"--data {self.path} is a directory: give one token file (.npy, or raw "
                               "little-endian uint16/uint32 token ids) or package.module:factory returning a "
                               "dataset (a saved HuggingFace dataset folder: a factory returning "
                               "datasets.load_from_disk(folder))")
        if not os.path.isfile(self.path):
            raise PartitaError(f"token file {self.path} does not exist")
        try:
            if self.path.endswith(".npy"):
                if dtype is not None:
                    raise PartitaError(f"--data-dtype applies to raw token files; {self.path} is .npy "
                                       "(its header gives the dtype)")
                arr = np.load(self.path, mmap_mode="r", allow_pickle=False)
            else:
                if dtype is not None and dtype not in DTYPES:
                    raise PartitaError(f"--data-dtype {dtype!r}; accepted: {', '.join(DTYPES)}")
                np_dtype = np.dtype(DTYPES[dtype or "uint16"])
                size = os.path.getsize(self.path)
                if size == 0 or size % np_dtype.itemsize:
                    raise PartitaError(f"token file {self.path} has {size} bytes, not a whole number of "
                                       f"{dtype or 'uint16'} tokens{_text_hint(self.path)}")
                arr = np.memmap(self.path, dtype=np_dtype, mode="r")
        except PartitaError:
            raise
        except (ValueError, OSError) as e:
            raise PartitaError(f"token file {self.path} cannot be read as a numpy token array: {e}") from None
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise PartitaError(f"token file {self.path} holds a {arr.ndim}-D {arr.dtype} array; "
                               "a 1-D integer token array is needed")
        return arr

    def _check_range(self, chunk: int = 1 << 24) -> None:
        lo, hi = 0, 0
        for i in range(0, len(self.tokens), chunk):
            part = self.tokens[i:i + chunk]
            lo, hi = min(lo, int(part.min())), max(hi, int(part.max()))
        if lo < 0 or hi >= self.layout.vocab:
            raise PartitaError(f"token file {self.path} holds token id {hi if hi >= self.layout.vocab else lo}, "
                               f"outside model {self.spec.name!r}'s vocabulary of {self.layout.vocab}"
                               f"{_text_hint(self.path)}")

    def starts(self, step: int) -> np.ndarray:
        """Start offsets of the global batch's windows at `step`: a function of (seed, step, global batch)."""
        gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed & 0xFFFFFFFF, step])))
        return gen.integers(0, len(self.tokens) - self.window + 1, size=self.global_batch)

    def rows(self, step: int, start: int, stop: int) -> Batch:
        offsets = self.starts(step)[start:stop]
        window = torch.from_numpy(np.stack([np.asarray(self.tokens[o:o + self.window], dtype=np.int64)
                                            for o in offsets]))
        return self.layout.assemble(window, stop - start, None)

    def describe(self) -> dict:
        out = {"kind": "file", "path": os.path.abspath(self.path), "tokens": len(self.tokens),
               "dtype": str(self.tokens.dtype), "seed": self.seed}
        if self.sha256:
            out["sha256"] = self.sha256
        return out


_DIGESTS: dict[tuple, str] = {}


def content_digest(path: str) -> str:
    """SHA-256 of a token file's bytes, computed once per process for a given file (path, size, mtime, inode):
    read in 8 MiB chunks, about a second per GB. The ranks that need it compute it (runtime.loop.session.prepare:
    one rank per node) -- a token file swapped for another of the same size changes it."""
    import hashlib
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ino)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                while block := f.read(8 * 2**20):
                    h.update(block)
        except OSError as e:
            raise PartitaError(f"token file {path} cannot be read: {e.strerror or e}") from None
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def make_data(spec: ModelSpec, global_batch: int, seed: int = 0, path=None,
              dtype: str | None = None, check_all: bool = True, hash_content: bool = False) -> _Source:
    """The run's data source: `path` a token file, a `package.module:factory` of a dataset, or a map-style or
    iterable dataset itself (runtime.data.datasets); else synthetic data for the model. `hash_content`: a
    token file's content digest is computed (`content_digest`) and `describe()` includes it."""
    from partita.runtime.data import datasets  # it builds on _Source, defined here
    if path is not None and (not isinstance(path, (str, os.PathLike)) or datasets.is_factory(str(path))):
        if dtype is not None:
            raise PartitaError("--data-dtype applies to token files, not to a dataset")
        name = str(path) if isinstance(path, (str, os.PathLike)) else type(path).__name__
        dataset = datasets.load(name) if isinstance(path, (str, os.PathLike)) else path
        if datasets.kind(dataset) is None:
            raise PartitaError(f"the dataset given is of type {datasets.refusal(dataset)}")
        return datasets.DatasetSource(dataset, name, Layout(spec), global_batch, seed)
    if path is not None:
        return TokenFile(path, spec, global_batch, seed, dtype, check_all, hash_content)
    if dtype is not None:
        raise PartitaError("--data-dtype needs --data")
    try:
        return SyntheticTokens(spec, global_batch, seed)
    except ValueError as e:
        raise PartitaError(str(e)) from None

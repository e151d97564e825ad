"""TorchRec models: a KeyedJaggedTensor input and EmbeddingBagCollection tables, seen as partita sees any model.

A TorchRec user's factory returns a model whose sparse part is an `EmbeddingBagCollection` (EBC) and example
inputs holding a `KeyedJaggedTensor` (KJT): per feature (key), the IDs of every sample, jagged. partita's
capture, data and runtime take tensors with a leading batch dimension, so the factory's model is planned and
run behind `KJTModel`, which takes each KJT as one ID tensor and rebuilds the KJT inside:

    ids (batch, L_1 + ... + L_F)  ->  KeyedJaggedTensor(keys, values, lengths: L_k IDs per sample of key k)

L_k, the IDs per sample of feature k, is read from the example KJT without its values: the factory is probed on
the meta device, where TorchRec spreads the IDs evenly over the keys (`length_per_key` of a meta KJT), so in
practice every L_k is the mean IDs per sample and feature, rounded to a whole number of at least one. It is the
fixed pooling factor the plan is priced at, as the DLRM preset's (batch, tables, pooling) IDs are; `--pooling`
and `--data` state the data's own.

The tables are the EBC's `nn.EmbeddingBag`s (TorchRec builds one per `EmbeddingBagConfig`), found by
costmodel.sparse.embeddings.find_tables with the EBC's path and the config's name and features: a table read by two
features is looked up by both. For the dense part's capture the whole EBC becomes `PooledCollection`, a
parameter-free fx leaf that returns the `KeyedTensor` of zeros the EBC would return, so its Python (KJT
dictionaries, inverse indices) is never traced.

torchrec is never imported here: the types are recognised by name, and `KJTModel` imports it when it runs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from partita.costmodel.errors import PartitaError

KJT_PREFIX = "model."
"""The FQN prefix KJTModel adds to the user's modules (find_tables strips it from table names)."""


def _is(obj, name: str) -> bool:
    return type(obj).__name__ == name and type(obj).__module__.startswith("torchrec.")


def is_kjt(x) -> bool:
    return _is(x, "KeyedJaggedTensor")


def is_ebc(m: nn.Module) -> bool:
    return _is(m, "EmbeddingBagCollection")


@dataclass(frozen=True)
class Features:
    """The layout of one KJT input: its keys and the IDs per sample of each."""

    keys: tuple[str, ...]
    pooling: tuple[int, ...]

    @property
    def width(self) -> int:
        return sum(self.pooling)


def features_of(kjt, spec: str) -> Features:
    """The example KJT's keys and IDs per sample (module docstring); weighted or variable-batch KJTs are refused."""
    keys = tuple(kjt.keys())
    if not keys:
        raise PartitaError(f"model factory {spec!r}: its KeyedJaggedTensor input has no keys")
    if kjt.weights_or_none() is not None:
        raise PartitaError(f"model factory {spec!r}: a weighted KeyedJaggedTensor (per-ID weights) is not planned yet; "
                           "give the example input without weights")
    if kjt.variable_stride_per_key():
        raise PartitaError(f"model factory {spec!r}: a KeyedJaggedTensor with a batch size per key is not planned; "
                           "give every key the same batch")
    batch = kjt.stride()
    known = getattr(kjt, "_length_per_key", None)
    if known is not None and len(known) == len(keys) and batch:
        means = [n / batch for n in known]
    else:
        n = kjt.values().numel()
        samples = kjt.lengths().numel() if kjt.lengths_or_none() is not None else batch * len(keys)
        means = [n / max(1, samples)] * len(keys)
    return Features(keys=keys, pooling=tuple(max(1, round(m)) for m in means))


class KJTFromIds(nn.Module):
    """(batch, L_1 + ... + L_F) IDs -> the KeyedJaggedTensor of `features` (an fx leaf: capture does not trace it)."""

    fx_leaf = True

    def __init__(self, features: Features):
        super().__init__()
        self.features = features

    def forward(self, ids: torch.Tensor):
        from torchrec import KeyedJaggedTensor
        f = self.features
        batch = ids.shape[0]
        parts = ids.split(list(f.pooling), dim=1)
        lengths = torch.cat([torch.full((batch,), p, dtype=torch.int32, device=ids.device) for p in f.pooling])
        per_key = [batch * p for p in f.pooling]
        offsets = [0]
        for n in per_key:
            offsets.append(offsets[-1] + n)
        return KeyedJaggedTensor(keys=list(f.keys), values=torch.cat([p.reshape(-1) for p in parts]),
                                 lengths=lengths, stride=batch, length_per_key=per_key, offset_per_key=offsets)


class KJTModel(nn.Module):
    """The user's model, its KJT inputs (at `positions`) taken as ID tensors. forward has fixed arity: fx
    cannot trace *args."""

    def __init__(self, model: nn.Module, layouts: dict[int, Features]):
        super().__init__()
        self.model = model
        self.n = max(layouts) + 1
        self.to_kjt = nn.ModuleDict({str(i): KJTFromIds(f) for i, f in layouts.items()})

    def forward(self, x0, x1=None, x2=None, x3=None, x4=None, x5=None):
        xs = [x0, x1, x2, x3, x4, x5]
        for i, conv in self.to_kjt.items():
            xs[int(i)] = conv(xs[int(i)])
        return self.model(*[x for x in xs if x is not None])


class PooledCollection(nn.Module):
    """What an EBC returns -- a KeyedTensor of one pooled vector per sample and embedding name -- without its
    tables: zeros, so the dense part is captured without them (an fx leaf)."""

    fx_leaf = True

    def __init__(self, names: list[str], dims: list[int]):
        super().__init__()
        self.names, self.dims = names, dims
        self.dtype = torch.get_default_dtype()  # the training dtype where capture builds the model

    def forward(self, features):
        from torchrec import KeyedTensor
        values = features.values().new_zeros((features.stride(), sum(self.dims)), dtype=self.dtype)
        return KeyedTensor(keys=list(self.names), length_per_key=list(self.dims), values=values)


def pooled_stand_in(ebc: nn.Module) -> PooledCollection:
    return PooledCollection(list(ebc._embedding_names), list(ebc._lengths_per_embedding))


def adapt(model_factory, inputs: tuple, spec: str):
    """(build, example inputs with each KJT as an ID tensor, per-table pooling) of a factory whose example
    inputs hold KJTs; the inputs are probed ones (meta or fake), only their shapes are read."""
    if len(inputs) > 6:
        raise PartitaError(f"model factory {spec!r}: example inputs must be 1 to 6 tensors or KeyedJaggedTensors")
    layouts = {i: features_of(x, spec) for i, x in enumerate(inputs) if is_kjt(x)}
    batch = next((x.stride() for x in inputs if is_kjt(x)), 1)
    shapes = [((layouts[i].width,), torch.long) if i in layouts else (tuple(x.shape[1:]), x.dtype)
              for i, x in enumerate(inputs)]
    for i, x in enumerate(inputs):
        if i not in layouts and not (isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[0] == batch):
            raise PartitaError(f"model factory {spec!r}: example input {i} must be a tensor with the KJT's batch "
                               f"({batch}) as its leading dimension, or a KeyedJaggedTensor")
    pooling = {k: p for f in layouts.values() for k, p in zip(f.keys, f.pooling)}
    return (lambda: KJTModel(model_factory(), layouts)), shapes, pooling


def collection_tables(module: nn.Module) -> dict[str, dict]:
    """{table name (costmodel.sparse.embeddings.Table.name): its collection, config name and features} for the tables
    of every EBC in `module`."""
    strip = len(KJT_PREFIX) if isinstance(module, KJTModel) else 0
    out = {}
    for fqn, m in module.named_modules():
        if is_ebc(m):
            if m.is_weighted():
                raise PartitaError(f"{fqn[strip:] or 'the model'} is a weighted EmbeddingBagCollection (per-ID "
                                   "weights), which is not planned yet")
            for cfg in m.embedding_bag_configs():
                name = f"{fqn}.embedding_bags.{cfg.name}" if fqn else f"embedding_bags.{cfg.name}"
                out[name[strip:]] = {"collection": fqn[strip:], "key": cfg.name,
                                     "features": tuple(cfg.feature_names)}
    return out

"""Built-in model presets and the MODEL strings of DESIGN.md.

`resolve_model("gpt3-175b")`, `resolve_model("gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1000")`,
`resolve_model("llama:layers=..,hidden=..,ffn=..,heads=..,kv_heads=..,vocab=..")` (every GPTConfig field is
a key: layers, hidden, heads, vocab, seq, ffn, kv_heads, attention=sdpa|math, dropout, and experts, top_k
for a mixture of experts), or an import path
`package.module:factory` (a callable returning `(module, example_inputs)` or `(module, example_inputs,
loss_fn)`; `_import_factory`), HuggingFace models built from
their config classes (`hf:gpt2`, `hf:llama:num_hidden_layers=4,hidden_size=256`, classifiers `hf:bert-cls`,
`hf:vit`; models/hf.py) and
ResNet-style CNNs (`tiny-resnet`, `resnet50`, `resnet:depth=..`; models/cnn.py), each give a `ModelSpec`: a
way to build the module (on any device, including fake/meta), an example batch, and how to capture it.
"""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn

from partita.costmodel.errors import PartitaError, did_you_mean
from partita.costmodel.sparse.kjt import adapt, is_kjt
from partita.costmodel.models.gpt import GPT, GPTConfig

from partita.costmodel.models.configs import PRESETS  # noqa: E402 (the presets, torch-free)
from partita.costmodel.models.configs import FAMILY_KEYS as _FAMILY_KEYS, parse_family


@dataclass(kw_only=True)
class ModelSpec:
    """A model the planner can capture and the runtime can build."""

    name: str
    build: Callable[[], nn.Module]
    """Builds the module on the current default device (use `torch.device("meta")` or fake mode to avoid memory)."""
    example_inputs: Callable[[int], tuple]
    """example_inputs(batch) -> tuple of input tensors for forward."""
    seq_len: int | None = None
    config: dict[str, Any] = field(default_factory=dict)
    layer_prefix: str | None = None
    """FQN prefix of the repeated layers (e.g. "blocks"), when known; otherwise found from the graph."""
    vocab: int | None = None
    capture: str = "auto"
    """How costmodel.capture.trace captures it: "fx" (torch.fx.symbolic_trace), "export" (torch.export, e.g. for
    HuggingFace models), or "auto" (symbolic_trace, then torch.export if that fails)."""
    loss_fn: Callable[..., torch.Tensor] | None = None
    """loss_fn(model, *example_inputs) -> scalar loss, captured with the model. None: token cross-entropy
    over the logits when `vocab` is set (targets = zeros of the inputs' shape), else the bare forward."""
    at_seq: Callable[[int], "ModelSpec"] | None = None
    """The same model at another sequence length, for families whose `config` is not a GPTConfig."""
    at_depth: Callable[[int], "ModelSpec"] | None = None
    """The same model with n layers under `layer_prefix`: capture records a deep stack from a 3-layer copy
    (costmodel.capture.replicate), 30x fewer nodes to run for a 100-layer model."""
    input_names: tuple[str, ...] | None = None
    """The name of each example input, in order: the keyword the model takes it by (an `hf:` model's input_ids
    and labels). None: `named_inputs` reads them from `loss_fn`'s parameters."""

    def named_inputs(self) -> tuple[str, ...] | None:
        """The names of the example inputs, in order: `input_names`, else the parameters `loss_fn(module, a, b)`
        names after the module (`images`, `labels`); None when neither names them (no loss_fn: a token LM; or a
        loss taking `*batch`). A dataset's dict samples are matched to these by key (runtime.data.datasets)."""
        if self.input_names is not None:
            return tuple(self.input_names)
        if self.loss_fn is None:
            return None
        template = self.example_inputs(1)
        count = len(template) if isinstance(template, tuple) else 1
        return _positional_names(self.loss_fn, 1 + count)[1:] or None

    def tokens(self, batch: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """A batch of token ids of shape (batch, seq_len + 1): inputs are [:, :-1], targets [:, 1:]."""
        assert self.vocab is not None and self.seq_len is not None
        return torch.randint(0, self.vocab, (batch, self.seq_len + 1), generator=generator)


def _positional_names(fn: Callable, count: int) -> tuple[str, ...]:
    """The names of `fn`'s first `count` positional parameters; () when it has fewer, takes `*args` before
    them, or has no signature Python can read."""
    import inspect
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return ()
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = []
    for p in params[:count]:
        if p.kind not in positional:
            return ()
        names.append(p.name)
    return tuple(names) if len(names) == count else ()


def gpt_spec(name: str, cfg: GPTConfig) -> ModelSpec:
    return ModelSpec(
        name=name,
        build=lambda: GPT(cfg),
        example_inputs=lambda batch: (torch.zeros(batch, cfg.seq, dtype=torch.long),),
        seq_len=cfg.seq,
        config=cfg.as_dict(),
        layer_prefix="blocks",
        vocab=cfg.vocab,
        capture="fx",
        at_depth=lambda n: gpt_spec(name, dataclasses.replace(cfg, layers=n)),
    )


def _parse_family(spec: str) -> ModelSpec:
    """`gpt:key=value,...` or `llama:...` (configs.parse_family)."""
    return gpt_spec(spec, parse_family(spec))


def _import_factory(spec: str) -> ModelSpec:
    """`package.module:factory`: a callable returning `(module, example_inputs)` or `(module, example_inputs,
    loss_fn)`, the example inputs with a leading batch dimension.

    Planning never allocates the model: the factory is probed (for the inputs' shapes and dtypes) on the
    meta device, or under FakeTensorMode if its code reads tensor values, and capture builds it the same
    way (costmodel.capture.trace.build_fake). Only `build()` outside those modes -- the runtime -- makes real
    parameters. Example inputs are zeros of the probed shapes and dtypes (values do not change costs).

    With a `loss_fn(module, *batch) -> scalar loss` (e.g. images and labels -> cross-entropy), the model
    is planned and trained with that loss over batches shaped like the example inputs (runtime.data);
    integer inputs other than tokens (class labels) are drawn below `_label_bound` in synthetic batches.
    Example inputs may hold TorchRec KeyedJaggedTensors (a model with an EmbeddingBagCollection): the model
    is then planned and run behind costmodel.sparse.kjt.KJTModel, which takes each as one ID tensor.
    Without one, a token model -- one integer input [batch, seq] and a vocabulary (`_token_vocab`) -- gets
    `vocab` and `seq_len`, so it is planned and trained as the presets are: token cross-entropy over its
    logits.
    """
    import os
    import sys
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:  # as `python -m` would: a user's module in the working directory
        sys.path.insert(0, os.getcwd())
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise PartitaError(f"cannot import model factory {spec!r}: {e}") from None
    return factory_spec(factory, spec)


def factory_spec(factory: Callable, spec: str, probe=None) -> ModelSpec:
    """The ModelSpec of a model factory (`_import_factory`'s contract), named `spec`; `probe`: its result on the
    meta device when the caller has it already. `partita.plan` and `partita.run` take such a factory as it is."""
    probe = _probe_without_memory(factory, spec) if probe is None else probe
    if not (isinstance(probe, tuple) and len(probe) in (2, 3) and isinstance(probe[0], nn.Module)
            and (len(probe) == 2 or callable(probe[2]))):
        raise PartitaError(f"model factory {spec!r} must return (nn.Module, example_inputs tuple) or (nn.Module, "
                           "example_inputs tuple, loss_fn), loss_fn(module, *example_inputs) -> scalar loss")
    inputs = probe[1] if isinstance(probe[1], tuple) else (probe[1],)
    build, extra_config = (lambda: original_module(factory()[0])), {}
    if any(is_kjt(t) for t in inputs):  # a TorchRec model: each KeyedJaggedTensor becomes an ID tensor
        build, sample, pooling = adapt(build, inputs, spec)
        extra_config = {"kjt_pooling": pooling}
    elif not all(isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] >= 1 for t in inputs):
        raise PartitaError(f"model factory {spec!r}: example inputs must be tensors with a leading batch dimension "
                           "(or TorchRec KeyedJaggedTensors)")
    else:
        sample = tuple((tuple(t.shape[1:]), t.dtype) for t in inputs)  # one sample; the planner scales per sample
    if len(probe) == 3:
        loss_fn, extra = probe[2], {"config": {"classes": bound} if (bound := _label_bound(probe[0])) else {}}
    else:
        vocab, loss_fn = _token_vocab(probe[0]), None
        extra = (dict(vocab=vocab, seq_len=sample[0][0][0]) if vocab is not None and len(sample) == 1
                 and len(sample[0][0]) == 1 and not sample[0][1].is_floating_point else {})
    del probe, inputs

    def example_inputs(batch: int):
        return tuple(torch.zeros(batch, *shape, dtype=dtype) for shape, dtype in sample)

    if extra_config:
        extra["config"] = {**extra.get("config", {}), **extra_config}
    return ModelSpec(name=spec, build=build, example_inputs=example_inputs, loss_fn=loss_fn, **extra)


def original_module(module: nn.Module) -> nn.Module:
    """The module a torch.compile'd one wraps (OptimizedModule._orig_mod), else `module`. A factory may return
    `torch.compile(model)`: partita plans and runs the model itself, under its own names (not `_orig_mod.*`),
    and compiles each layer where the plan's kernels are "compiled" (`--kernels compiled`). torch._dynamo is
    only looked at if the factory imported it: a compiled module cannot exist without it."""
    import sys
    dynamo = sys.modules.get("torch._dynamo.eval_frame")
    if dynamo is not None and isinstance(module, dynamo.OptimizedModule):
        return module._orig_mod
    return module


def _label_bound(module: nn.Module) -> int | None:
    """How many classes a model with its own loss predicts, to draw synthetic labels below: a `num_classes`
    attribute, `config.num_labels`, else the out_features of its last nn.Linear (the classifier head)."""
    config = getattr(module, "config", None)
    for value in (getattr(module, "num_classes", None), getattr(config, "num_labels", None)):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
    return linears[-1].out_features if linears else None


def _token_vocab(module: nn.Module) -> int | None:
    """The vocabulary of a module that maps token ids to logits: `module.config.vocab_size` or a `vocab_size`
    attribute. None for a module whose config says it returns a dict-like output (HuggingFace's
    `return_dict`), whose logits are not its output."""
    config = getattr(module, "config", None)
    if getattr(config, "return_dict", False):
        return None
    for value in (getattr(config, "vocab_size", None), getattr(module, "vocab_size", None)):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _probe_without_memory(factory: Callable, spec: str):
    """factory() on the meta device; if its code needs tensor values, under FakeTensorMode."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    try:
        with torch.device("meta"):
            return factory()
    except PartitaError:
        raise
    except Exception as meta_error:  # noqa: BLE001 -- e.g. `.item()` of a meta tensor: fake tensors allow more
        try:
            with FakeTensorMode(allow_non_fake_inputs=True):
                return factory()
        except Exception as e:  # noqa: BLE001 -- the user's code
            first = (lambda x: f"{type(x).__name__}: {(str(x).strip().splitlines() or [''])[0][:200]}")
            raise PartitaError(f"model factory {spec!r} fails when called without allocating memory (meta device: "
                               f"{first(meta_error)}; fake tensors: {first(e)}); build the module from shapes "
                               "and config, not from tensor values") from None


def resolve_model(spec: str, *, imports: bool = True) -> ModelSpec:
    """Turn a MODEL string into a ModelSpec, or raise PartitaError saying what is accepted. `imports=False`:
    only partita's own models and HuggingFace's built-in configurations, never `package.module:factory` (a
    name from a plan file, which must not choose code to run)."""
    if not isinstance(spec, str):
        raise PartitaError(f"a MODEL is a string, got {type(spec).__name__}")
    if spec in PRESETS:
        return gpt_spec(spec, PRESETS[spec])
    family = spec.partition(":")[0]
    if family in _FAMILY_KEYS and ":" in spec:
        return _parse_family(spec)
    if spec.startswith("hf:"):
        from partita.costmodel.models.hf import hf_spec  # imports transformers: only when asked for
        return hf_spec(spec)
    from partita.costmodel.models import dlrm  # late: dlrm.py builds ModelSpecs
    if spec in dlrm.PRESETS:
        return dlrm.dlrm_spec(spec, dlrm.PRESETS[spec])
    if spec.startswith("dlrm:"):
        return dlrm.parse_dlrm(spec)
    from partita.costmodel.models.cnn import CNN_PRESETS, cnn_spec  # late: cnn.py builds ModelSpecs
    if spec in CNN_PRESETS or spec.startswith("resnet:"):
        return cnn_spec(spec)
    if ":" in spec:
        if not imports:
            raise PartitaError(f"model {spec!r} is an import path; it is not imported here")
        return _import_factory(spec)
    near = did_you_mean(spec, [*PRESETS, *CNN_PRESETS, *dlrm.PRESETS])
    raise PartitaError(f"unknown model {spec!r}{near}; presets: {', '.join(sorted(PRESETS))}, "
                       f"{', '.join(sorted(CNN_PRESETS))}; or gpt:layers=..,hidden=..,heads=..,seq=..,vocab=.."
                       "[,ffn=..,kv_heads=..,attention=sdpa|math,dropout=..], llama:... (the same keys), "
                       "llama:...,experts=..,top_k=.. (a mixture of experts), "
                       "resnet:depth=..,width=..,image=..,classes=.., dlrm-criteo-1tb, dlrm:tables=..,rows=..[,dim=..,bottom=..,top=..], "
                       "hf:FAMILY[-cls][:key=value,...] (any transformers model type: gpt2, llama, mistral, mixtral, "
                       "qwen2, bert, t5, ...; -cls its classification head: bert-cls, vit; dual encoders: clip, siglip), "
                       "or package.module:factory")


def describe_presets() -> list[tuple[str, GPTConfig]]:
    return sorted(PRESETS.items(), key=lambda kv: kv[0])


def with_seq(spec: ModelSpec, seq: int | None) -> ModelSpec:
    """The same model at another sequence length (presets and gpt:/llama: families only)."""
    if seq is None or seq == spec.seq_len:
        return spec
    if seq <= 0:
        raise PartitaError(f"--seq must be positive, got {seq}")
    if spec.at_seq is not None:
        return spec.at_seq(seq)
    if not spec.config or spec.seq_len is None:
        raise PartitaError(f"model {spec.name!r} has a fixed input shape; drop --seq")
    cfg = GPTConfig(**{**spec.config, "seq": seq})
    return gpt_spec(spec.name, cfg)

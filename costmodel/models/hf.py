"""HuggingFace transformers models built from their config classes (no downloads): `hf:` MODEL strings.

    hf:gpt2                                       GPT2LMHeadModel, small defaults
    hf:llama:num_hidden_layers=4,hidden_size=256  LlamaForCausalLM with overrides
    hf:bert  /  hf:t5                             BertForMaskedLM / T5ForConditionalGeneration

Overrides are attributes of the config class (`GPT2Config`, `LlamaConfig`, `BertConfig`, `T5Config`),
parsed as int, float, bool (true/false) or none, else kept as strings; plus `seq`, the tokens per sample.
Defaults are small, so captures and tests are fast: 2 layers, hidden 128, 4 heads, vocabulary 1024,
64 tokens. `use_cache` is always off (training). Dropout is off unless overridden (as in our own presets
and Llama's defaults; on CPU a dropout inside attention would also switch SDPA to its math kernel, which
materialises the s x s scores that GPU flash kernels never store). Position tables grow to `seq` when it
exceeds them. Tied input/output embeddings keep each model's HF default (GPT-2, BERT, T5 tie; Llama
does not); a tied weight is counted once, at its first use.

Loss and example batch (`example_inputs(batch)` = (input_ids, labels), both [batch, seq], token ids):

- causal LMs (gpt2, llama): labels = the inputs; the model shifts them and takes the mean next-token
  cross-entropy (HF's `ForCausalLMLoss`).
- bert: masked-LM cross-entropy over the vocabulary at every position (BertForMaskedLM with labels).
  A real MLM batch labels ~15% of positions (-100 elsewhere); the logits, FLOPs and saved log-softmax
  are those of all positions either way, so costs do not depend on the masking rate. No attention mask:
  the batch is unpadded, so SDPA runs unmasked as in eager training.
- t5: sequence-to-sequence LM cross-entropy; the decoder input is the labels shifted right (HF's
  `_shift_right`), so the decoder sees `seq` tokens too.

These models are captured with torch.export (costmodel.export_capture): symbolic_trace cannot follow
their control flow. `export_context()` makes the trace follow the path eager training takes on such a
batch (see its docstring).
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch
import torch.nn as nn

from costmodel.errors import PartitaError


@dataclass(frozen=True)
class _Arch:
    config: str
    model: str
    task: str                       # "causal" | "mlm" | "seq2seq"
    positions: str | None           # config attribute holding the position-table size
    defaults: dict[str, Any] = field(default_factory=dict)


_ARCHS: dict[str, _Arch] = {
    "gpt2": _Arch("GPT2Config", "GPT2LMHeadModel", "causal", "n_positions", dict(
        n_layer=2, n_embd=128, n_head=4, vocab_size=1024, n_positions=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)),
    "llama": _Arch("LlamaConfig", "LlamaForCausalLM", "causal", "max_position_embeddings", dict(
        num_hidden_layers=2, hidden_size=128, intermediate_size=352, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=1024, max_position_embeddings=64)),
    "bert": _Arch("BertConfig", "BertForMaskedLM", "mlm", "max_position_embeddings", dict(
        num_hidden_layers=2, hidden_size=128, intermediate_size=512, num_attention_heads=4, vocab_size=1024,
        max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)),
    "t5": _Arch("T5Config", "T5ForConditionalGeneration", "seq2seq", None, dict(
        num_layers=2, d_model=128, d_ff=512, num_heads=4, d_kv=32, vocab_size=1024,
        dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)),
}
_LOSS_TYPE = {"causal": "ForCausalLM", "mlm": "ForMaskedLM", "seq2seq": "ForConditionalGeneration"}
DEFAULT_SEQ = 64


def _transformers():
    try:
        import transformers
    except ImportError:
        raise PartitaError("hf: models need the transformers package: pip install 'partita[hf]'") from None
    return transformers


def _value(text: str):
    t = text.strip()
    if t.lower() in ("true", "false"):
        return t.lower() == "true"
    if t.lower() == "none":
        return None
    for cast in (int, float):
        try:
            return cast(t)
        except ValueError:
            pass
    return t


def parse(spec: str) -> tuple[str, dict[str, Any]]:
    """'hf:llama:num_hidden_layers=4,hidden_size=256' -> ('llama', {'num_hidden_layers': 4, ...})."""
    _, _, rest = spec.partition(":")
    arch, _, items = rest.partition(":")
    if arch not in _ARCHS:
        raise PartitaError(f"unknown HuggingFace model {spec!r}; accepted: "
                           f"{', '.join('hf:' + a for a in _ARCHS)}, with optional :key=value,... overrides")
    overrides: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in items.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise PartitaError(f"bad model parameter {item!r} in {spec!r}: use key=value, "
                               f"e.g. hf:{arch}:{next(iter(_ARCHS[arch].defaults))}=4")
        overrides[key.strip()] = _value(value)
    return arch, overrides


def _config(arch: str, overrides: dict[str, Any], spec: str):
    tf = _transformers()
    a = _ARCHS[arch]
    cls = getattr(tf, a.config)
    kw = {k: v for k, v in overrides.items() if k != "seq"}
    probe = cls()
    unknown = sorted(k for k in kw if not hasattr(probe, k))
    if unknown:
        raise PartitaError(f"model {spec!r}: {a.config} has no attribute {', '.join(map(repr, unknown))}; "
                           f"e.g. {', '.join(sorted(a.defaults))}")
    if kw.get("use_cache"):
        raise PartitaError(f"model {spec!r}: use_cache must stay false (training captures no KV cache)")
    seq = overrides.get("seq", DEFAULT_SEQ)
    if not isinstance(seq, int) or seq <= 1:
        raise PartitaError(f"model {spec!r}: seq must be an integer > 1, got {seq!r}")
    merged = {**a.defaults, **kw, "use_cache": False}
    if a.positions is not None:
        if a.positions in kw and kw[a.positions] < seq:
            raise PartitaError(f"model {spec!r}: seq={seq} exceeds {a.positions}={kw[a.positions]}")
        merged[a.positions] = max(merged[a.positions], seq)
    vocab = merged["vocab_size"]
    for tok in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
        default = merged.get(tok, getattr(probe, tok, None))
        if tok not in kw and isinstance(default, int) and default >= vocab:
            merged[tok] = vocab - 1  # GPT-2's 50256 would fall outside a small vocabulary
    try:
        cfg = cls(**merged)
    except (ValueError, TypeError) as e:
        raise PartitaError(f"model {spec!r}: {a.config}: {e}") from None
    cfg._attn_implementation = "sdpa"
    return cfg, seq


def hf_loss(names: tuple[str, ...], model: nn.Module, *inputs: torch.Tensor) -> torch.Tensor:
    """The HF model's own loss for keyword inputs `names` (the ModelSpec's loss_fn)."""
    return model(**dict(zip(names, inputs))).loss


def hf_spec(spec: str, seq: int | None = None):
    """A ModelSpec for an `hf:` MODEL string (see the module docstring)."""
    from costmodel.models import ModelSpec

    arch, overrides = parse(spec)
    if seq is not None:
        overrides = {**overrides, "seq": seq}
    cfg, seq = _config(arch, overrides, spec)
    a = _ARCHS[arch]
    model_cls = getattr(_transformers(), a.model)
    loss_type = _LOSS_TYPE[a.task]

    def build() -> nn.Module:
        model = model_cls(cfg)
        model.loss_type = loss_type
        return model

    def example_inputs(batch: int):
        ids = torch.zeros(batch, seq, dtype=torch.long)
        return ids, ids.clone()

    sizes = {k: getattr(cfg, k) for k in sorted(a.defaults) if isinstance(getattr(cfg, k, None), (int, float))}
    return ModelSpec(
        name=spec, build=build, example_inputs=example_inputs, seq_len=seq,
        config={"family": "hf", "arch": arch, "model": a.model, "task": a.task, "seq": seq,
                "overrides": {k: v for k, v in overrides.items() if k != "seq"}, **sizes},
        capture="export", loss_fn=functools.partial(hf_loss, ("input_ids", "labels")),
        at_seq=lambda s: hf_spec(spec, seq=s),
    )


def is_hf_model(model: nn.Module) -> bool:
    return any(c.__module__.startswith("transformers.") for c in type(model).__mro__)


@contextlib.contextmanager
def export_context():
    """Trace what eager training runs on an unpadded, unpacked batch.

    Eager HF code inspects tensor values to skip building attention masks (no padding: SDPA's is_causal
    flag; positions 0..s-1: not a packed batch). Under torch.export and fake tensors it cannot read values,
    so it materialises an [s, s] mask, which sends SDPA to a masked kernel that saves the mask, and, for
    grouped-query attention, replaces SDPA's `enable_gqa` by copies of K and V (`repeat_kv`). Both change
    the saved bytes and hide the head structure. Here the mask helpers answer as they do in eager mode
    for such a batch. Only attributes that exist are patched, so a transformers release without them
    still captures, just with its traced masks.
    """
    try:
        import transformers.masking_utils as mu
    except ImportError:
        yield
        return
    with contextlib.ExitStack() as stack:
        if hasattr(mu, "is_torchdynamo_exporting"):
            stack.enter_context(mock.patch.object(mu, "is_torchdynamo_exporting", lambda: False))
        if hasattr(mu, "find_packed_sequence_indices"):
            stack.enter_context(mock.patch.object(mu, "find_packed_sequence_indices", lambda *a, **k: None))
        yield

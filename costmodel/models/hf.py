"""HuggingFace transformers models built from their config classes (no downloads): `hf:` MODEL strings.

    hf:gpt2                                       GPT2LMHeadModel, small defaults
    hf:llama:num_hidden_layers=4,hidden_size=256  LlamaForCausalLM with overrides
    hf:bert  /  hf:t5                             BertForMaskedLM / T5ForConditionalGeneration
    hf:bert-cls[:num_labels=5]                    BertForSequenceClassification (2 labels unless overridden)
    hf:vit[:image_size=64,num_labels=100]         ViTForImageClassification (32 x 32 images, 10 labels); = hf:vit-cls
    hf:clip  /  hf:siglip                         CLIPModel / SiglipModel on their contrastive loss (models.hf_dual)
    hf:mistral, hf:mixtral, hf:qwen2, hf:phi3 ... any transformers model type, at its config's defaults
    hf:roberta-cls, hf:deit-cls, hf:llama-cls:pad_token_id=0 ...   any model type's classification head

The grammar is `hf:FAMILY[-TASK][:key=value,...]`. TASK is optional; the one task is `cls`, the model type's
classification head: its sequence-classification head (AutoModelForSequenceClassification) if it has one, else
its image-classification head (AutoModelForImageClassification), at the family's small defaults where it has
them (hf:bert-cls, hf:llama-cls). A misspelt task or model type is one line with the nearest name ("did you mean").

Overrides are attributes of the config class (`GPT2Config`, `LlamaConfig`, `BertConfig`, `T5Config`),
parsed as int, float, bool (true/false) or none, else kept as strings; plus `seq`, the tokens per sample.
For gpt2, llama, bert, t5, vit and the text encoder-decoders (hf:bart ...) the defaults are small, so captures and
tests are fast: 2 layers, hidden 128, 4 heads, vocabulary 1024, 64 tokens (vit: 32 x 32 images in 8 x 8 patches,
10 labels). Any other model type transformers knows (`hf:FAMILY`, FAMILY as in `AutoConfig.for_model`) is built
from `AutoConfig.for_model(FAMILY, **overrides)` at that config's own defaults (`hf:mixtral` is Mixtral-8x7B;
planning captures on fake tensors, so its size costs no memory), with the first head transformers has for it:
sequence-to-sequence LM (AutoModelForSeq2SeqLM, the whole encoder-decoder), else causal LM, else masked LM (a
model type with none of them, e.g. DINOv2, is one line naming its `-cls` head if it has one). A config that
rejects the overrides, an override the config does not have, or a special token id outside the vocabulary is
one PartitaError line naming the key; a default special token id outside an overridden (smaller) vocabulary
becomes its last id.

Attention runs as SDPA (fused) where the model class supports it, else eager (`attention_implementation`):
Gemma-2 (logit soft-capping) and BLOOM (ALiBi) refuse SDPA. Mamba has no attention; its selective scan is
captured and priced as transformers' PyTorch path (a loop over the sequence of elementwise ops), which is
what runs without the mamba-ssm CUDA kernels (with them the fused scan is faster than priced).

`use_cache` is always off (training). For the five small families dropout is off unless overridden (as in
our own presets and Llama's defaults; on CPU a dropout inside attention would also switch SDPA to its math
kernel, which materialises the s x s scores that GPU flash kernels never store); other families keep their
config's dropout. Position tables grow to `seq` when it
exceeds them. Tied input/output embeddings keep each model's HF default (GPT-2, BERT, T5 tie; Llama
does not); a tied weight is counted once, at its first use.

Loss and example batch (`example_inputs(batch)` = (input_ids, labels), both [batch, seq], token ids, unless said):

- causal LMs (gpt2, llama, mistral, mixtral, ...): labels = the inputs; the model shifts them and takes the
  mean next-token cross-entropy (HF's `ForCausalLMLoss`).
- bert: masked-LM cross-entropy over the vocabulary at every position (BertForMaskedLM with labels).
  A real MLM batch labels ~15% of positions (-100 elsewhere); the logits, FLOPs and saved log-softmax
  are those of all positions either way, so costs do not depend on the masking rate. No attention mask:
  the batch is unpadded, so SDPA runs unmasked as in eager training.
- t5 and the text encoder-decoders (hf:bart, mbart, marian, pegasus, blenderbot, plbart, mvp, bigbird_pegasus ...:
  planned whole, small defaults in costmodel.models.hf_seq2seq): sequence-to-sequence LM cross-entropy; the
  decoder input is the labels shifted right (HF's `_shift_right`), so the decoder sees `seq` tokens too. A
  model type with both heads trains its seq2seq head, never its decoder alone (whose cross-attention would
  stay idle).
- classifiers (`-cls`, hf:vit): cross-entropy of one class label per sample over `num_labels` >= 2 classes (HF's
  problem_type "single_label_classification", set in the config): (input_ids [batch, seq], labels [batch]) for
  sequence classification -- BERT-style heads pool the first token, decoder heads (GPT-2, Llama) each row's last
  token that is not `pad_token_id`, which they need (one line asks for it); (pixel_values [batch, num_channels,
  image_size, image_size], labels [batch]) for image classification, planned and counted in samples (no `seq`:
  the sequence is the image's patches; a model type whose config has no image_size gets 224). A pipeline does
  not run them (planner.plan.executable).
- speech sequence-to-sequence models (`hf:whisper`, planned whole: encoder and decoder): (input_features,
  labels), the log-mel features [batch, num_mel_bins, 2 x max_source_positions] and `seq` label tokens
  (`_speech_inputs`); a speech model with other audio inputs is one line. A head whose forward takes no
  `input_ids` is refused likewise (`_takes_token_ids`).

These models are captured with torch.export (costmodel.capture.export): symbolic_trace cannot follow
their control flow. `export_context()` (costmodel.models.hf_export) makes the trace follow the path eager
training takes on such a batch (see its docstring).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from partita.costmodel.errors import PartitaError, did_you_mean
from partita.costmodel.models import hf_dual
from partita.costmodel.models.hf_classify import ONE_LABEL as _ONE_LABEL
from partita.costmodel.models.hf_classify import check_classifier, image_inputs
from partita.costmodel.models.hf_seq2seq import SMALL_SEQ2SEQ


@dataclass(frozen=True)
class _Arch:
    config: str
    model: str
    task: str                       # "causal" | "mlm" | "seq2seq" | "speech-seq2seq" | "seq-cls" | "image-cls"
    positions: str | None           # config attribute holding the position-table size
    defaults: dict[str, Any] = field(default_factory=dict)
    model_type: str | None = None   # the transformers model type of a family without small defaults


_BERT = dict(num_hidden_layers=2, hidden_size=128, intermediate_size=512, num_attention_heads=4, vocab_size=1024,
             max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


_ARCHS: dict[str, _Arch] = {
    "gpt2": _Arch("GPT2Config", "GPT2LMHeadModel", "causal", "n_positions", dict(
        n_layer=2, n_embd=128, n_head=4, vocab_size=1024, n_positions=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)),
    "llama": _Arch("LlamaConfig", "LlamaForCausalLM", "causal", "max_position_embeddings", dict(
        num_hidden_layers=2, hidden_size=128, intermediate_size=352, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=1024, max_position_embeddings=64)),
    "bert": _Arch("BertConfig", "BertForMaskedLM", "mlm", "max_position_embeddings", _BERT),
    "vit": _Arch("ViTConfig", "ViTForImageClassification", "image-cls", None, dict(
        num_hidden_layers=2, hidden_size=128, intermediate_size=512, num_attention_heads=4, image_size=32,
        patch_size=8, num_labels=10, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **_ONE_LABEL)),
    "t5": _Arch("T5Config", "T5ForConditionalGeneration", "seq2seq", None, dict(
        num_layers=2, d_model=128, d_ff=512, num_heads=4, d_kv=32, vocab_size=1024,
        dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)),
}
_ARCHS.update({family: _Arch(config, model, "seq2seq", "max_position_embeddings", defaults)
               for family, (config, model, defaults) in SMALL_SEQ2SEQ.items()})
"""Text encoder-decoders, planned whole rather than as their decoder (costmodel.models.hf_seq2seq)."""
_ARCHS.update({family: _Arch(config, model, "contrastive", None, defaults)
               for family, (config, model, defaults) in hf_dual.SMALL_DUAL.items()})
"""Dual encoders trained on their contrastive loss (costmodel.models.hf_dual)."""
_ALIASES = {"vit-cls": "vit"}
"""Names of a family with small defaults given with the task it already has."""
TASKS = {"cls": "a classification head: sequence classification (input_ids, one label per row), or image "
                "classification for a vision model (pixel_values, one label per image)"}
"""The task suffixes of `hf:FAMILY-TASK` (module docstring)."""
_LOSS_TYPE = {"causal": "ForCausalLM", "mlm": "ForMaskedLM", "seq2seq": "ForConditionalGeneration",
              "speech-seq2seq": "ForConditionalGeneration", "seq-cls": "ForSequenceClassification",
              "image-cls": "ForImageClassification"}
CLASSIFIERS = ("seq-cls", "image-cls")
DEFAULT_SEQ = 64
_POSITIONS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length")
"""Config attributes that may hold a position-table size, in the order they are looked for."""
_SIZE_KEYS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
              "num_key_value_heads", "vocab_size", "num_local_experts", "num_experts", "num_experts_per_tok")
"""Config attributes recorded in a plan's model config when the family has them."""
_TOKENS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")


def _arch(name: str, spec: str) -> _Arch:
    """The config class, head and task of `hf:NAME`: a family with small defaults (`_ARCHS`), or a transformers
    model type with its first head among seq2seq LM (the whole encoder-decoder), causal LM and masked LM; with a
    task suffix (`FAMILY-cls`) the family's classification head, at its small defaults if it has them."""
    name = _ALIASES.get(name, name)
    if name in _ARCHS:
        return _ARCHS[name]
    from transformers.models.auto import modeling_auto as ma
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    family, task = _family_task(name, spec)
    if task == "cls":
        return _classifier(family, spec)
    if family in ma.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES:  # the whole encoder-decoder, not its text decoder
        return _Arch(CONFIG_MAPPING_NAMES[family], ma.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES[family],
                     "speech-seq2seq", None, model_type=family)
    heads = (("seq2seq", ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES),
             ("causal", ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES),
             ("mlm", ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES))
    for task, mapping in heads:
        if family in mapping:
            _takes_token_ids(family, mapping[family], spec)
            return _Arch(CONFIG_MAPPING_NAMES[family], mapping[family], task, None, model_type=family)
    other = (f"; hf:{family}-cls is its classifier ({_classifier(family, spec).model})"
             if _has_classifier(family) else f"; e.g. {_EXAMPLES}")
    raise PartitaError(f"HuggingFace model type {family!r} ({spec!r}) has no causal-LM, sequence-to-sequence LM or "
                       f"masked-LM head in transformers, which hf:{family} trains{other}")


_EXAMPLES = "hf:gpt2, hf:llama, hf:mistral, hf:mixtral, hf:qwen2, hf:bert, hf:t5, hf:bert-cls, hf:vit"


def _family_task(name: str, spec: str) -> tuple[str, str | None]:
    """'roberta-cls' -> ('roberta', 'cls'); a model type alone -> (it, None); else one line naming the nearest
    model type or task."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    if name in CONFIG_MAPPING_NAMES:
        return name, None
    family, dash, task = name.rpartition("-")
    if dash and family in CONFIG_MAPPING_NAMES:
        if task in TASKS:
            return family, task
        tasks = "; ".join(f"-{t}, {what}" for t, what in TASKS.items())
        raise PartitaError(f"unknown task {task!r} in {spec!r}{did_you_mean(task, TASKS)}; the tasks are {tasks} "
                           f"(hf:{family} alone is its default head)")
    near = did_you_mean(name, [*CONFIG_MAPPING_NAMES, *(f"{f}-{t}" for f in _ARCHS for t in TASKS)])
    raise PartitaError(f"unknown HuggingFace model type {name!r} in {spec!r}{near}; accepted: {_EXAMPLES} or any other "
                       "transformers model type (as AutoConfig.for_model takes it), each optionally with -cls (its "
                       "classification head) and :key=value,... overrides")


def _has_classifier(family: str) -> bool:
    from transformers.models.auto import modeling_auto as ma
    return (family in ma.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES
            or family in ma.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES)


def _classifier(family: str, spec: str) -> _Arch:
    """`hf:FAMILY-cls`: the model type's sequence-classification head (token ids), else its image-classification
    head (pixel values), at the family's small defaults where it has them (`_ARCHS`: hf:bert-cls, hf:llama-cls);
    one line when it has neither head."""
    from transformers.models.auto import modeling_auto as ma
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    for task, mapping in (("seq-cls", ma.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES),
                          ("image-cls", ma.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES)):
        if family not in mapping:
            continue
        head = mapping[family] if isinstance(mapping[family], str) else mapping[family][0]  # DeiT: (plain, teacher)
        if task == "seq-cls":
            _takes_token_ids(family, head, spec)
        small = _ARCHS.get(family)
        if small is not None:
            return _Arch(small.config, head, task, small.positions, {**small.defaults, **_ONE_LABEL})
        return _Arch(CONFIG_MAPPING_NAMES[family], head, task, None, dict(_ONE_LABEL), model_type=family)
    raise PartitaError(f"HuggingFace model type {family!r} ({spec!r}) has no sequence- or image-classification head "
                       f"in transformers; drop -cls for its language-model head, or e.g. hf:bert-cls, hf:vit")


def _takes_token_ids(family: str, model: str, spec: str) -> None:
    """PartitaError unless the head's forward takes `input_ids`: partita's hf: batches are token ids, so a
    speech model (Whisper, Speech2Text: input_features) would run its decoder alone, its encoder idle."""
    import inspect
    params = inspect.signature(getattr(_transformers(), model).forward).parameters
    if "input_ids" in params:
        return
    takes = next((p for p in params if p not in ("self", "attention_mask")), "other inputs")
    raise PartitaError(f"{spec!r} ({model}) takes {takes}, not token ids, and hf: models are planned and trained "
                       f"on token batches (its encoder would stay idle): give it as a package.module:factory "
                       f"returning (model, example_inputs, loss_fn) with its own {takes}")


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
    arch = arch.strip()
    if not arch:
        raise PartitaError(f"model {spec!r} names no HuggingFace model type: use hf:FAMILY[:key=value,...], "
                           "e.g. hf:llama:num_hidden_layers=4")
    overrides: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in items.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise PartitaError(f"bad model parameter {item!r} in {spec!r}: use key=value, "
                               f"e.g. hf:{arch}:num_hidden_layers=4")
        if key.strip() in overrides:
            raise PartitaError(f"model parameter {key.strip()!r} is given twice in {spec!r}")
        overrides[key.strip()] = _value(value)
    return arch, overrides


_READ_IF_SET = ("head_dim",)
"""Attributes transformers' modeling code reads with getattr(config, key, default) although some configs
lack them (Qwen3-MoE's attention: head_dim, default hidden_size / num_attention_heads)."""


def _config(arch: str, overrides: dict[str, Any], spec: str):
    tf = _transformers()
    a = _arch(arch, spec)
    kw = {k: v for k, v in overrides.items() if k != "seq"}
    make = getattr(tf, a.config) if a.model_type is None else functools.partial(tf.AutoConfig.for_model, a.model_type)
    probe = _quiet(make)
    if a.task == "contrastive":  # a tower's attributes are dotted: text_config.hidden_size
        kw, towers = hf_dual.nested(kw, probe, spec)
    unknown = sorted(k for k in kw if not hasattr(probe, k) and k not in _READ_IF_SET)
    if unknown:
        known = [k for k in (*a.defaults, *_SIZE_KEYS) if hasattr(probe, k)]
        raise PartitaError(f"model {spec!r}: {a.config} has no attribute {', '.join(map(repr, unknown))}; "
                           f"use its attributes, e.g. {', '.join(sorted(set(known)))}")
    if kw.get("use_cache"):
        raise PartitaError(f"model {spec!r}: use_cache must stay false (training captures no KV cache)")
    seq = overrides.get("seq", DEFAULT_SEQ)
    if not isinstance(seq, int) or isinstance(seq, bool) or seq <= 1:
        raise PartitaError(f"model {spec!r}: seq must be an integer > 1, got {seq!r}")
    if a.task == "contrastive":
        return _built(make, a, hf_dual.merged_config(a.defaults, kw, towers, seq, spec), kw, spec), seq
    merged = {**a.defaults, **kw, "use_cache": False}
    positions = a.positions if a.model_type is None or a.task == "image-cls" else next(
        (p for p in _POSITIONS if isinstance(getattr(probe, p, None), int) and not isinstance(getattr(probe, p), bool)),
        None)
    if positions is not None:
        given = kw.get(positions)
        if isinstance(given, int) and given < seq:
            raise PartitaError(f"model {spec!r}: seq={seq} exceeds {positions}={given}; raise {positions} or "
                               "lower seq")
        merged[positions] = max(merged.get(positions, getattr(probe, positions)), seq)
    vocab = merged.get("vocab_size", getattr(probe, "vocab_size", None))
    if isinstance(vocab, int):
        for tok in _TOKENS:
            if tok in kw:
                if isinstance(kw[tok], int) and not 0 <= kw[tok] < vocab:
                    raise PartitaError(f"model {spec!r}: {tok}={kw[tok]} is outside the vocabulary "
                                       f"(vocab_size={vocab}); give {tok} below {vocab}, or none")
                continue
            default = merged.get(tok, getattr(probe, tok, None))
            if isinstance(default, int) and default >= vocab:
                merged[tok] = vocab - 1  # GPT-2's 50256 or Phi-3's 32000 would fall outside a small vocabulary
    return _built(make, a, merged, kw, spec), seq


def _quiet(make):
    """A config at its class defaults, whose validation warnings (SigLIP's token ids outside its default
    vocabulary) are not the user's: the overrides and small defaults are checked when the real one is built."""
    logging = _transformers().logging
    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        return make()
    finally:
        logging.set_verbosity(level)


def _built(make, a: _Arch, merged: dict[str, Any], kw: dict[str, Any], spec: str):
    """The config from its keyword arguments, attention set as training runs it; one line when it is refused."""
    try:
        cfg = make(**merged)
    except Exception as e:  # noqa: BLE001 -- transformers' validators raise ValueError, TypeError, StrictDataclass*
        raise PartitaError(f"model {spec!r}: {a.config} rejects the configuration: {_reason(e)}"
                           f"{_culprits(e, kw)}") from None
    cfg._attn_implementation = attention_implementation(getattr(_transformers(), a.model))
    return cfg


def attention_implementation(model_cls) -> str:
    """"sdpa" (fused attention, what training uses) where the model class supports it, else "eager": Gemma-2
    (logit soft-capping), BLOOM (ALiBi) and attention-free Mamba refuse sdpa when built."""
    return "sdpa" if getattr(model_cls, "_supports_sdpa", False) else "eager"


def _reason(e: BaseException, limit: int = 300) -> str:
    """The innermost line of a (possibly multi-line) validation error: its whole sentences within `limit`
    characters, else its words within it and "..." -- never a cut word."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    line = lines[-1] if lines else type(e).__name__
    for prefix in ("ValueError: ", "TypeError: ", "AssertionError: "):
        line = line.removeprefix(prefix)
    if len(line) <= limit:
        return line.rstrip(".")
    cut = line[:limit]
    end = cut.rfind(". ")
    return cut[:end] if end > 0 else cut[:cut.rfind(" ")].rstrip(",;:") + " ..."


def _culprits(e: BaseException, kw: dict[str, Any]) -> str:
    """'; change hidden_size=130 or num_attention_heads=4' for the overrides the message is about."""
    text = str(e).lower()
    named = [k for k, v in kw.items() if k.lower() in text or k.replace("_", " ").lower() in text
             or (not isinstance(v, bool) and f"({v})".lower() in text)]
    if named:
        return "; change " + " or ".join(f"{k}={kw[k]}" for k in named)
    return "; change the overrides" if kw else ""


def _architecture(cfg) -> dict[str, Any]:
    """What an export needs beyond sizes to name the architecture: the rotary base and whether the input and
    output embeddings are tied (partita.export)."""
    rope = getattr(cfg, "rope_parameters", None) or {}
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    theta = theta if theta is not None else getattr(cfg, "rope_theta", None)
    out = {"tie_word_embeddings": bool(getattr(cfg, "tie_word_embeddings", False))}
    if isinstance(theta, (int, float)):
        out["rope_theta"] = float(theta)
    return out


def _speech_inputs(spec: str, a: _Arch, cfg, seq: int):
    """A Whisper-style speech model planned whole: log-mel input features [batch, num_mel_bins,
    2 x max_source_positions] (the encoder's two convolutions, the second of stride 2, make max_source_positions
    frames) and `seq` label tokens, from which the model makes its decoder inputs (shifted right) and its loss.
    Returns (example_inputs, the loss's keyword names, config keys worth recording)."""
    mels, source = getattr(cfg, "num_mel_bins", None), getattr(cfg, "max_source_positions", None)
    if not (isinstance(mels, int) and isinstance(source, int)):
        raise PartitaError(f"{spec!r} ({a.model}) is a speech model whose audio inputs partita does not make (it "
                           "builds Whisper's: num_mel_bins x 2 max_source_positions log-mel frames); give it as a "
                           "package.module:factory returning (model, example_inputs, loss_fn)")
    target = getattr(cfg, "max_target_positions", None)
    if isinstance(target, int) and seq > target:
        raise PartitaError(f"model {spec!r}: seq={seq} exceeds max_target_positions={target}; lower seq or raise it")

    def example_inputs(batch: int):
        return torch.zeros(batch, mels, 2 * source), torch.zeros(batch, seq, dtype=torch.long)

    keys = ("d_model", "encoder_layers", "decoder_layers", "num_mel_bins", "max_source_positions")
    return example_inputs, ("input_features", "labels"), keys


def hf_loss(names: tuple[str, ...], model: nn.Module, *inputs: torch.Tensor, **options) -> torch.Tensor:
    """The HF model's own loss for keyword inputs `names` and fixed keyword `options` (return_loss=True for a dual
    encoder): the ModelSpec's loss_fn."""
    return model(**dict(zip(names, inputs)), **options).loss


def hf_spec(spec: str, seq: int | None = None):
    """A ModelSpec for an `hf:` MODEL string (see the module docstring)."""
    from partita.costmodel.models import ModelSpec

    arch, overrides = parse(spec)
    if seq is not None:
        overrides = {**overrides, "seq": seq}
    cfg, seq = _config(arch, overrides, spec)
    a = _arch(arch, spec)
    model_cls = getattr(_transformers(), a.model)
    loss_type = _LOSS_TYPE.get(a.task)  # a dual encoder computes its contrastive loss itself

    def build() -> nn.Module:
        try:
            model = model_cls(cfg)
        except Exception as e:  # noqa: BLE001 -- a config the class's constructor cannot build
            given = {k: v for k, v in overrides.items() if k != "seq"}
            raise PartitaError(f"model {spec!r}: {a.model} cannot be built from this configuration: "
                               f"{_reason(e)}{_culprits(e, given)}") from None
        if loss_type is not None:
            model.loss_type = loss_type
        return model

    if a.task in CLASSIFIERS:
        check_classifier(spec, a, cfg, overrides)
    options = {"return_loss": True} if a.task == "contrastive" else {}
    if a.task == "speech-seq2seq":
        example_inputs, names, keys = _speech_inputs(spec, a, cfg, seq)
    elif a.task == "contrastive":
        example_inputs, names, keys = hf_dual.example_inputs_of(cfg, seq), hf_dual.INPUT_NAMES, ()
    elif a.task == "image-cls":
        example_inputs, names, keys = image_inputs(cfg)
        seq = None  # a fixed input shape: its sequence is the image's patches
    else:
        rows = (lambda batch: ()) if a.task == "seq-cls" else (lambda batch: (seq,))

        def example_inputs(batch: int):
            ids = torch.zeros(batch, seq, dtype=torch.long)
            return ids, torch.zeros(batch, *rows(batch), dtype=torch.long)
        names, keys = ("input_ids", "labels"), a.defaults
    keys = sorted({*keys, *_SIZE_KEYS, *(k for k in overrides if k != "seq"),
                   *(("num_labels",) if a.task in CLASSIFIERS else ())})
    sizes = {k: getattr(cfg, k) for k in keys if isinstance(getattr(cfg, k, None), (int, float))
             and not isinstance(getattr(cfg, k), bool)}
    sizes.update(_architecture(cfg) if a.task != "contrastive" else hf_dual.sizes(cfg))
    return ModelSpec(
        name=spec, build=build, example_inputs=example_inputs, seq_len=seq,
        config={"family": "hf", "arch": arch, "model": a.model, "task": a.task, "seq": seq,
                "overrides": {k: v for k, v in overrides.items() if k != "seq"}, **sizes},
        capture="export", loss_fn=functools.partial(hf_loss, names, **options),
        at_seq=None if seq is None else (lambda s: hf_spec(spec, seq=s)), input_names=names,
    )

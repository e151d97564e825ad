"""The model families' configurations and the named presets, without torch: `partita models` lists them, and
the CLI, the planner and the exporters read them, in processes that need not import torch (issue 44: `partita
models` took 5 s, all of it torch). The modules that build the models (gpt.py, cnn.py) import these."""
from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass

from partita.costmodel.errors import PartitaError, did_you_mean


@dataclass(kw_only=True, slots=True)
class GPTConfig:
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq: int
    ffn: int = 0
    """MLP inner size; 0 means 4 * hidden."""
    kv_heads: int = 0
    """Key/value heads for grouped-query attention; 0 means heads (plain multi-head attention)."""
    family: str = "gpt"
    """"gpt" (LayerNorm, GELU, learned positions, biases) or "llama" (RMSNorm, SwiGLU, RoPE)."""
    attention: str = "sdpa"
    """"sdpa" (fused attention) or "math" (scores, softmax and dropout materialised)."""
    dropout: float = 0.0
    """Dropout probability after attention scores, the attention output and the MLP (GPT-2 placement)."""
    loss: str = "plain"
    """Token cross-entropy: "plain" (F.cross_entropy on fp32 logits) or "fused" (one kernel keeping only the
    logits, as llm-foundry and Liger train; costmodel.models.losses)."""
    experts: int = 0
    """Mixture of experts: every block's MLP is `MoE` with this many SwiGLU experts (llama family); 0 means the
    dense MLP."""
    top_k: int = 2
    """Experts each token is routed to (with `experts` > 0)."""

    def __post_init__(self):
        if self.ffn == 0:
            self.ffn = 4 * self.hidden
        if self.kv_heads == 0:
            self.kv_heads = self.heads
        if self.family not in ("gpt", "llama"):
            raise ValueError(f"family must be 'gpt' or 'llama', got {self.family!r}")
        if self.attention not in ("sdpa", "math"):
            raise ValueError(f"attention must be 'sdpa' or 'math', got {self.attention!r}")
        if self.loss not in ("plain", "fused"):
            raise ValueError(f"loss must be 'plain' or 'fused', got {self.loss!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        for name in ("layers", "hidden", "heads", "vocab", "seq", "ffn", "kv_heads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})")
        self._check_experts()

    def _check_experts(self):
        if self.experts < 0:
            raise ValueError(f"experts must be 0 (a dense MLP) or positive, got {self.experts}")
        if not self.experts:
            return
        if self.family != "llama":
            raise ValueError(f"experts={self.experts} needs family 'llama' (SwiGLU experts), got {self.family!r}")
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(f"top_k must be between 1 and experts ({self.experts}), got {self.top_k}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def as_dict(self) -> dict:
        return asdict(self)


# Megatron-LM SC'21 Table 1 (REFERENCE.md): heads, hidden, layers; seq 2048, vocab 51200.
_MEGATRON_TABLE1 = {
    "megatron-1.7b": (24, 2304, 24),
    "megatron-3.6b": (32, 3072, 30),
    "megatron-7.5b": (32, 4096, 36),
    "megatron-18b": (48, 6144, 40),
    "megatron-39b": (64, 8192, 48),
    "megatron-76b": (80, 10240, 60),
    "megatron-146b": (96, 12288, 80),
    "megatron-310b": (128, 16384, 96),
    "megatron-530b": (128, 20480, 105),
    "megatron-1t": (160, 25600, 128),
}

PRESETS: dict[str, GPTConfig] = {
    "tiny-gpt": GPTConfig(layers=2, hidden=64, heads=4, vocab=256, seq=32),
    "small-gpt": GPTConfig(layers=4, hidden=128, heads=4, vocab=512, seq=64),
    "tiny-llama": GPTConfig(layers=2, hidden=64, heads=4, kv_heads=2, ffn=172, vocab=256, seq=32, family="llama"),
    # partita's own mixture of experts: Mixtral-style top-2 routing over 4 SwiGLU experts per block (gpt.MoE)
    "tiny-moe": GPTConfig(layers=2, hidden=64, heads=4, kv_heads=2, ffn=96, vocab=256, seq=32, family="llama",
                          experts=4, top_k=2),
    "gpt2-small": GPTConfig(layers=12, hidden=768, heads=12, vocab=50257, seq=1024),
    # GPT-3 175B (Brown et al. 2020), as in Megatron-LM's GPT-3 runs.
    "gpt3-175b": GPTConfig(layers=96, hidden=12288, heads=96, vocab=51200, seq=2048),
    # Llama 3 (Dubey et al. 2024, Table 3): GQA with 8 KV heads, SwiGLU, RoPE, 128K vocabulary.
    "llama3-8b": GPTConfig(layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=128256, seq=8192, family="llama"),
    "llama3-70b": GPTConfig(layers=80, hidden=8192, ffn=28672, heads=64, kv_heads=8, vocab=128256, seq=8192, family="llama"),
    "llama3-405b": GPTConfig(layers=126, hidden=16384, ffn=53248, heads=128, kv_heads=8, vocab=128256, seq=8192, family="llama"),
}
# The megatron-* presets model Megatron-LM as it ran in 2021: attention scores, softmax and dropout
# materialised (no fused attention), dropout 0.1 -- so predictions of the published runs, and the
# activation bytes of Korthikanti et al.'s table, are of the same implementation.
PRESETS.update({name: GPTConfig(layers=n, hidden=h, heads=a, vocab=51200, seq=2048, attention="math", dropout=0.1)
                for name, (a, h, n) in _MEGATRON_TABLE1.items()})

FAMILY_KEYS = {family: tuple(f.name for f in dataclasses.fields(GPTConfig) if f.name != "family")
               for family in ("gpt", "llama")}
"""The keys of a `gpt:` / `llama:` MODEL string: every GPTConfig field but the family, which the prefix names."""
_CHOICES = {"attention": ("sdpa", "math"), "loss": ("plain", "fused")}
_REQUIRED = ("layers", "hidden", "heads", "vocab", "seq")


def _family_value(spec: str, key: str, value: str):
    """`value` parsed as GPTConfig's field `key` is typed (int, float, or one of a few strings)."""
    is_float = "float" in str({f.name: f.type for f in dataclasses.fields(GPTConfig)}[key])
    value = value.strip()
    if key in _CHOICES:
        if value not in _CHOICES[key]:
            raise PartitaError(f"model parameter {key}={value!r} in {spec!r}: accepted values "
                               f"{'|'.join(_CHOICES[key])}")
        return value
    try:
        return float(value) if is_float else int(value)
    except ValueError:
        raise PartitaError(f"model parameter {key}={value!r} in {spec!r} is not "
                           f"{'a number' if is_float else 'an integer'}") from None


def parse_family(spec: str) -> GPTConfig:
    """The GPTConfig of `gpt:key=value,...` or `llama:...`, every GPTConfig field a key parsed by its type;
    PartitaError, one line, for a string that is not one."""
    family, _, rest = spec.partition(":")
    allowed = FAMILY_KEYS[family]
    kwargs: dict = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in allowed:
            near = did_you_mean(key, allowed) if not eq or key not in allowed else ""
            raise PartitaError(f"bad model parameter {item!r} in {spec!r}{near}: use key=value with keys "
                               f"{', '.join(allowed)} (attention={'|'.join(_CHOICES['attention'])})")
        if key in kwargs:
            raise PartitaError(f"model parameter {key!r} is given twice in {spec!r}")
        kwargs[key] = _family_value(spec, key, value)
    required = [k for k in _REQUIRED if k not in kwargs]
    if required:
        raise PartitaError(f"model {spec!r} is missing {required}; e.g. "
                           f"{family}:layers=4,hidden=256,heads=4,seq=128,vocab=1000")
    try:
        return GPTConfig(family=family, **kwargs)
    except ValueError as e:
        raise PartitaError(f"model {spec!r}: {e}") from None


def gpt_config_of(model: str) -> GPTConfig | None:
    """The GPTConfig of a MODEL string naming one of partita's GPT or Llama models (a preset, `gpt:...`,
    `llama:...`), as costmodel.models.registry.resolve_model builds it, without torch; None for any other string
    (PartitaError for a `gpt:` / `llama:` string that does not parse)."""
    if model in PRESETS:
        return PRESETS[model]
    if model.partition(":")[0] in FAMILY_KEYS and ":" in model:
        return parse_family(model)
    return None


_DEPTHS = {18: ((2, 2, 2, 2), False), 34: ((3, 4, 6, 3), False), 50: ((3, 4, 6, 3), True),
           101: ((3, 4, 23, 3), True), 152: ((3, 8, 36, 3), True)}


@dataclass(kw_only=True, slots=True)
class ResNetConfig:
    blocks: tuple[int, ...]
    """Residual blocks per stage; stage k has width * 2**k channels (x4 at the output of a bottleneck)."""
    bottleneck: bool
    width: int = 64
    image: int = 224
    classes: int = 1000
    channels: int = 3
    small_stem: bool = False
    """A 3x3 stride-1 stem without max-pool (CIFAR-sized images) instead of 7x7 stride 2 + max-pool."""

    def __post_init__(self):
        self.blocks = tuple(self.blocks)
        for name in ("width", "image", "classes", "channels"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not self.blocks or any(b <= 0 for b in self.blocks):
            raise ValueError(f"blocks must be positive counts per stage, got {self.blocks}")

    def as_dict(self) -> dict:
        d = asdict(self)
        d["blocks"] = list(self.blocks)
        return d


def _config(depth: int, **kw) -> ResNetConfig:
    if depth not in _DEPTHS:
        raise ValueError(f"depth must be one of {sorted(_DEPTHS)}, got {depth}")
    blocks, bottleneck = _DEPTHS[depth]
    return ResNetConfig(blocks=blocks, bottleneck=bottleneck, **kw)


CNN_PRESETS: dict[str, ResNetConfig] = {
    "tiny-resnet": ResNetConfig(blocks=(2, 2, 2, 2), bottleneck=False, width=16, image=32, classes=10,
                                small_stem=True),
    **{f"resnet{d}": _config(d) for d in _DEPTHS},
}

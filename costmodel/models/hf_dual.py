"""Dual encoders trained contrastively, as `hf:` strings: hf:clip (CLIPModel) and hf:siglip (SiglipModel).

Such a model embeds a batch of texts with one tower and a batch of images with the other, and scores every text
against every image of the batch. CLIP's loss is the symmetric cross-entropy of that [batch, batch] similarity
matrix (Radford et al. 2021, "Learning Transferable Visual Models From Natural Language Supervision"); SigLIP's is
a sigmoid loss over every pair (Zhai et al. 2023, "Sigmoid Loss for Language Image Pre-Training"). Both couple
the samples of a batch: a sample's negatives are the other samples of its batch, so under --dp N each rank scores
its own samples only. The capture finds this on fake tensors (costmodel.capture.coupling) and the plan warns
before training (planner.plan.explain.batch_coupling_warning).

Batch: (input_ids [batch, seq] token ids, pixel_values [batch, channels, size, size]); the model's forward runs
with return_loss=True and its `loss` is trained. There are no labels: the pairing is the batch's order.

Defaults are small, as for the other hf: families: each tower 2 layers, hidden 128, 4 heads, feed-forward 512;
text vocabulary 1024 and 64 positions; 32 x 32 images in 8 x 8 patches; projection 64. Overrides name the
top-level config's attributes (`hf:clip:projection_dim=128`) or a tower's, dotted
(`hf:clip:vision_config.image_size=64,text_config.num_hidden_layers=4`); `seq` sets the text tower's positions.
"""
from __future__ import annotations

from typing import Any

import torch

from partita.costmodel.errors import PartitaError

_TOWER: dict[str, Any] = dict(num_hidden_layers=2, hidden_size=128, intermediate_size=512, num_attention_heads=4)
_TEXT: dict[str, Any] = dict(_TOWER, vocab_size=1024, max_position_embeddings=64, pad_token_id=1, bos_token_id=0,
                             eos_token_id=2)
"""CLIP's text tower with eos_token_id = 2 pools the position of each row's largest token id (its original
checkpoints' rule); SigLIP's pools the last position. Both are defined on any token batch."""
_VISION: dict[str, Any] = dict(_TOWER, image_size=32, patch_size=8)

SMALL_DUAL: dict[str, tuple[str, str, dict[str, Any]]] = {
    "clip": ("CLIPConfig", "CLIPModel", dict(text_config=_TEXT, vision_config=_VISION, projection_dim=64)),
    "siglip": ("SiglipConfig", "SiglipModel", dict(text_config=_TEXT, vision_config=_VISION)),
}
"""family: (config class, model class, small defaults)."""
TOWERS = ("text_config", "vision_config")
INPUT_NAMES = ("input_ids", "pixel_values")
RECORDED = ("projection_dim", "text_config.hidden_size", "text_config.num_hidden_layers", "text_config.vocab_size",
            "vision_config.hidden_size", "vision_config.num_hidden_layers", "vision_config.image_size",
            "vision_config.patch_size")
"""Sizes a plan's model config records for a dual encoder, under their dotted names."""


def nested(overrides: dict[str, Any], probe, spec: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Split overrides into the top-level config's and each tower's (`text_config.hidden_size=256`); one line
    for a dotted key that names no tower or an attribute the tower does not have."""
    top: dict[str, Any] = {}
    towers: dict[str, dict[str, Any]] = {}
    for key, value in overrides.items():
        tower, dot, attr = key.partition(".")
        if not dot:
            top[key] = value
            continue
        sub = getattr(probe, tower, None) if tower in TOWERS else None
        if sub is None or not hasattr(sub, attr):
            what = f"tower {tower!r}" if tower not in TOWERS else f"{tower} attribute {attr!r}"
            raise PartitaError(f"model {spec!r}: no {what} in {key!r}; a dual encoder's towers are "
                               f"{' and '.join(TOWERS)}, e.g. text_config.hidden_size=256")
        towers.setdefault(tower, {})[attr] = value
    return top, towers


def merged_config(defaults: dict[str, Any], top: dict[str, Any], towers: dict[str, dict[str, Any]],
                  seq: int, spec: str) -> dict[str, Any]:
    """The config's keyword arguments: defaults, then the overrides, each tower's merged key by key; the text
    tower's positions raised to `seq` (one line when an override sets them below it)."""
    out = {**defaults, **top}
    for tower in TOWERS:
        out[tower] = {**defaults.get(tower, {}), **towers.get(tower, {})}
    positions = out["text_config"].get("max_position_embeddings", 0)
    if "max_position_embeddings" in towers.get("text_config", {}) and positions < seq:
        raise PartitaError(f"model {spec!r}: seq={seq} exceeds text_config.max_position_embeddings={positions}; "
                           "raise it or lower seq")
    out["text_config"]["max_position_embeddings"] = max(positions, seq)
    return out


def example_inputs_of(cfg, seq: int):
    """`example_inputs(batch)`: token ids [batch, seq] and images [batch, channels, size, size]."""
    vision = cfg.vision_config
    size = vision.image_size
    channels = getattr(vision, "num_channels", None) or 3

    def example_inputs(batch: int):
        return torch.zeros(batch, seq, dtype=torch.long), torch.zeros(batch, channels, size, size)

    return example_inputs


def sizes(cfg) -> dict[str, Any]:
    """RECORDED's values that are numbers, plus the text vocabulary as `vocab_size` (the runtime draws token ids
    below it)."""
    out = {}
    for key in RECORDED:
        tower, dot, attr = key.partition(".")
        value = getattr(getattr(cfg, tower), attr, None) if dot else getattr(cfg, key, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = value
    out["vocab_size"] = cfg.text_config.vocab_size
    return out

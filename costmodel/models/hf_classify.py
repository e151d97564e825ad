"""HuggingFace classifiers (`hf:FAMILY-cls`, hf:vit): the loss they train on, what partita refuses to train, and an
image classifier's example batch (costmodel.models.hf builds them)."""
from __future__ import annotations

from typing import Any

import torch

from partita.costmodel.errors import PartitaError

ONE_LABEL = dict(problem_type="single_label_classification")
"""A classifier's loss: cross-entropy of one class label per sample (HF's problem_type, set rather than inferred
from the labels' dtype in forward)."""


def check_classifier(spec: str, a, cfg, overrides: dict[str, Any]) -> None:
    """One line for a classifier partita cannot train as asked: labels are one class id per sample (cross-entropy
    over num_labels >= 2 classes); an image model has no `seq`; a head that finds each row's last token by
    `pad_token_id` (decoder classifiers: GPT-2, Llama, ...) needs one."""
    if not isinstance(cfg.num_labels, int) or cfg.num_labels < 2:
        raise PartitaError(f"model {spec!r}: num_labels={cfg.num_labels} -- partita trains classifiers on one class "
                           "label per sample (cross-entropy): give num_labels=2 or more")
    if cfg.problem_type != ONE_LABEL["problem_type"]:
        raise PartitaError(f"model {spec!r}: problem_type={cfg.problem_type} -- partita trains classifiers on one "
                           "class label per sample (cross-entropy): drop problem_type")
    if a.task == "image-cls" and "seq" in overrides:
        raise PartitaError(f"model {spec!r} is an image classifier, whose sequence is its image's patches: drop seq "
                           "and set the image's size (e.g. image_size, patch_size)")
    if a.task == "seq-cls" and _pools_last_token(a.model) and getattr(cfg, "pad_token_id", None) is None:
        raise PartitaError(f"model {spec!r}: {a.model} classifies each row's last token that is not padding, found by "
                           f"pad_token_id, which {a.config} leaves unset: add pad_token_id=ID (the id your data "
                           "pads with; partita's batches are unpadded)")


def _pools_last_token(model: str) -> bool:
    """Whether the head finds each row's last token by `pad_token_id` (its forward reads it), as decoder
    classifiers do, and refuses batches of more than one row without it."""
    import inspect

    import transformers
    try:
        return "pad_token_id" in inspect.getsource(getattr(transformers, model).forward)
    except (OSError, TypeError):
        return False


def image_inputs(cfg):
    """An image classifier's (pixel_values, labels): [batch, num_channels, height, width] floats (the config's
    image_size, 224 when it has none) and one class label per image. Returns (example_inputs, names, config keys
    worth recording)."""
    size = getattr(cfg, "image_size", None) or 224
    height, width = (size, size) if isinstance(size, int) else tuple(size)
    channels = getattr(cfg, "num_channels", None) or 3

    def example_inputs(batch: int):
        return torch.zeros(batch, channels, height, width), torch.zeros(batch, dtype=torch.long)

    return example_inputs, ("pixel_values", "labels"), ("image_size", "patch_size", "num_channels")

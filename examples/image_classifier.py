"""Your own model on your own data: a small CNN (with BatchNorm) and a map-style image dataset.

    partita plan --model examples.image_classifier:model --cluster 2xcpu --global-batch 16 --dp 2 \\
        --micro-batch 8 --out cnn.json
    partita run cnn.json --model examples.image_classifier:model --data examples.image_classifier:dataset \\
        --steps 4 --sync-batchnorm --verify

Run from the directory that holds `examples/` (the working directory is importable, as with `python -m`).

- `model()` is the model factory: it returns `(module, example_inputs, loss_fn)`. `example_inputs` is one
  batch (here one sample: an image and its label) with the batch dimension first; `loss_fn(module, images,
  labels)` returns the scalar loss. The planner calls `model()` on the meta device (no memory), the runtime
  on every rank; keep it cheap and free of side effects.
- `dataset()` is the data factory: it returns a `torch.utils.data.Dataset` (or IterableDataset) whose items
  are one row of a batch, `(image, label)`. partita shards it over the data-parallel ranks in an order that
  depends only on the seed and the step (runtime/data/datasets.py), so a run resumed from a checkpoint, or on
  another number of ranks, sees the same batches.

BatchNorm normalises over the samples it sees: under data parallelism each rank sees its own slice, so the
run differs from one process by more than rounding, and --verify says so before training. `--sync-batchnorm`
normalises over the whole data-parallel batch, as one process does. `--micro-batch 8` keeps each rank's 8
samples in one micro-batch for the same reason (gradient accumulation would normalise each micro-batch).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset

IMAGE, CLASSES, SAMPLES = 16, 4, 256


class Block(nn.Module):
    """A residual 3x3 convolution block with BatchNorm."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(y)))


class SmallCNN(nn.Module):
    def __init__(self, channels: int = 16, depth: int = 2, classes: int = CLASSES):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels),
                                  nn.ReLU())
        self.blocks = nn.ModuleList(Block(channels) for _ in range(depth))
        self.head = nn.Linear(channels, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.stem(images)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))


def cross_entropy(module: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(module(images), labels)


def model():
    """The model factory: (module, example inputs (images [1, 3, 16, 16], labels [1]), loss_fn)."""
    return SmallCNN(), (torch.zeros(1, 3, IMAGE, IMAGE), torch.zeros(1, dtype=torch.long)), cross_entropy


class Stripes(Dataset):
    """Images of stripes at one of four angles (the label), with noise: made from the index, so the same
    index is the same sample on every rank and in every run (no files to download)."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int):
        gen = torch.Generator().manual_seed(i)
        label = i % CLASSES
        angle = math.pi * label / CLASSES
        ys, xs = torch.meshgrid(torch.arange(IMAGE), torch.arange(IMAGE), indexing="ij")
        wave = torch.sin(0.9 * (xs * math.cos(angle) + ys * math.sin(angle)) + 6.28 * torch.rand(1, generator=gen))
        image = wave.expand(3, IMAGE, IMAGE) + 0.3 * torch.randn(3, IMAGE, IMAGE, generator=gen)
        return image.float(), label


def dataset() -> Dataset:
    """The data factory `--data examples.image_classifier:dataset` calls."""
    return Stripes()

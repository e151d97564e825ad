"""ResNet-style CNNs (He et al. 2016), written to be traced with torch.fx and split into pipeline stages.

Presets: `tiny-resnet` (CIFAR-sized, fast in tests), `resnet18`, `resnet34`, `resnet50`, `resnet101`,
`resnet152` (ImageNet: 224x224 images, 1000 classes), and the family
`resnet:depth=50,width=64,image=224,classes=1000` (any key may be left out; depth in 18/34/50/101/152).

Choices that matter for planning:

- All residual blocks sit in one flat `blocks` ModuleList (not four `layerN` stages), so every block is a
  group of the OpGraph and a possible pipeline split point; stage k's first block downsamples.
- Bottleneck blocks (depth >= 50) put the stride on the 3x3 convolution (the "v1.5" variant most
  implementations train); the shortcut projection is a 1x1 convolution + BatchNorm (`down`).
- ReLU is not in-place, so each saved activation lives in exactly one tensor.
- The loss is mean cross-entropy of the logits against integer class labels; the example batch is
  (images [b, 3, image, image], labels [b]).
"""
from __future__ import annotations

import math
import torch
import torch.nn as nn
import torch.nn.functional as F

from partita.costmodel.errors import PartitaError
from partita.costmodel.models.configs import CNN_PRESETS, ResNetConfig, _config

class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, c_in: int, width: int, stride: int):
        super().__init__()
        c_out = width * self.expansion
        self.conv1 = nn.Conv2d(c_in, width, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.down = _shortcut(c_in, c_out, stride)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.down(x) if self.down is not None else x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, c_in: int, width: int, stride: int):
        super().__init__()
        c_out = width * self.expansion
        self.conv1 = nn.Conv2d(c_in, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, c_out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c_out)
        self.down = _shortcut(c_in, c_out, stride)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (self.down(x) if self.down is not None else x))


def _shortcut(c_in: int, c_out: int, stride: int) -> nn.Module | None:
    if stride == 1 and c_in == c_out:
        return None
    return nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))


class Stem(nn.Module):
    def __init__(self, cfg: ResNetConfig):
        super().__init__()
        k, s = (3, 1) if cfg.small_stem else (7, 2)
        self.conv = nn.Conv2d(cfg.channels, cfg.width, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(cfg.width)
        self.pool = nn.Identity() if cfg.small_stem else nn.MaxPool2d(3, 2, 1)

    def forward(self, x):
        return self.pool(F.relu(self.bn(self.conv(x))))


class ResNet(nn.Module):
    """forward(images[b, c, h, w]) -> logits[b, classes]."""

    def __init__(self, cfg: ResNetConfig):
        super().__init__()
        self.cfg = cfg
        block = Bottleneck if cfg.bottleneck else BasicBlock
        self.stem = Stem(cfg)
        blocks = []
        c = cfg.width
        for stage, n in enumerate(cfg.blocks):
            width = cfg.width * 2 ** stage
            for i in range(n):
                blocks.append(block(c, width, 2 if (i == 0 and stage > 0) else 1))
                c = width * block.expansion
        self.blocks = nn.ModuleList(blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, cfg.classes)
        self.reset_parameters()

    def reset_parameters(self):
        """Kaiming-normal convolutions (fan out), BatchNorm weight 1 and bias 0."""
        if self.fc.weight.is_meta:
            return
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.fc.weight, std=1 / math.sqrt(self.fc.in_features))
        nn.init.zeros_(self.fc.bias)

    def forward(self, images):
        x = self.stem(images)
        for block in self.blocks:
            x = block(x)
        return self.fc(torch.flatten(self.pool(x), 1))


def classification_loss(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the model's logits against integer labels."""
    return F.cross_entropy(model(images), labels)


_FAMILY_KEYS = ("depth", "width", "image", "classes")


def resnet_spec(name: str, cfg: ResNetConfig):
    from partita.costmodel.models import ModelSpec

    def example_inputs(batch: int):
        # images in the default dtype (the capture sets it to the training dtype), labels as class ids
        return (torch.zeros(batch, cfg.channels, cfg.image, cfg.image),
                torch.zeros(batch, dtype=torch.long))

    return ModelSpec(name=name, build=lambda: ResNet(cfg), example_inputs=example_inputs,
                     config=cfg.as_dict(), layer_prefix="blocks", capture="fx", loss_fn=classification_loss)


def cnn_spec(spec: str):
    """A ModelSpec for a CNN preset or `resnet:depth=..,width=..,image=..,classes=..`."""
    if spec in CNN_PRESETS:
        return resnet_spec(spec, CNN_PRESETS[spec])
    _, _, rest = spec.partition(":")
    kw: dict[str, int] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in _FAMILY_KEYS:
            raise PartitaError(f"bad model parameter {item!r} in {spec!r}: use key=value with keys {list(_FAMILY_KEYS)}")
        try:
            kw[key] = int(value)
        except ValueError:
            raise PartitaError(f"model parameter {key}={value!r} in {spec!r} is not an integer") from None
    depth = kw.pop("depth", 50)
    kw.setdefault("small_stem", kw.get("image", 224) < 64)
    try:
        cfg = _config(depth, **kw)
    except ValueError as e:
        raise PartitaError(f"model {spec!r}: {e}") from None
    return resnet_spec(spec, cfg)

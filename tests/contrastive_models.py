"""Small models whose losses do and do not couple the samples of a batch (issue 46 item 5), shared by
tests/costmodel/test_batch_coupling.py and tests/planner/test_batch_coupling_plan.py."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from partita.costmodel.models.registry import ModelSpec


class TwoTowers(nn.Module):
    """Image and text towers, as CLIP's (tiny)."""

    def __init__(self):
        super().__init__()
        self.image = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
        self.text = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 8))

    def forward(self, images, texts):
        return F.normalize(self.image(images), dim=-1), F.normalize(self.text(texts), dim=-1)


def clip_loss(model, images, texts):
    """CLIP: every image against every text of the batch, the matching one the target."""
    u, v = model(images, texts)
    logits = u @ v.T / 0.07
    targets = torch.arange(images.shape[0])
    return (F.cross_entropy(logits, targets) + F.cross_entropy(logits.T, targets)) / 2


def listwise_loss(model, images, texts):
    """Each pair's score normalised by a softmax across the batch (a ranking loss over in-batch candidates)."""
    u, v = model(images, texts)
    return -F.log_softmax((u * v).sum(-1), dim=0).mean()


def centred_loss(model, images, texts):
    """Embeddings centred on the batch's mean before a per-sample distance."""
    u, v = model(images, texts)
    return ((u - u.mean(0)) - v).pow(2).sum(-1).mean()


def mse_loss(model, images, texts):
    u, v = model(images, texts)
    return F.mse_loss(u, v)


def cross_entropy(model, x, y):
    return F.cross_entropy(model(x), y)


def towers(loss) -> ModelSpec:
    return ModelSpec(name=f"towers-{loss.__name__}", build=TwoTowers, loss_fn=loss,
                     example_inputs=lambda b: (torch.randn(b, 16), torch.randn(b, 12)))


def classifier(build) -> ModelSpec:
    return ModelSpec(name="classifier", build=build, loss_fn=cross_entropy,
                     example_inputs=lambda b: (torch.randn(b, 16), torch.zeros(b, dtype=torch.long)))


def mlp():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def batchnorm_mlp():  # the issue's own example (BatchNorm1d after a Linear)
    return nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 4))

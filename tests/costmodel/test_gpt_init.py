"""The GPT / Llama presets draw each weight once (costmodel.models.gpt._drawn_once): the layers skip their default
init, GPT.reset_parameters draws N(0, 0.02) (output projections scaled), zeroes the biases and leaves the norms at
one; the same seed gives the same model, and torch.nn.init is itself again afterwards, even after a failed build."""
import math

import pytest
import torch
import torch.nn as nn

from partita.costmodel.models import resolve_model
from partita.costmodel.models.gpt import GPT, _RANDOM_INITS
from partita.runtime.loop.recipe import build_model

KEPT = {name: getattr(nn.init, name) for name in _RANDOM_INITS}


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_every_parameter_is_drawn_by_reset_parameters_and_no_init_is_left_patched(family):
    spec = resolve_model(f"{family}:layers=2,hidden=256,heads=4,vocab=512,seq=32")
    model = build_model(spec, 0)
    layers = model.cfg.layers
    for name, p in model.named_parameters():
        p = p.detach()
        if p.dim() >= 2:
            scaled = name.endswith(("proj.weight", "fc2.weight", "down_proj"))
            std = 0.02 / math.sqrt(2 * layers) if scaled else 0.02
            assert float(p.std()) == pytest.approx(std, rel=0.15), name
            assert abs(float(p.mean())) < 0.2 * std, name
        elif name.endswith("bias") and "ln" not in name:
            assert torch.count_nonzero(p) == 0, name
        else:  # a norm's weight (and a LayerNorm's bias): its own, not random
            assert torch.all(p == (0.0 if name.endswith("bias") else 1.0)), name
    again = build_model(spec, 0)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))
    assert {name: getattr(nn.init, name) for name in _RANDOM_INITS} == KEPT


def test_a_failed_build_restores_torch_nn_init(monkeypatch):
    from partita.costmodel.models import gpt
    cfg = resolve_model("tiny-gpt").build().cfg

    def broken(cfg):
        raise RuntimeError("a layer that cannot be built")
    monkeypatch.setattr(gpt, "Block", broken)
    with pytest.raises(RuntimeError, match="cannot be built"):
        GPT(cfg)
    assert {name: getattr(nn.init, name) for name in _RANDOM_INITS} == KEPT
    assert float(nn.init.normal_(torch.zeros(1000)).std()) > 0.5

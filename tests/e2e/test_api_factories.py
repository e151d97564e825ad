"""Issue 46: the Python API takes what the CLI takes. `partita.plan` accepts a model factory returning (module,
example_inputs, loss_fn) -- the contract of `package.module:factory` -- and an nn.Module with its example inputs
and `loss_fn`; `partita.run` accepts the same factory as its `model_fn` (before, it wanted a function returning
the module alone and refused the tuple). The run's ranks: a user script on the test session's gloo workers."""
from __future__ import annotations

import json

import pytest
import rank_pool
import torch

import partita
from examples.image_classifier import cross_entropy, model
from partita.costmodel import PartitaError
from partita.planner.api import _spec_for
from partita.planner.search import TrainConfig
from test_plans_match_single_process import ROOT

TRAIN = TrainConfig(global_batch=16)


def test_a_module_with_its_loss_fn_is_planned_with_that_loss():
    module, inputs, loss_fn = model()
    spec = _spec_for(module, inputs, loss_fn)
    assert spec.loss_fn is cross_entropy and spec.example_inputs(4)[0].shape == (4, 3, 16, 16)
    p = partita.plan(module, inputs, loss_fn=loss_fn, cluster="2xcpu", train=TRAIN, dp=2, micro_batch=8)
    assert p.mesh.dp == 2
    with pytest.raises(PartitaError, match="loss_fn goes with an nn.Module"):
        partita.plan("tiny-gpt", loss_fn=loss_fn, cluster="2xcpu", train=TRAIN)


def test_a_model_factory_plans_and_runs_through_the_api_like_one_process(tmp_path):
    p = partita.plan(model, cluster="2xcpu", train=TRAIN, dp=2, micro_batch=8)
    from examples.image_classifier import SmallCNN
    assert p.model["parameters"] == sum(t.numel() for t in SmallCNN().parameters())
    path, out = tmp_path / "plan.json", tmp_path / "out.json"
    p.save(path)
    done = rank_pool.shared().run(2, [str(out), str(path)], cwd=ROOT, timeout=300,
                                  script=ROOT / "tests" / "e2e" / "factory_job.py")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["verified"] is True and len(got["losses"]) == 3, got
    assert all(torch.isfinite(torch.tensor(got["losses"])))

"""Issue 46 item 5: a loss that couples the samples of a batch (CLIP / SimCLR contrastive losses, in-batch
negatives) is found at capture (costmodel.capture.coupling); per-sample losses (cross-entropy, MSE) and BatchNorm
models are not flagged. The plan and the run say it: tests/planner/test_batch_coupling_plan.py."""
import dataclasses

import pytest
import torch
from contrastive_models import (TwoTowers, batchnorm_mlp, centred_loss, classifier, clip_loss, listwise_loss, mlp,
                                mse_loss, towers)

from partita.costmodel.capture import capture


@pytest.mark.parametrize("loss, needle", [(clip_loss, "grows as the batch squared"),
                                          (listwise_loss, "runs along the batch dimension"),
                                          (centred_loss, "combines a statistic over the batch")])
def test_a_loss_that_couples_samples_is_flagged_at_capture(loss, needle):
    why = capture(towers(loss)).g.graph.get("batch_coupled")
    assert why is not None and needle in why, why


@pytest.mark.parametrize("spec", [towers(mse_loss), classifier(mlp), classifier(batchnorm_mlp)],
                         ids=["mse", "cross-entropy", "batchnorm"])
def test_per_sample_losses_and_batchnorm_are_not_flagged(spec):
    assert "batch_coupled" not in capture(spec).g.graph


def test_a_torch_compiled_model_is_judged_by_its_own_operators():
    spec = towers(clip_loss)
    compiled = dataclasses.replace(spec, name="compiled-towers", build=lambda: torch.compile(TwoTowers()))
    assert "grows as the batch squared" in capture(compiled).g.graph["batch_coupled"]

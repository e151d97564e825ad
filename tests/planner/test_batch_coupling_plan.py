"""Issue 46 item 5: a plan of a model whose loss couples the samples of a batch (costmodel.capture.coupling)
keeps why and shows one warning line saying what --dp does to it (the run prints it: tests/runtime)."""
from contrastive_models import clip_loss, mse_loss, towers

from partita.planner.api import plan
from partita.planner.enumerate.space import TrainConfig
from partita.planner.plan import Plan
from partita.planner.plan.explain import batch_coupling_warning


def test_the_plan_carries_the_coupling_and_says_what_dp_does_to_it(tmp_path):
    p = plan(towers(clip_loss), cluster="2xcpu", train=TrainConfig(global_batch=8, dtype="fp32"), dp=2)
    assert "grows as the batch squared" in p.model["batch_coupled"]
    p.save(tmp_path / "plan.json")
    loaded = Plan.load(tmp_path / "plan.json")  # kept in the file, validated on load
    line = batch_coupling_warning(loaded)  # what `partita run` prints before training, and `partita plan` shows
    assert "\n" not in line and line.startswith("warning: the loss couples the samples of a batch (mm makes")
    assert " ".join(loaded.explain().split()).count(line) == 1
    assert "--dp 2: each rank's loss sees only its own samples" in line and "--verify" in line
    assert f"over {p.schedule.micro_batch_size} samples at a time, not the global batch of 8" in line
    plain = plan(towers(mse_loss), cluster="2xcpu", train=TrainConfig(global_batch=8, dtype="fp32"), dp=2)
    assert "batch_coupled" not in plain.model and "couples the samples" not in plain.explain()

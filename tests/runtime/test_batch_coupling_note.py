"""Issue 46 item 5: `partita run` of a plan whose loss couples the samples of a batch says so before training."""
from contrastive_models import clip_loss, towers

from partita.planner.api import plan
from partita.planner.enumerate.space import TrainConfig
from partita.planner.plan.explain import batch_coupling_warning


def test_partita_run_says_it_before_training():
    """The run's preparation (every check before the first step) carries the warning into the notes the run
    prints before its progress lines."""
    from partita.runtime.loop.session import RunOptions, prepare
    spec = towers(clip_loss)
    p = plan(spec, cluster="2xcpu", train=TrainConfig(global_batch=8, dtype="fp32"), dp=2)
    notes = prepare(p, spec, RunOptions(steps=1, print_report=False), 2).notes
    assert batch_coupling_warning(p) in notes

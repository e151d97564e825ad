"""A pipeline's peak memory as the planner predicts it, against the CPU allocator on every rank (the largest).

torch.distributed.pipelining holds, per micro-batch in flight, what a stage received and, on the last stage,
the logits it outputs; a stage whose first backward comes before its micro-batches run out peaks at its
second backward when a micro-batch's activations weigh less than the stage's gradients; and the last stage's
loss gradients and the head's second gradient are not live at once (planner.estimate.phases). One torchrun launch
each (~10-15 s on 2 cores).
"""
import json

import pytest

from partita.costmodel import model_fingerprint
from partita.costmodel.hardware import parse_cluster
from partita.costmodel.models import resolve_model
from partita.costmodel.capture import capture
from partita.planner.estimate.build import build_plan
from partita.planner.search import SearchSpace, TrainConfig, search
from partita.runtime.launcher.checks import build_meta
from rank_pool import run_plan
from tests.e2e.test_plans_match_single_process import ROOT

MODEL = "gpt:layers=4,hidden=256,heads=4,seq=128,vocab=2048"


@pytest.mark.parametrize("pp,micro_batch,dtype,phase,schedule", [
    (2, 4, "fp32", "forward/backward", "1F1B"),  # the last stage: the logits held, the loss before the head's gradient
    (4, 2, "fp32", "second backward", "1F1B"),   # the first stage, gradients made, three micro-batches in flight
    (2, 4, "bf16", "forward/backward", "1F1B"),  # the same under autocast
    # 2 chunks per rank: the last rank holds 3 chunks at its peak (1.5 micro-batches of its layers) but only
    # one micro-batch of the head, logits and loss, which its last chunk runs forward and back at once
    (2, 2, "fp32", "forward/backward", "Interleaved1F1B"),
])
def test_pipeline_peak_is_the_allocators(tmp_path, pp, micro_batch, dtype, phase, schedule):
    spec = resolve_model(MODEL)
    space = SearchSpace(tp=(1,), pp=(pp,), dp=(1,), zero=(0,), recompute=("none",), offload=False,
                        micro_batch=(micro_batch,), virtual_stages=(2,) if schedule == "Interleaved1F1B" else None)
    result = search(capture(spec, dtype=dtype, autocast="cpu"), parse_cluster(f"{pp}xcpu"),
                    TrainConfig(global_batch=8, dtype=dtype, schedule=schedule), space=space)
    assert (result.best.schedule, result.best.virtual_stages) == (schedule, 2 if schedule != "1F1B" else 1)
    plan = build_plan(result, spec.name, model_fingerprint(build_meta(spec)), spec.config)
    largest = max(plan.predicted["memory_per_stage"], key=lambda r: r["total"])
    assert largest["phase"] == phase
    plan_file, out = tmp_path / "plan.json", tmp_path / "out.json"
    plan.save(plan_file)
    proc = run_plan(plan_file, MODEL, "--steps", "2", "--losses-out", str(out), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    measured = json.loads(out.read_text())["peak_memory_bytes"]
    assert abs(plan.predicted["peak_memory_bytes"] / measured - 1) <= 0.01

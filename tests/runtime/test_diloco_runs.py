"""DiLoCo's runtime hook (runtime.loop.sync.diloco.DiLoCo) on real 2-rank gloo runs, each rank its own island (the plan's
dp = 2 replicas, tests/rank_pool.py; tests/runtime/sync_job.py registers a probe that records each rank's
parameter checksum after every optimizer step). Seeds: the runs' default (--seed 0), plain SGD at lr 0.5.

- H = 1, outer lr 1, no momentum equals synchronous DP (the mean of one local SGD step from the same weights is
  the step on the mean gradient) within 1e-5 per step's loss.
- H = 4 with the published outer optimizer (Nesterov, lr 0.7, momentum 0.9): the replicas' parameters differ
  between outer steps and are identical right after each (steps 4 and 8); the losses are finite and fall on a
  learnable token file (next token = this one + 1 mod 16).
- 4 ranks in 2 islands of 2 (inner averaging on each island's group, outer all-reduce across): H = 1, outer lr 1,
  no momentum equals 4-rank synchronous DP within 1e-5.
- 4 ranks in 2 islands under ZeRO-3: FSDP shards over each island's 2 ranks alone (half the parameters per rank,
  not a quarter), and H = 1, outer lr 1, no momentum equals 4-rank synchronous ZeRO-3 within 1e-5; H = 2 does not.
  Streaming DiLoCo on those islands resumes bit for bit from a checkpoint with a fragment in flight (each shard's
  anchor and in-flight mean under its own keys, each island's sharded weights).
- At 4 bits (runtime.loop.sync.four_bit) the replicas agree after each outer step, bit for bit, and the first loss
  after the outer step is within 3% of the 32-bit run's.
- DiLoCo checkpoints after outer steps: a resumed run equals the uninterrupted one (each island's inner Adam state
  and the outer momentum are in the checkpoint); --checkpoint-every that is not a multiple of H is refused in one
  line before anything trains; so are --steps that are not a multiple of H (the replicas would end apart) and
  --verify outside the H = 1 identity.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "runtime"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
import rank_pool  # noqa: E402
from test_trainer_hooks import JOB, _plan_file  # noqa: E402

STEPS = 8
FLAGS = ["--model", "tiny-gpt", "--steps", str(STEPS), "--lr", "0.5", "--log-every", "0"]


def _run(tmp_path: Path, name: str, sync: dict | None, extra: tuple = ()) -> dict:
    plan, out = _plan_file(tmp_path, name, sync), tmp_path / name
    done = rank_pool.shared().run(2, [str(plan), *FLAGS, *extra, "--losses-out", str(out) + ".losses.json"], cwd=ROOT,
                                  env={"SYNC_JOB_OUT": str(out)}, timeout=300, script=JOB)
    if done.returncode:
        return {"code": done.returncode, "stderr": done.stderr}
    ranks = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(2)]
    return {"code": 0, "losses": json.loads((tmp_path / f"{name}.losses.json").read_text())["losses"], "ranks": ranks}


def _learnable(path: Path) -> Path:
    """A token file whose next token is always the current one plus 1 (mod 16): a task tiny-gpt learns in steps."""
    (np.arange(4096) % 16).astype(np.uint16).tofile(path)
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("diloco")
    probe, data = "diloco_probe", ("--data", str(_learnable(tmp / "tokens.bin")))
    return {"synchronous": _run(tmp, "synchronous", None),
            "h1": _run(tmp, "h1", {"mode": probe, "options": {"every": 1, "outer_lr": 1, "outer_momentum": 0}}),
            "h4": _run(tmp, "h4", {"mode": probe, "options": {"every": 4}}, data),
            "h4_bits4": _run(tmp, "h4_bits4", {"mode": probe, "options": {"every": 4, "bits": 4}}, data),
            "synchronous_learnable": _run(tmp, "synchronous_learnable", None, data)}


def test_h1_outer_lr_1_without_momentum_is_synchronous_dp(runs):
    sync, h1 = runs["synchronous"]["losses"], runs["h1"]["losses"]
    assert len(h1) == STEPS and max(abs(a - b) for a, b in zip(h1, sync)) < 1e-5, (h1, sync)


def test_h4_replicas_drift_between_outer_steps_and_agree_after_each(runs):
    sums = [{step: value for _, step, value in r["record"]} for r in runs["h4"]["ranks"]]
    for step in range(1, STEPS + 1):
        if step % 4:
            assert abs(sums[0][step] - sums[1][step]) > 1e-6, (step, sums)
        else:
            assert sums[0][step] == sums[1][step], (step, sums)
    losses = runs["h4"]["losses"]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses
    # the outer step moved the weights off the plain local-SGD path: not synchronous DP
    assert min(abs(a - b) for a, b in zip(losses[1:], runs["synchronous_learnable"]["losses"][1:])) > 1e-6


def test_a_4_bit_outer_exchange_leaves_the_replicas_equal_and_trains_like_the_32_bit_one(runs):
    """bits 4 (runtime.loop.sync.four_bit): the replicas are bit-identical right after each outer step and apart in
    between, as at 32 bits; the weights after the first outer step differ from the 32-bit run's (the change went
    in 4 bits), the losses up to it are that run's, the next one within 3% of it, and they fall. (Quality over
    a longer run: benchmarks.diloco_quality's 4-bit rows.)"""
    four, full = runs["h4_bits4"], runs["h4"]
    assert four["code"] == 0, four.get("stderr")
    sums = [{step: value for _, step, value in r["record"]} for r in four["ranks"]]
    full_sums = {step: value for _, step, value in full["ranks"][0]["record"]}
    for step in range(1, STEPS + 1):
        assert (sums[0][step] == sums[1][step]) == (step % 4 == 0), (step, sums)
    assert sums[0][4] != full_sums[4] and sums[0][3] == full_sums[3]
    losses = four["losses"]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses
    assert losses[:4] == full["losses"][:4] and abs(losses[4] / full["losses"][4] - 1) < 0.03, (losses, full["losses"])


def test_checkpoints_inside_a_window_are_refused_in_one_line(tmp_path):
    done = _run(tmp_path, "ckpt", {"mode": "diloco", "options": {"every": 2}},
                ("--checkpoint-every", "3", "--checkpoint-dir", str(tmp_path / "ck")))
    assert done["code"] != 0
    line = "--checkpoint-every 3 is not a multiple of the plan's diloco H = 2"
    assert line in done["stderr"], done["stderr"][-2000:]


def adam_runs(tmp_path: Path, sync: dict):
    """A 2-rank dp plan of tiny-gpt under Adam (lr 0.01) with `sync`, and a function that runs it for some steps
    with extra flags in the rank pool and returns the losses."""
    from test_plans_match_single_process import make_plan
    plan = make_plan(dp=2)
    plan["train"]["optimizer"] = "adam"
    plan["sync"] = sync
    path = tmp_path / f"{sync['mode']}.json"
    path.write_text(json.dumps(plan))

    def run(name: str, steps: int, *extra: str) -> list[float]:
        out = tmp_path / f"{name}.json"
        done = rank_pool.shared().run(2, [str(path), "--model", "tiny-gpt", "--steps", str(steps), "--lr", "0.01",
                                          "--log-every", "0", "--losses-out", str(out), *extra], cwd=ROOT, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(out.read_text())["losses"]
    return run


def test_a_resumed_diloco_run_equals_the_uninterrupted_one(tmp_path):
    """Adam inside each of 2 islands (one replica each: their moments differ), H = 2 with the published outer
    Nesterov step: 8 steps straight, against 4 steps + a checkpoint + 4 more resumed. The checkpoint holds each
    island's Adam state under its own keys and the outer momentum; the resumed losses are the same, bit for bit."""
    from partita.runtime.checkpoint import read_metadata
    run, ck = adam_runs(tmp_path, {"mode": "diloco", "options": {"every": 2}}), tmp_path / "ck"
    straight = run("straight", 8)
    first = run("first", 4, "--checkpoint-dir", str(ck), "--checkpoint-every", "2")
    keys = set(read_metadata(ck / "step-00000004").state_dict_metadata)
    for island in (0, 1):
        assert any(k.startswith(f"sync.diloco.island{island}.optim.") and k.endswith(".exp_avg") for k in keys)
    assert any(k.startswith("sync.diloco.outer.") and k.endswith(".momentum_buffer") for k in keys)
    resumed = run("resumed", 8, "--checkpoint-dir", str(ck), "--resume")
    assert first == straight[:4] and resumed == straight[4:], (straight, first, resumed)


def test_two_islands_of_two_replicas_h1_is_synchronous_dp(tmp_path):
    """4 ranks in 2 islands of 2 (option islands = 2): inner gradients averaged over each island's own group,
    the outer all-reduce over the peers in the other island; H = 1, outer lr 1, no momentum is synchronous DP."""
    from test_plans_match_single_process import make_plan
    losses = {}
    for name, sync in (("sync4", None),
                       ("islands4", {"mode": "diloco", "options": {"every": 1, "outer_lr": 1, "outer_momentum": 0,
                                                                   "islands": 2}})):
        plan = make_plan(dp=4)
        plan["train"]["optimizer"] = "sgd"
        if sync:
            plan["sync"] = sync
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(plan))
        out = tmp_path / f"{name}.losses.json"
        done = rank_pool.shared().run(4, [str(path), *FLAGS[:3], "4", *FLAGS[4:], "--losses-out", str(out)],
                                      cwd=ROOT, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        losses[name] = json.loads(out.read_text())["losses"]
    assert max(abs(a - b) for a, b in zip(losses["islands4"], losses["sync4"])) < 1e-5, losses


def test_flags_diloco_cannot_honour_are_one_line_each():
    from partita.planner.plan.sync import Sync
    from partita.runtime.loop.sync import run_refusal
    diloco = Sync(mode="diloco", options={"every": 4})
    assert run_refusal(diloco, 0, 8) is None and run_refusal(Sync(), 2, 7, True) is None
    assert "not a multiple of the plan's diloco H = 4" in run_refusal(diloco, 0, 10)
    assert "run 8 steps" in run_refusal(diloco, 0, 10)
    assert "--checkpoint-every 2 is not a multiple of the plan's diloco H = 4" in run_refusal(diloco, 2, 8)
    assert "use --checkpoint-every 4" in run_refusal(diloco, 2, 8) and run_refusal(diloco, 8, 8) is None
    assert "--verify compares with single-process training" in run_refusal(diloco, 0, 8, True)
    assert run_refusal(Sync(mode="diloco", options={"every": 1, "outer_lr": 1, "outer_momentum": 0}), 0, 3, True) is None


def _fsdp_islands(tmp_path: Path, name: str, sync: dict | None, optimizer: str, steps: int, *extra: str,
                  lr: str = "0.5") -> list[float]:
    """4 ranks, ZeRO-3 (FSDP2): with `sync`, 2 islands of 2 replicas, FSDP sharding each island's pair alone. The
    losses; the run's `applied` record goes to APPLIED[name]."""
    report = _four_ranks(tmp_path, name, sync, optimizer, steps, *extra, lr=lr, dp=4, zero=3)
    APPLIED[name] = report["applied"]
    return report["losses"]


def _four_ranks(tmp_path: Path, name: str, sync: dict | None, optimizer: str, steps: int, *extra: str, lr: str,
                dp: int, tp: int = 1, zero: int = 0, pp: int = 1) -> dict:
    """A 4-rank run of tiny-gpt on pp x dp x tp at `zero` (pp > 1: 2 micro-batches of 2, 1F1B), with the `sync`
    section (None: synchronous): its --losses-out report."""
    from test_plans_match_single_process import make_plan
    plan = make_plan(dp=dp, tp=tp, pp=pp, micro=2 if pp > 1 else 1)
    plan["train"]["optimizer"] = optimizer
    if zero:
        plan["zero_stage"] = zero
    if sync:
        plan["sync"] = sync
    path, out = tmp_path / f"{name}.json", tmp_path / f"{name}.losses.json"
    path.write_text(json.dumps(plan))
    done = rank_pool.shared().run(4, [str(path), "--model", "tiny-gpt", "--steps", str(steps), "--lr", lr,
                                      "--log-every", "0", "--losses-out", str(out), *extra], cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


APPLIED: dict[str, dict] = {}


def test_fsdp_inside_two_islands_h1_is_synchronous_zero3(tmp_path):
    """ZeRO-3 inside each of 2 islands (FSDP's reduce-scatter over the island's 2 ranks), the outer all-reduce of
    each shard across the islands: H = 1, outer lr 1, no momentum is 4-rank synchronous ZeRO-3 within 1e-5."""
    identity = {"mode": "diloco", "options": {"every": 1, "outer_lr": 1, "outer_momentum": 0, "islands": 2}}
    sync = _fsdp_islands(tmp_path, "zero3", None, "sgd", 4)
    islands = _fsdp_islands(tmp_path, "zero3_islands", identity, "sgd", 4)
    assert max(abs(a - b) for a, b in zip(islands, sync)) < 1e-5, (islands, sync)
    # FSDP shards over the island's 2 ranks, not all 4: each rank holds half the parameters, not a quarter
    assert APPLIED["zero3_islands"]["local_params"] == 2 * APPLIED["zero3"]["local_params"], APPLIED
    # the outer step matters: H = 2 with the published outer step is another run
    h2 = _fsdp_islands(tmp_path, "zero3_h2", {"mode": "diloco", "options": {"every": 2, "islands": 2}}, "sgd", 4)
    assert abs(h2[0] - sync[0]) < 1e-5 and min(abs(a - b) for a, b in zip(h2[2:], sync[2:])) > 1e-4, (h2, sync)


def test_streaming_on_fsdp_islands_resumes_exactly_with_a_fragment_in_flight(tmp_path):
    """Streaming DiLoCo (H = 4, 2 fragments, delay 1, alpha 0.5) on ZeRO-3 islands of 2 ranks, Adam: 8 steps straight
    against 4 (the checkpoint after step 4 holds fragment 0's all-reduce in flight, every shard's anchor and each
    island's sharded weights) and 4 more resumed -- the same losses, bit for bit."""
    from partita.runtime.checkpoint import read_metadata
    ck = tmp_path / "ck"
    sync = {"mode": "streaming", "options": {"every": 4, "fragments": 2, "delay": 1, "alpha": 0.5, "islands": 2}}
    straight = _fsdp_islands(tmp_path, "straight", sync, "adam", 8, lr="0.01")
    first = _fsdp_islands(tmp_path, "first", sync, "adam", 4, "--checkpoint-dir", str(ck), "--checkpoint-every", "2",
                          lr="0.01")
    keys = set(read_metadata(ck / "step-00000004").state_dict_metadata)
    assert {"sync.streaming.pending.wire.0.shard0", "sync.streaming.pending.wire.0.shard1",
            "sync.streaming.anchor.0.shard1"} <= keys
    assert any(k.startswith("sync.streaming.island1.param.") for k in keys)
    resumed = _fsdp_islands(tmp_path, "resumed", sync, "adam", 8, "--checkpoint-dir", str(ck), "--resume", lr="0.01")
    assert first == straight[:4] and resumed == straight[4:], (straight, first, resumed)


LAYOUTS = {"tp": {"tp": 2}, "pp": {"pp": 2}}
"""4 ranks, 2 data-parallel replicas of tp = 2 or pp = 2 (zero 0: the executor averages the gradients)."""


def _model_parallel_islands(tmp_path: Path, name: str, layout: str, sync: dict | None, optimizer: str, steps: int,
                            *extra: str, lr: str = "0.5") -> list[float]:
    """4 ranks, `layout` (LAYOUTS) inside each of dp = 2 replicas; with `sync`, each replica its own island. The
    losses."""
    return _four_ranks(tmp_path, name, sync, optimizer, steps, *extra, lr=lr, dp=2, **LAYOUTS[layout])["losses"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_model_parallel_islands_h1_is_synchronous_and_h2_is_not(tmp_path, layout):
    """DiLoCo composes with tensor and with pipeline parallelism (zero 0): 2 islands of one tp = 2 (pp = 2) replica
    each, every rank's outer all-reduce over the rank holding the same shard (stage) in the other island. H = 1,
    outer lr 1, no momentum under SGD is synchronous training of the same plan within 1e-5; H = 2 with the
    published outer step is another run, and so is local SGD at H = 2 (the islands' gradients are kept apart)."""
    sync = _model_parallel_islands(tmp_path, "sync", layout, None, "sgd", 4)
    identity = {"mode": "diloco", "options": {"every": 1, "outer_lr": 1, "outer_momentum": 0}}
    islands = _model_parallel_islands(tmp_path, "islands", layout, identity, "sgd", 4)
    assert len(sync) == 4 and max(abs(a - b) for a, b in zip(islands, sync)) < 1e-5, (islands, sync)
    h2 = _model_parallel_islands(tmp_path, "h2", layout, {"mode": "diloco", "options": {"every": 2}}, "sgd", 4)
    assert abs(h2[0] - sync[0]) < 1e-5 and min(abs(a - b) for a, b in zip(h2[2:], sync[2:])) > 1e-4, (h2, sync)
    # the islands train apart between outer steps: the replicas' mean every 2 steps is not synchronous training
    # (it would be, step for step, were the gradients averaged over both islands)
    apart = _model_parallel_islands(tmp_path, "apart", layout, {"mode": "localsgd", "options": {"every": 2}}, "sgd", 4)
    assert abs(apart[0] - sync[0]) < 1e-5 and min(abs(a - b) for a, b in zip(apart[2:], sync[2:])) > 1e-6, (apart, sync)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_streaming_on_model_parallel_islands_resumes_exactly(tmp_path, layout):
    """Streaming DiLoCo (H = 4, 2 fragments, delay 1) on 2 islands of a tp = 2 (pp = 2) replica, Adam: each tp rank's
    (stage's) anchor and in-flight mean under its own keys; 8 steps straight equal 4 and 4 more resumed, bit for
    bit."""
    from partita.runtime.checkpoint import read_metadata
    ck = tmp_path / "ck"
    sync = {"mode": "streaming", "options": {"every": 4, "fragments": 2, "delay": 1, "alpha": 0.5}}

    def run(name: str, steps: int, *extra: str) -> list[float]:
        return _model_parallel_islands(tmp_path, name, layout, sync, "adam", steps, *extra, lr="0.01")

    straight = run("straight", 8)
    first = run("first", 4, "--checkpoint-dir", str(ck), "--checkpoint-every", "2")
    keys = set(read_metadata(ck / "step-00000004").state_dict_metadata)
    assert {f"sync.streaming.anchor.0.{layout}0", f"sync.streaming.anchor.0.{layout}1",
            f"sync.streaming.pending.wire.0.{layout}1"} <= keys, sorted(keys)
    resumed = run("resumed", 8, "--checkpoint-dir", str(ck), "--resume")
    assert first == straight[:4] and resumed == straight[4:], (straight, first, resumed)


def test_localsgd_is_the_replicas_mean_every_h_steps(tmp_path):
    """--sync localsgd (DiLoCo's outer step at lr 1 without momentum): every H = 4 steps the replicas' parameters
    become their mean, as tests/runtime/sync_job.py's toy local SGD makes them by a plain all-reduce of the
    parameters -- the same losses within 1e-5 -- and not DiLoCo's with the published outer step."""
    data = ("--data", str(_learnable(tmp_path / "tokens.bin")))
    real = _run(tmp_path, "localsgd", {"mode": "localsgd", "options": {"every": 4}}, data)
    toy = _run(tmp_path, "toy", {"mode": "local_sgd", "options": {"every": 4}}, data)
    published = _run(tmp_path, "diloco", {"mode": "diloco", "options": {"every": 4}}, data)
    assert real["code"] == toy["code"] == published["code"] == 0, (real, toy, published)
    assert len(real["losses"]) == STEPS and max(abs(a - b) for a, b in zip(real["losses"], toy["losses"])) < 1e-5
    # the same until the first outer step (after step 4) moves the weights, apart from then on
    assert real["losses"][:4] == published["losses"][:4]
    assert min(abs(a - b) for a, b in zip(real["losses"][4:], published["losses"][4:])) > 1e-6, (real, published)

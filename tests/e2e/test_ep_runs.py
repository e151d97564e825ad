"""Expert-parallel plans (mesh.ep, runtime/parallel/ep.py) run under torchrun on gloo and train like one process (fp32:
1e-5 over 3 steps): partita's tiny-moe (DDP and ZeRO-3 for the dense parameters) and a tiny HuggingFace
Mixtral, ep = dp = 2 (~13 s and ~6 s on 2 cores); ep = 2 of dp = 4 (slow: 4 ranks).

Adam is invariant to a constant factor on a tensor's gradient, so the expert-gradient factor (runtime.parallel.ep: the
replica group's sum / dp) is pinned by SGD runs, and a run with the wrong factor must fail --verify. Several
plans share one launch (this file is also the torchrun worker: `python -m torch.distributed.run ...
tests/e2e/test_ep_runs.py OUT STEPS BUG=PLAN ...`). Pieces of ep in one process group: tests/runtime/test_ep.py.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_plans_match_single_process import ROOT, STEPS, _direct, _env, _one_line, launch  # noqa: E402

MIXTRAL = ("hf:mixtral:num_hidden_layers=2,hidden_size=64,intermediate_size=96,num_attention_heads=4,"
           "num_key_value_heads=2,vocab_size=256,num_local_experts=4,num_experts_per_tok=2,seq=32")
BUGS = ("none", "replica-mean", "fsdp-replica-mean")
"""replica-mean: expert gradients averaged over the replica group (same ep index) instead of summed there and
divided by dp -- ep times too large (zero_stage 0: runtime.parallel.ep.sync_expert_grads). fsdp-replica-mean: the same
with ZeRO 2/3, where the experts' FSDP units reduce-scatter over the replica group (FSDP's default divide
factor, not runtime.parallel.ep's dp)."""


def ep_plan(model: str = "tiny-moe", *, ep: int = 2, dp: int = 2, optimizer: str = "adam", micro: int = 1,
            recompute: dict | None = None) -> dict:
    """A plan dict with mesh.ep = ep, as `partita plan --ep` makes it (zero 0, no tp/pp), its micro-batching
    and recompute then set by hand."""
    from partita.planner.api import plan
    from partita.planner.plan import Plan
    from partita.planner.search import SearchSpace, TrainConfig
    p = plan(model, cluster=f"{dp}xcpu", train=TrainConfig(global_batch=2 * dp, dtype="fp32", optimizer=optimizer),
             space=SearchSpace(tp=(1,), pp=(1,), dp=(dp,), ep=(ep,), zero=(0,), recompute=("none",), offload=False))
    d = p.to_dict()
    assert d["mesh"]["ep"] == ep and d["predicted"]["breakdown"]["ep_comm_s"] > 0
    d["schedule"].update(num_microbatches=micro, micro_batch_size=2 // micro)
    for block in d["blocks"]:
        block["recompute"] = (recompute or {}).get(block["fqn"], block["recompute"])
    Plan.from_dict(d)  # the runtime's validation
    return d


@pytest.fixture(scope="module")
def plans() -> dict[str, dict]:
    return {
        "moe-adam-accum2-recompute": ep_plan(micro=2, recompute={"blocks.0": "full", "blocks.1": "selective"}),
        "moe-sgd": ep_plan(optimizer="sgd"),
        "moe-sgd-zero3": {**ep_plan(optimizer="sgd"), "zero_stage": 3},
    }


def test_tiny_moe_ep2_verifies_through_the_cli(tmp_path, plans):
    proc, out = launch(tmp_path, plans["moe-adam-accum2-recompute"], 2, "tiny-moe")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert out["verified"] is True and out["max_abs_diff"] <= 1e-5, out
    assert out["applied"]["expert_layers"] == 2 and out["applied"]["recompute"] == {"blocks.0": "full",
                                                                                   "blocks.1": "selective"}
    assert "(pp=1 dp=2 ep=2 tp=1" in proc.stdout and "verify: OK" in proc.stdout
    # every expert counted once in the checksum, though its shard lives on one rank of the ep group
    assert out["param_checksum"] == pytest.approx(out["reference_param_checksum"], rel=1e-6)
    print(f"max_abs_diff={out['max_abs_diff']:.2e}; {[c['diff'] for c in out['checks']]}")


def test_partita_plan_ep2_then_run_verifies_a_tiny_mixtral(tmp_path):
    """The command lines of the issue: `partita plan --model MIXTRAL --ep 2` on 2 CPU processes, then
    `partita run PLAN --model MIXTRAL --verify` -- the CLI in this process, the run's ranks on the test session's
    gloo workers (tests/rank_pool.py: the workers' own entry point; the launcher is tested elsewhere)."""
    import rank_pool  # not at the top: torchrun runs this file as a worker, without tests/ on its path
    plan_file, out = tmp_path / "ep2.json", tmp_path / "out.json"
    made = rank_pool.cli("plan", "--model", MIXTRAL, "--cluster", "2xcpu", "--global-batch", "4", "--ep", "2",
                         "--out", str(plan_file), cwd=ROOT)
    assert made.returncode == 0 and json.loads(plan_file.read_text())["mesh"]["ep"] == 2, made.stdout + made.stderr
    run = rank_pool.run_plan(plan_file, MIXTRAL, "--steps", str(STEPS), "--verify", "--losses-out", str(out), cwd=ROOT)
    assert run.returncode == 0 and "verify: OK" in run.stdout, run.stdout + run.stderr
    r = json.loads(out.read_text())
    assert r["verified"] is True and r["max_abs_diff"] <= 1e-5 and len(r["losses"]) == STEPS, r


def test_expert_gradient_factor_and_hf_mixtral(tmp_path, plans):
    """One launch: SGD with the right factor verifies, SGD with the wrong one fails; HF Mixtral verifies."""
    runs = [("none", "moe-sgd"), ("replica-mean", "moe-sgd"), ("none", "moe-sgd-zero3"),
            ("fsdp-replica-mean", "moe-sgd-zero3"), ("none", "mixtral-adam")]
    results = _launch_worker(tmp_path, 2, {**plans, "mixtral-adam": ep_plan(MIXTRAL)}, runs)
    for name in ("moe-sgd", "moe-sgd-zero3"):
        assert results[f"none={name}"]["verified"] is True, results[f"none={name}"]
    assert results["none=moe-sgd-zero3"]["applied"]["fsdp_units"] > 0
    for bad in (results["replica-mean=moe-sgd"], results["fsdp-replica-mean=moe-sgd-zero3"]):
        assert bad["verified"] is False, bad
        failed = [c for c in bad["checks"] if not c["passed"]]
        assert any("experts" in c["worst"] for c in failed), failed  # the expert tensors are what moved wrongly
    mixtral = results["none=mixtral-adam"]
    assert mixtral["verified"] is True and mixtral["max_abs_diff"] <= 1e-5, mixtral
    assert mixtral["applied"]["expert_layers"] == 2
    print({k: (r["max_abs_diff"], [c["diff"] for c in r["checks"]]) for k, r in results.items()})


@pytest.mark.slow
def test_ep2_of_dp4_sums_expert_gradients_over_the_replicas(tmp_path):
    """dp = 4, ep = 2: two ep groups hold each expert; their gradients are summed across the groups / dp."""
    plans = {"moe-sgd-dp4": ep_plan(dp=4, optimizer="sgd")}
    results = _launch_worker(tmp_path, 4, plans, [("none", "moe-sgd-dp4"), ("replica-mean", "moe-sgd-dp4")])
    assert results["none=moe-sgd-dp4"]["verified"] is True, results["none=moe-sgd-dp4"]
    assert results["replica-mean=moe-sgd-dp4"]["verified"] is False
    print({k: (r["max_abs_diff"], [c["diff"] for c in r["checks"]]) for k, r in results.items()})


def test_unsupported_ep_plans_exit_2_in_one_line(tmp_path, plans):
    plan = {**plans["moe-sgd"], "mesh": {"pp": 1, "dp": 2, "cp": 1, "tp": 2, "ep": 2}}
    proc = _direct(tmp_path, plan, "tiny-moe", "--check")
    assert proc.returncode == 2 and "ep=2 with tp=2 is not run by partita's runtime" in _one_line(proc)


def test_checkpoints_of_ep_runs_are_refused(tmp_path, plans):
    proc = _direct(tmp_path, plans["moe-sgd"], "tiny-moe", "--check", "--checkpoint-dir", str(tmp_path / "ck"))
    assert proc.returncode == 2 and "checkpoints of expert-parallel runs" in _one_line(proc)


def _launch_worker(tmp_path: Path, ranks: int, plans: dict, runs: list[tuple[str, str]]) -> dict:
    paths = {}
    for name, plan in plans.items():
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(plan))
    out = tmp_path / "results.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", __file__,
           str(out), str(STEPS), *(f"{bug}={paths[name]}" for bug, name in runs)]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())


def _replica_mean(original):
    """runtime.parallel.ep.sync_expert_grads with the wrong factor: the replica group's mean instead of its sum / dp."""
    from partita.runtime.parallel import ep

    def sync(params):
        original(params)
        shards = [p for p in params if hasattr(p, ep.EP_ATTR)]
        if shards:
            g = getattr(shards[0], ep.EP_ATTR)
            for p in shards:
                p.grad.mul_(g.dp / g.n_replicas)
    return sync


def _worker(out: str, steps: int, runs: list[str]) -> None:
    """Each BUG=PLAN run with runtime.run(verify=True) in one process group; rank 0 writes the summaries."""
    import torch.distributed as dist

    import partita.runtime as runtime
    from partita.runtime.parallel import ep
    from partita.runtime.launcher.mesh import init_default
    from tests.runtime.spawned import teardown

    init_default()
    from torch.distributed.fsdp import FSDPModule
    right, divide, results = ep.sync_expert_grads, FSDPModule.set_gradient_divide_factor, {}
    for item in runs:
        bug, _, path = item.partition("=")
        assert bug in BUGS, bug
        ep.sync_expert_grads = _replica_mean(right) if bug == "replica-mean" else right
        FSDPModule.set_gradient_divide_factor = (lambda self, factor: None) if bug == "fsdp-replica-mean" else divide
        model = json.loads(Path(path).read_text())["model"]["name"]
        try:
            r = runtime.run(path, model, steps=steps, verify=True, print_report=False)
        except runtime.VerifyFailed as e:  # raised on every rank; the run is attached
            r = e.result
        results[f"{bug}={Path(path).stem}"] = {
            "verified": r.verified, "losses": r.losses, "reference_losses": r.reference_losses,
            "max_abs_diff": r.max_abs_diff, "checks": [c.as_dict() for c in r.checks], "applied": r.applied}
    ep.sync_expert_grads, FSDPModule.set_gradient_divide_factor = right, divide
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(results, indent=2))
    teardown()  # every rank's collectives done before any tears down


if __name__ == "__main__":
    _worker(sys.argv[1], int(sys.argv[2]), sys.argv[3:])

"""`partita run --nnodes 2 --rdzv-endpoint HOST:PORT`: two local "nodes" (two separate `partita run`
commands, 2 CPU processes each) join one 4-rank job through torchrun's c10d rendezvous, train a dp x tp plan
under --verify (fp32: losses within 1e-5 of one process), and recover from a rank killed on one node: both
nodes restart and resume from the shared checkpoint directory with unchanged losses. One launch does both
(`slow`: 30-60 s on 2 shared cores); the clean two-node run used to be a launch of its own.

On CUDA machines with 2 GPUs the same two-node run goes through NCCL (one GPU per node process).
"""
from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

from rank_pool import free_port
from test_plan_elements import element_plan  # sibling test modules
from test_plans_match_single_process import ROOT, _env, make_plan


def two_nodes(tmp_path: Path, plan: dict, *args: str, env: dict | None = None, node_env=({}, {}),
              timeout: float = 300):
    """The same `partita run` on two "nodes" (`node_env`: each node's own variables); returns
    [(exit code, stdout, stderr, losses-out JSON or None)] per node."""
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))
    endpoint, job = f"127.0.0.1:{free_port()}", f"partita-test-{uuid.uuid4().hex[:8]}"
    procs, files = [], []
    for node in range(2):
        out, err = open(tmp_path / f"node{node}.out", "w+"), open(tmp_path / f"node{node}.err", "w+")
        cmd = [sys.executable, "-m", "partita.cli", "run", str(plan_file), "--model", "tiny-gpt", *args,
               "--nnodes", "2", "--rdzv-endpoint", endpoint, "--rdzv-id", job,
               "--losses-out", str(tmp_path / f"node{node}.json")]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=_env(**(env or {}), **node_env[node]), stdout=out, stderr=err, text=True))
        files.append((out, err))
    results = []
    try:
        for node, (p, (out, err)) in enumerate(zip(procs, files)):
            code = p.wait(timeout=timeout)
            out.seek(0), err.seek(0)
            losses = tmp_path / f"node{node}.json"
            results.append((code, out.read(), err.read(), json.loads(losses.read_text()) if losses.exists() else None))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for out, err in files:
            out.close(), err.close()
    return results


def the_report(results) -> tuple[str, dict]:
    """Global rank 0 runs on one of the nodes: exactly one prints the report and writes --losses-out."""
    reports = [(stdout, losses) for _, stdout, _, losses in results if losses is not None]
    assert len(reports) == 1, results
    assert sum("partita run:" in stdout for _, stdout, _, _ in results) == 1, results
    return reports[0]


@pytest.mark.slow
def test_a_rank_killed_on_one_node_restarts_both_nodes_from_the_shared_checkpoint(tmp_path):
    """Two nodes of two processes train a dp x tp plan under --verify, and global rank 3 dies in step 2 (after
    the step-1 checkpoint). Its node's agent restarts its workers; the
    other node's workers lose their peer and restart too (possibly without counting a restart: the attempt
    number is agreed across nodes, runtime.launcher.mesh.agree_on_attempt). Every rank resumes from step 1 and the
    losses of steps 2-3 are those of one uninterrupted process."""
    ck = tmp_path / "ck"
    results = two_nodes(tmp_path, make_plan(dp=2, tp=2), "--steps", "3", "--verify", "--checkpoint-dir", str(ck),
                        "--checkpoint-every", "1", "--max-restarts", "1", env={"PARTITA_FAULT": "rank=3,step=2"})
    for code, stdout, stderr, _ in results:
        assert code == 0, stdout + stderr
    stderr = "".join(err for _, _, err, _ in results)
    assert "rank 3 dies during step 2" in stderr
    assert "torchrun restarts the workers" in stderr
    stdout, out = the_report(results)
    assert "tiny-gpt on 4 rank(s) (pp=1 dp=2 tp=2" in stdout
    assert out["first_step"] == 1 and out["resumed_from"] == str(ck / "step-00000001"), out
    assert len(out["losses"]) == 2 and out["max_abs_diff"] <= 1e-5 and out["verified"], out
    assert sorted(p.name for p in ck.iterdir() if p.name.startswith("step-")) == \
        ["step-00000001", "step-00000002", "step-00000003"]
    print(f"restart across nodes: attempt {out['attempt']}, max_abs_diff={out['max_abs_diff']:.2e}\n{stderr}")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices (one per node process)")
def test_two_nodes_on_cuda_use_nccl_bf16_fsdp_and_pinned_offload(tmp_path):
    """Each "node" sees one GPU (CUDA_VISIBLE_DEVICES) and runs one process on cuda:LOCAL_RANK; NCCL joins
    them; ZeRO-3 in bf16 (FSDP2 MixedPrecisionPolicy) with one block's states offloaded to pinned host memory."""
    plan = element_plan(zero=3, dp=2, dtype="bf16", choices={"blocks.1": {"offload_states": True}})
    results = two_nodes(tmp_path, plan, "--steps", "3", "--verify",
                        node_env=({"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}))
    for code, stdout, stderr, _ in results:
        assert code == 0, stdout + stderr
    stdout, out = the_report(results)
    assert "nccl/cuda" in stdout and out["verified"], stdout
    assert out["memory_method"] == "torch.cuda.max_memory_allocated"
    assert out["applied"]["offload_states"] == ["blocks.1"], out["applied"]

"""Elastic runs (`partita run SET_DIR --nnodes MIN:MAX`, runtime.launcher.elastic): local "nodes" (`partita run`
commands, one CPU process each) train tiny-gpt from a plan set of a 2-node and a 3-node plan with the same global
batch, checkpointing to disk after every 4th step and into the nodes' memory after every step (`--snapshot-every 1`,
runtime.checkpoint.snapshot). The job starts on 2 nodes; a third joins in step 3 and the job grows to 3 nodes from
the checkpoint of the step it stopped at -- before any failure, so torchrun has counted no restart. In step 7 one
node is killed outright (SIGKILL to its launcher, agent and worker at once); the two left re-plan and go on from the
snapshot of step 5 or 6 in the survivors' memory (the killed rank's copy of step 6 may not have reached the next
node), which no checkpoint on disk holds (step 4 is the newest there).
The last round runs under --verify: its losses are one uninterrupted process's (fp32: within 1e-5), so no sample
was skipped or read twice across the growth and the shrink. `slow`: about a minute on 2 shared cores.
"""
from __future__ import annotations

import contextlib
import json
import re
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from rank_pool import free_port
from test_plans_match_single_process import ROOT, _env, make_plan

STEPS = 10


def plan_set(directory: Path) -> Path:
    """nodes-2.json (dp=2, 3 micro-batches of 2) and nodes-3.json (dp=3, 2 of 2): global batch 12 at both sizes."""
    directory.mkdir()
    for nodes, micro, step_time in ((2, 3, 0.015), (3, 2, 0.010)):
        plan = make_plan(dp=nodes, micro=micro)
        plan["cluster"] = {"spec": f"{nodes}x1cpu", "num_devices": nodes, "devices_per_node": 1}
        plan["predicted"]["step_time_s"] = step_time
        (directory / f"nodes-{nodes}.json").write_text(json.dumps(plan))
    return directory


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out += [int(entry), *_children(int(entry))]
    return out


def _stopped_under(pid: int) -> int | None:
    """A process under `pid` stopped by a signal (state T), or None."""
    for p in _children(pid):
        try:
            if Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T":
                return p
        except OSError:
            pass
    return None


def kill_node(node: subprocess.Popen) -> None:
    """A node lost outright: its launcher, agent and workers SIGKILLed at once."""
    for p in [*_children(node.pid), node.pid]:
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            os.kill(p, signal.SIGKILL)
    node.wait()


def _listening(port: int) -> bool | None:
    with socket.socket() as s:
        return True if s.connect_ex(("127.0.0.1", port)) == 0 else None


def _pending(pid: int, sig: int) -> bool:
    """Whether `sig` waits to be delivered to process `pid` (a stopped process takes it when continued)."""
    status = Path(f"/proc/{pid}/status").read_text()
    masks = [int(line.split()[1], 16) for line in status.splitlines() if line.startswith(("SigPnd:", "ShdPnd:"))]
    return any(m >> (sig - 1) & 1 for m in masks)


def _wait(what, timeout: float = 120.0, procs=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (found := what()) is not None:
            return found
        assert all(p.poll() is None for p in procs), "a node ended before the test's next step"
        time.sleep(0.2)
    raise AssertionError("timed out")


def start_node(tmp_path: Path, i: int, sets: Path, port: int, job: str, env: dict, *flags: str,
               checkpoint_every: int = 1) -> subprocess.Popen:
    """Local node `i` of an elastic job on plan set `sets` (a `partita run --nnodes 2:3` of STEPS steps, checkpoints
    after every `checkpoint_every` steps, --verify), its output in node<i>.out/.err and its losses in node<i>.json."""
    cmd = [sys.executable, "-m", "partita.cli", "run", str(sets), "--model", "tiny-gpt", "--steps", str(STEPS),
           "--nnodes", "2:3", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", job,
           "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", str(checkpoint_every), "--verify",
           "--losses-out", str(tmp_path / f"node{i}.json"), *flags]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(tmp_path / f"node{i}.out", "w"),
                            stderr=open(tmp_path / f"node{i}.err", "w"))


@contextlib.contextmanager
def running_nodes(tmp_path: Path):
    """Yields the list the test puts its nodes in: an AssertionError inside carries every node's output, and the
    nodes still running are killed on the way out, with their agents and workers (`kill_node`)."""
    nodes: list[subprocess.Popen] = []
    try:
        yield nodes
    except AssertionError as e:
        raise AssertionError(f"{e}: {_logs(tmp_path)}") from None
    finally:
        for p in nodes:
            if p.poll() is None:
                kill_node(p)


def _logs(tmp_path: Path) -> dict:
    return {f.name: f.read_text() for f in sorted(tmp_path.iterdir()) if f.suffix in (".out", ".err")}


@pytest.mark.slow
def test_a_node_joining_then_one_lost_replan_and_the_losses_stay_one_process(tmp_path):
    sets, ck = plan_set(tmp_path / "set"), tmp_path / "ck"
    port, job = free_port(), f"partita-test-{uuid.uuid4().hex[:8]}"
    env = _env(PARTITA_FAULT="sigstop,rank=1,step=3;sigstop,rank=2,step=7", PARTITA_SNAPSHOT_ROOT=str(tmp_path))

    def node(i: int) -> subprocess.Popen:
        # node 0 lets no joining node in for 600 s: only node 1's agent sees node 2 wait and stops its workers,
        # and node 0's workers stop after the same step by the ranks' stop vote -- which its agent must take for the
        # membership change it is, not the job's end (runtime.launcher.leave.leaving; agents that poll late under
        # load did this by chance)
        return start_node(tmp_path, i, sets, port, job, env, "--rescale-every", "600" if i == 0 else "0",
                          "--snapshot-every", "1", checkpoint_every=4)

    # node 0 first: it hosts the rendezvous store (so it must not be the node lost) and, with the lowest agent
    # pid, is rank 0 (torch sorts the nodes by address and pid)
    with running_nodes(tmp_path) as nodes:
        nodes.append(node(0))
        _wait(lambda: _listening(port), procs=nodes)
        nodes.append(node(1))  # MIN nodes: the first round closes after the last call, with 2
        stopped = _wait(lambda: _stopped_under(nodes[1].pid), procs=nodes)  # rank 1 paused in step 3
        nodes.append(node(2))
        # node 1's agent sees node 2 waiting and stops its workers for a new round: SIGTERM, which the paused rank
        # takes once it goes on -- every rank stops after the same step (the stop vote) and checkpoints it: step 3,
        # or step 4 when the vote comes after rank 0 passed step 3's. No failure has happened: torchrun counts no
        # restart, node 0's agent meets the others again though it saw nobody wait, and only the agents' round
        # count makes the round continue
        _wait(lambda: True if _pending(stopped, signal.SIGTERM) else None, procs=nodes)
        os.kill(stopped, signal.SIGCONT)
        # on 3 nodes from step 3, rank 2 pauses in step 7 after its backward: every rank has passed step 6's
        # optimizer step, which waited for its copy of step 5 (sent and received); its node (1 or 2) dies --
        # launcher, agent, worker at once
        lost = _wait(lambda: next((i for i in (1, 2) if _stopped_under(nodes[i].pid)), None), procs=nodes)
        kill_node(nodes[lost])
        kept = [nodes[0], nodes[3 - lost]]
        codes = [p.wait(timeout=300) for p in kept]
    outputs = _logs(tmp_path)
    assert codes == [0, 0], outputs
    stderr = "".join(v for k, v in outputs.items() if k.endswith(".err"))
    joined = re.search(r"partita: 1 node\(s\) joined before step (\d+): re-planned for 3 nodes \(pp=1 dp=3 tp=1, "
                       r"predicted 1\.50x the 2-node throughput\); resumed from step (\d+)\n", stderr)
    assert joined and joined[1] in ("4", "5") and int(joined[2]) == int(joined[1]) - 1, outputs
    node0 = outputs["node0.err"]  # its rank 0 says it; before that line no failure (the growth is none)
    assert "joined before step" in node0 and "torchrun restarts" not in node0[:node0.find("joined before step")]
    assert "4 of 3" not in outputs["node2.err"], outputs  # the node that joined waited to be let in
    lost_line = re.search(r"partita: 1 node\(s\) lost before step (\d+): re-planned for 2 nodes \(pp=1 dp=2 tp=1, "
                          r"predicted 0\.67x the 3-node throughput\); resumed from step (\d+) from the nodes' memory\n",
                          stderr)
    assert lost_line and lost_line[2] in ("5", "6") and int(lost_line[1]) == int(lost_line[2]) + 1, outputs
    resumed = int(lost_line[2])
    # rank 0 of each round writes --losses-out on its node: the last round's is the one that starts latest
    reports = {f: json.loads(f.read_text()) for f in tmp_path.glob("node*.json")}
    last, out = max(reports.items(), key=lambda kv: kv[1]["first_step"])
    assert out["first_step"] == resumed and out["resumed_from"] == f"the snapshot of step {resumed} in the nodes' memory"
    assert not (ck / f"step-{resumed:08d}").exists() and (ck / "step-00000004").exists()  # from memory, not disk
    assert len(out["losses"]) == STEPS - resumed and out["verified"] and out["max_abs_diff"] <= 1e-5, out
    assert "tiny-gpt on 2 rank(s) (pp=1 dp=2 tp=1" in outputs[last.stem + ".out"], outputs


# ---- the pieces, without processes ----------------------------------------------------------------------------

def test_nnodes_takes_n_or_an_elastic_range_and_gives_it_back_on_the_command_line():
    import argparse

    from partita.runtime.launcher.elastic import is_elastic, node_count
    plain, ranged = node_count("3"), node_count("2:4")
    assert int(plain) == 3 and not is_elastic(plain) and str(plain) == "3"
    assert int(ranged) == 4 and ranged.least == 2 and is_elastic(ranged) and f"{ranged}" == "2:4"
    assert not is_elastic(node_count("3:3")) and not is_elastic(3)
    for bad, why in (("4:2", "MIN (4) is more than MAX (2)"), ("0:2", "MIN must be at least 1"),
                     ("two", "not a node count")):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(why)):
            node_count(bad)


def test_each_round_continues_the_run_and_joining_nodes_wait_for_the_rescale_window(monkeypatch):
    from partita.runtime.launcher.elastic import ROUND_ENV, Rescale, attempt_from_round
    monkeypatch.delenv(ROUND_ENV, raising=False)
    assert attempt_from_round() == 0
    monkeypatch.setenv(ROUND_ENV, "3")
    assert attempt_from_round() == 2
    now = [100.0]
    r = Rescale(60.0, clock=lambda: now[0])
    assert r.waiting(1) == 1  # before the first round closes nothing holds a node back
    r.round_closed()
    now[0] += 59.0
    assert r.waiting(1) == 0 and r.waiting(0) == 0
    now[0] += 2.0
    assert r.waiting(2) == 2


def test_an_elastic_run_needs_a_set_with_every_size_and_checkpoints(tmp_path, capsys):
    from partita import cli
    sets = plan_set(tmp_path / "set")
    one = sets / "nodes-2.json"
    base = ["run", "--model", "tiny-gpt", "--steps", "2", "--rdzv-endpoint", "127.0.0.1:29999"]
    cases = [([str(one), "--nnodes", "2:3"], "runs a plan set, one plan per size"),
             ([str(sets), "--nnodes", "1:3"], "has no plan for 1 node(s) (it has 2, 3): an elastic run --nnodes 1:3 "
                                              "needs one for every size from 1 to 3"),
             ([str(sets), "--nnodes", "2:3"], "carries its state across sizes in checkpoints"),
             ([str(sets), "--nnodes", "2:3", "--checkpoint-dir", str(tmp_path / "ck")], "--checkpoint-every N")]
    for args, message in cases:
        assert cli.main([*base[:1], args[0], *base[1:], *args[1:]]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert cli.main(["run", str(one), "--model", "tiny-gpt", "--rescale-every", "5"]) == 2
    assert "--rescale-every is for elastic jobs" in capsys.readouterr().err


def test_the_replan_line_names_the_change_the_mesh_and_the_predicted_throughput(tmp_path):
    from partita.runtime.launcher.elastic import choose, replanned_line
    sets = plan_set(tmp_path / "set")
    two = choose(str(sets), 2, 1)
    assert two.nodes == 2 and two.plan.mesh.dp == 2 and two.plan_path.endswith("nodes-2.json")
    assert replanned_line(two, 2, 5, 1) is None  # the checkpoint's size: nothing changed
    assert replanned_line(two, 3, 5, 1) == ("partita: 1 node(s) lost before step 6: re-planned for 2 nodes (pp=1 "
                                            "dp=2 tp=1, predicted 0.67x the 3-node throughput); resumed from step 5")
    with pytest.raises(Exception, match="has no plan for 1 node"):
        choose(str(sets), 1, 1)


def test_the_python_api_launches_an_elastic_job_with_the_same_checks(tmp_path, capsys):
    from partita.costmodel import PartitaError
    from partita.runtime.api import launch
    from partita.runtime.train import main
    sets = plan_set(tmp_path / "set")
    endpoint = {"rdzv_endpoint": "127.0.0.1:29999"}
    for plan, kw, message in ((sets, {"nnodes": "2:3"}, "carries its state across sizes in checkpoints"),
                              (sets / "nodes-2.json", {"nnodes": "2:3", "checkpoint_dir": str(tmp_path / "ck"),
                                                       "checkpoint_every": 1}, "runs a plan set"),
                              (sets, {"nnodes": "3:2"}, "MIN (3) is more than MAX (2)"),
                              (sets / "nodes-2.json", {"nnodes": 2, "rescale_every": 5.0}, "for elastic jobs")):
        with pytest.raises(PartitaError, match=re.escape(message)):
            launch(plan, "tiny-gpt", 2, **endpoint, **kw)
    # the launcher's pre-flight on a set: the full size's plan, checked without starting a process
    assert main([str(sets), "--model", "tiny-gpt", "--steps", "2", "--check", "--nnodes", "2:3", "--nproc-per-node",
                 "1", "--rdzv-endpoint", endpoint["rdzv_endpoint"], "--checkpoint-dir", str(tmp_path / "ck"),
                 "--checkpoint-every", "1"]) == 0
    assert f"plan {sets} fits --model tiny-gpt on 3 rank(s)" in capsys.readouterr().out

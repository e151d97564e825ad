"""A hang in an elastic run is handled as a lost node (issue 41, item 3; runtime.launcher.leave): three local
"nodes" (`partita run` commands, one CPU process each) train tiny-gpt from a plan set of a 2-node and a 3-node plan
under `--hang-timeout`. Rank 2 pauses itself in step 3 (PARTITA_FAULT sigstop: a process stuck without dying, alone
on its node, so nobody on that node can name it). The other nodes' hang watches give up waiting and meet again; the
hung node's launcher sees them wait while its own rank has not moved, names the rank, ends it and leaves the job
with exit 1. The two left re-plan for 2 nodes and resume from step 2's checkpoint; the last round runs under
--verify, so its losses are one uninterrupted process's (no sample skipped or read twice). `slow`: about a minute
and a half on 2 shared cores. The same with two ranks a node: the hung rank's peer on its node waits on it in a
collective, and that peer's own hang watch names it (hung.json), which makes its node leave (50 s).
"""
from __future__ import annotations

import json
import subprocess
import uuid

import pytest

from rank_pool import free_port
from test_elastic import STEPS, _listening, _logs, _stopped_under, _wait, plan_set, running_nodes, start_node
from test_plans_match_single_process import _env

HANG = "15"
"""Seconds (tests/e2e/test_hang_watch.py: a healthy step or save stays under it on a loaded machine)."""


def _three_nodes_one_hung(tmp_path, sets, fault: str) -> tuple[dict, int, dict]:
    """Three local nodes of an elastic job on plan set `sets` under --hang-timeout, with PARTITA_FAULT `fault` pausing
    a rank: (each node's exit code, the node whose rank was paused, the nodes' outputs)."""
    port, job = free_port(), f"partita-test-{uuid.uuid4().hex[:8]}"
    env = _env(PARTITA_FAULT=fault)

    def node(i: int) -> subprocess.Popen:
        return start_node(tmp_path, i, sets, port, job, env, "--rescale-every", "0", "--hang-timeout", HANG)

    with running_nodes(tmp_path) as nodes:
        nodes.append(node(0))  # node 0 hosts the rendezvous store: it holds rank 0 and is never the hung node
        _wait(lambda: _listening(port), procs=nodes)
        nodes.extend([node(1), node(2)])  # MAX nodes: the first round closes with all three
        hung = _wait(lambda: next((i for i in (1, 2) if _stopped_under(nodes[i].pid)), None), procs=nodes)
        codes = {i: p.wait(timeout=300) for i, p in enumerate(nodes)}
    return codes, hung, _logs(tmp_path)


@pytest.mark.slow
def test_a_hung_node_leaves_and_the_others_replan_and_resume_exactly(tmp_path):
    codes, hung, outputs = _three_nodes_one_hung(tmp_path, plan_set(tmp_path / "set"), "sigstop,rank=2,step=3")
    kept = 3 - hung
    assert codes == {0: 0, hung: 1, kept: 0}, outputs
    mine = [line for line in outputs[f"node{hung}.err"].splitlines() if line.startswith("partita:")]
    assert mine[-2:] == [
        "partita: this node leaves the elastic job: its rank 2 hung; the other 2 nodes go on without it (start this "
        "command again to bring it back)",
        f"partita: error: rank 2: no progress for more than {HANG} s (--hang-timeout) in forward and backward of step "
        "3, while the other nodes' ranks gave up waiting for it; ended by its node's launcher"], outputs
    _the_others_resumed_exactly(tmp_path, outputs, kept, dp=2)


def _pair_plan_set(directory):
    """Two ranks a node: nodes-2.json (dp=4, 3 micro-batches of 2) and nodes-3.json (dp=6, 2 of 2), global batch 24."""
    from test_plans_match_single_process import make_plan
    directory.mkdir()
    for nodes, micro, step_time in ((2, 3, 0.015), (3, 2, 0.010)):
        plan = make_plan(dp=2 * nodes, micro=micro)
        plan["cluster"] = {"spec": f"{nodes}x2cpu", "num_devices": 2 * nodes, "devices_per_node": 2}
        plan["predicted"]["step_time_s"] = step_time
        (directory / f"nodes-{nodes}.json").write_text(json.dumps(plan))
    return directory


@pytest.mark.slow
def test_a_node_whose_own_watch_names_its_hung_rank_leaves_and_the_others_resume_exactly(tmp_path):
    """Three nodes of two ranks each (each plan's world over its nodes). Rank 3 pauses in step 3; its node's other rank
    waits on it in a collective, and that rank's hang watch names rank 3 (hung.json): its node spends its restarts,
    leaves, and the other two re-plan for 2 nodes (4 ranks) from step 2's checkpoint; the last round is one
    uninterrupted process's (--verify)."""
    codes, hung, outputs = _three_nodes_one_hung(tmp_path, _pair_plan_set(tmp_path / "set"), "sigstop,rank=3,step=3")
    kept = 3 - hung
    assert codes == {0: 0, hung: 1, kept: 0}, outputs
    mine = [line for line in outputs[f"node{hung}.err"].splitlines() if line.startswith("partita:")]
    assert mine[-2] == ("partita: this node leaves the elastic job: its rank 3 hung; the other 2 nodes go on without "
                        "it (start this command again to bring it back)"), outputs
    assert mine[-1] == ("partita: error: rank 3: no progress for more than 15 s (--hang-timeout) in forward and "
                        "backward of step 3, while rank 2 waited in the loss all-reduce; ended by the hang watch"), outputs
    _the_others_resumed_exactly(tmp_path, outputs, kept, dp=4)


def _the_others_resumed_exactly(tmp_path, outputs: dict, kept: int, dp: int) -> None:
    """Nodes 0 and `kept` re-planned for 2 nodes (data parallelism `dp`), resumed from step 2's checkpoint, and ran the
    last round with losses equal to one uninterrupted process's (--verify)."""
    stderr = outputs["node0.err"] + outputs[f"node{kept}.err"]
    assert (f"partita: 1 node(s) lost before step 3: re-planned for 2 nodes (pp=1 dp={dp} tp=1, predicted 0.67x the "
            "3-node throughput); resumed from step 2") in stderr, outputs
    reports = [json.loads((tmp_path / f"node{i}.json").read_text()) for i in (0, kept)
               if (tmp_path / f"node{i}.json").exists()]
    out = max(reports, key=lambda r: r["first_step"])
    assert out["first_step"] == 2 and out["resumed_from"] == str(tmp_path / "ck" / "step-00000002"), out
    assert len(out["losses"]) == STEPS - 2 and out["verified"] and out["max_abs_diff"] <= 1e-5, out


# ---- the pieces, without a job ---------------------------------------------------------------------------------

def _mark(directory, rank: int, pid: int, made: float, error_file=None, step=3, phase=0):
    import os

    from partita.runtime.failure.hang import FILE
    path = directory / FILE.format(rank)
    path.write_text(json.dumps({"rank": rank, "pid": pid, "step": step, "phase": phase, "error_file": error_file}))
    os.utime(path, (made, made))


def test_a_node_whose_ranks_stopped_moving_holds_back_then_ends_them_and_leaves(tmp_path, capsys):
    import signal

    from partita.runtime.launcher.elastic import Rescale
    from partita.runtime.launcher.leave import Leave
    from partita.runtime.loop.report import read_failure
    now = [1000.0]
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        _mark(tmp_path, 4, sleeper.pid, 990.0, error_file=str(tmp_path / "error.json"))
        _mark(tmp_path, 5, 999999999, 900.0)  # a rank of an earlier attempt, gone: not counted
        leave = Leave(2, 15.0, str(tmp_path), clock=lambda: now[0])
        rescale = Rescale(0.0)
        rescale.leave = leave
        rescale.round_closed(3)
        assert rescale.waiting(1) == 1  # moved 10 s ago: the others' wait is for a new round, as usual
        now[0] = 1010.0
        assert rescale.waiting(1) == 0 and sleeper.poll() is None  # 20 s: held back, its own watch may yet fire
        assert rescale.waiting(0) == 0 and leave.line is None
        now[0] = 1040.0  # past 15 s + GRACE (15 s): it hung
        assert rescale.waiting(1) == 0
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
    finally:
        sleeper.kill()
    failure = read_failure(4, -9, str(tmp_path / "error.json"), now[0])
    assert failure.line() == ("rank 4: no progress for more than 15 s (--hang-timeout) in forward and backward of step "
                              "3, while the other nodes' ranks gave up waiting for it; ended by its node's launcher")
    assert leave.after_failure()  # the failure that follows: no restart
    assert capsys.readouterr().err.strip() == (
        "partita: this node leaves the elastic job: its rank 4 hung; the other 2 nodes go on without it (start this "
        "command again to bring it back)")


def test_a_node_leaves_only_when_the_job_can_go_on_without_it(tmp_path):
    import socket

    from partita.runtime.failure.hang import HUNG_FILE
    from partita.runtime.launcher.leave import Leave, hosts_store

    def named(nodes, least, timeout=15.0, port=None):
        (tmp_path / HUNG_FILE).write_text(json.dumps({"ranks": [3], "line": "..."}))
        leave = Leave(least, timeout, str(tmp_path), port=port)
        leave.nodes = nodes
        return leave.after_failure(), (tmp_path / HUNG_FILE).exists()

    assert named(3, 2) == (True, False)  # its hang watch named rank 3; the file is read once
    assert named(2, 2) == (False, False)  # one node fewer than MIN: it restarts with the others
    assert named(3, 2, timeout=None) == (False, False)  # no --hang-timeout: no hang is ever judged
    with socket.socket() as s:  # the node that hosts the rendezvous store: its end would end the job
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert hosts_store(port) and not hosts_store(free_port())
        assert named(3, 2, port=port) == (False, False)
    fresh = Leave(2, 15.0, str(tmp_path))
    fresh.nodes = 3
    assert not fresh.after_failure()  # a failure the watch did not call a hang


def test_a_leaving_node_does_not_close_the_rendezvous(monkeypatch):
    from partita.runtime.launcher import rendezvous
    from partita.runtime.launcher.elastic import Rescale
    from partita.runtime.launcher.leave import Leave

    class Inner:
        closed = False

        def shutdown(self):
            Inner.closed = True
            return True

    rescale = Rescale(0.0)
    rescale.leave = Leave(2, 15.0, "/nonexistent")
    monkeypatch.setattr(rendezvous, "ELASTIC", rescale)
    handler = rendezvous._handler_type()(Inner(), None, "job", 3)
    rescale.leave.line = "partita: this node leaves the elastic job: ..."
    assert handler.shutdown() and not Inner.closed  # the others' rendezvous goes on
    rescale.leave.line = None
    assert handler.shutdown() and Inner.closed  # a job that ends closes it, as torchrun does


def test_workers_that_all_stopped_by_vote_are_told_from_an_end_and_a_failure(tmp_path):
    """runtime.launcher.leave.stopped_by_vote: every worker of the latest attempt stopped at a step boundary (exit
    code past 128 in its error file) -- the stop another node's agent asked for by a membership change -- and
    nothing else: not a run that finished (no error file), a failure, or a mix."""
    from partita.runtime.launcher.leave import stopped_by_vote
    from partita.runtime.loop.report import write_error_file

    def attempt(k: int, codes: list[int]) -> None:
        for local, code in enumerate(codes):
            path = tmp_path / "run" / f"attempt_{k}" / str(local) / "error.json"
            path.parent.mkdir(parents=True)
            write_error_file(local, "stopped after step 3", exitcode=code, path=str(path))

    assert not stopped_by_vote(tmp_path)  # no attempt yet
    attempt(0, [1, 143])
    assert not stopped_by_vote(tmp_path)  # a failure beside the stop
    attempt(1, [143, 143])
    assert stopped_by_vote(tmp_path)
    (tmp_path / "run" / "attempt_2").mkdir()
    assert not stopped_by_vote(tmp_path)  # the newest attempt's workers are running (no file yet)

"""The launcher's lines, checked without launching torchrun (issue 29 items 8 and 10): a rendezvous endpoint whose
port another program holds, a rendezvous that times out, the restart notice, and a worker that ends the job on
purpose under partita's launcher (exit 0, its code in its error file, so torchrun does not restart it)."""
import json
import logging
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousTimeoutError

from partita.costmodel import PartitaError
from partita.runtime import api
from partita.runtime.launcher import rendezvous
from partita.runtime.loop import report

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from test_plans_match_single_process import _env, make_plan  # noqa: E402


def test_a_port_held_by_another_program_is_one_line():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)  # accepts connections and never answers, as the program in the issue did
        port = held.getsockname()[1]
        with pytest.raises(PartitaError, match=f"rendezvous endpoint 127.0.0.1:{port}: the port is held by another "
                                               "program, not a rendezvous store"):
            rendezvous.check_endpoint(f"127.0.0.1:{port}", wait=2)


def test_a_port_held_by_a_rendezvous_store_or_free_is_accepted():
    import datetime

    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=10))
    rendezvous.check_endpoint(f"127.0.0.1:{store.port}", wait=5)  # another node of the job, on this machine
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    rendezvous.check_endpoint(f"127.0.0.1:{free}")
    with pytest.raises(PartitaError, match="must be HOST:PORT"):
        rendezvous.check_endpoint("node0")


def test_rendezvous_failures_are_one_line_with_what_was_seen():
    rendezvous.register("node0:29400", 7)
    rendezvous.SEEN.joined, rendezvous.SEEN.expected = 1, 2
    assert rendezvous.failure_line(RendezvousTimeoutError()) == (
        "rendezvous at node0:29400 timed out after 7 s with 1 of 2 nodes joined: start the same command on every "
        "node, or give them longer with --rdzv-timeout")
    assert "no rendezvous store answered within 7 s" in rendezvous.failure_line(RendezvousConnectionError("x"))
    assert rendezvous.failure_line(ValueError("x")) is None
    assert "--rdzv-conf=join_timeout=7,read_timeout=7" in rendezvous.register("node0:29400", 7)
    # an elastic job whose store answered in an earlier round: it went away with the node that served it
    from partita.runtime.launcher.elastic import Rescale
    elastic = Rescale(60.0)
    rendezvous.register("node0:29400", 7, elastic)
    assert "no rendezvous store answered" in rendezvous.failure_line(RendezvousConnectionError("x"))  # first round
    elastic.round_closed(3)
    assert rendezvous.failure_line(RendezvousConnectionError("x")) == (
        "rendezvous at node0:29400: the rendezvous store went away with the node that served it; serve the store "
        "apart from the training nodes (`partita rendezvous --port 29400`) so that no node's loss ends the job")
    rendezvous.SEEN.spare = True  # a spare sees only the store's end: the job's, or that of the node serving it
    try:
        assert rendezvous.failure_line(RendezvousConnectionError("x")) == (
            "rendezvous at node0:29400: the rendezvous store went away while this node waited as a spare: the job "
            "ended, or lost the node that served the store; serve the store apart from the training nodes (`partita "
            "rendezvous --port 29400`) so that no node's loss ends the job")
    finally:
        rendezvous.SEEN.spare = False
    rendezvous.register("node0:29400", 7)


def torchrun_record(name: str, level: int, msg: str, args: tuple) -> logging.LogRecord:
    return logging.LogRecord(f"torch.distributed.elastic.{name}", level, __file__, 1, msg, args, None)


RESTART = ("agent.server.api", logging.INFO, "[%s] Worker group %s. %s/%s attempts left; will restart worker group")


def test_the_restart_notice_counts_restarts_and_names_the_worker_that_died(tmp_path, monkeypatch, capsys):
    """torchrun logs the restarts left *before* it takes one ("2/2 attempts left" for the first of 2), and the
    first worker it saw fail: here rank 1, dead without an error file, while rank 0 wrote that its peer went away."""
    log = api._AgentLog(str(tmp_path))
    assert log.filter(torchrun_record(*RESTART, ("default", "FAILED", 2, 2))) is False
    assert capsys.readouterr().err.strip() == "partita: a worker failed; torchrun restarts the workers (restart 1 of 2)"
    error = tmp_path / "run" / "attempt_0" / "0" / "error.json"  # torchrun makes a directory per local rank
    error.parent.mkdir(parents=True)
    (tmp_path / "run" / "attempt_0" / "1").mkdir()
    monkeypatch.setenv(report.ERROR_FILE_ENV, str(error))
    report.write_error_file(0, "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:63381")
    log.filter(torchrun_record("multiprocessing.api", logging.ERROR,
                               "failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s", (1, 1, 4242, "python")))
    log.filter(torchrun_record(*RESTART, ("default", "FAILED", 1, 2)))
    assert capsys.readouterr().err.strip() == ("partita: rank 1: exited with code 1; torchrun restarts the workers "
                                               "(restart 2 of 2)")


def test_the_restart_notice_names_the_dead_worker_when_torchrun_logged_its_peer_first(tmp_path, monkeypatch, capsys):
    """torchrun logs one failure, the earliest by whole-second timestamps: a peer that wrote "connection closed"
    in the second the silent worker died is logged in its place (CI saw "rank 1: ended without an error
    message" one run in two). Every failure of the attempt comes from the agent's monitoring result instead."""
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
    log = api._AgentLog(str(tmp_path))
    error = tmp_path / "run" / "attempt_0" / "0" / "error.json"
    error.parent.mkdir(parents=True)
    (tmp_path / "run" / "attempt_0" / "1").mkdir()
    monkeypatch.setenv(report.ERROR_FILE_ENV, str(error))
    report.write_error_file(0, "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:63381")
    failures = {r: ProcessFailure(local_rank=r, pid=4242 + r, exitcode=1, error_file=str(tmp_path / f"none{r}"))
                for r in (0, 1)}
    monkeypatch.setattr(LocalElasticAgent, "_monitor_workers",
                        lambda agent, group: RunResult(state=WorkerState.FAILED, failures=failures))
    unwatched = LocalElasticAgent._monitor_workers
    with api.watch_failures(log):
        LocalElasticAgent._monitor_workers(None, None)  # what the agent calls once per monitoring interval
    assert LocalElasticAgent._monitor_workers is unwatched and sorted(log.failed) == [0, 1]
    log.filter(torchrun_record("multiprocessing.api", logging.ERROR,
                               "failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s", (1, 0, 4242, "python")))
    log.filter(torchrun_record(*RESTART, ("default", "FAILED", 1, 1)))
    assert capsys.readouterr().err.strip() == ("partita: rank 1: exited with code 1; torchrun restarts the workers "
                                               "(restart 1 of 1)")


def test_the_report_and_its_json_number_the_attempt_alike():
    result = report.RunResult(losses=[1.0], step_times=[0.1], peak_memory_bytes=1, memory_method="m",
                              peak_rss_bytes=1, tokens_per_step=1, resumed_from="ck/step-00000002", first_step=2,
                              attempt=2)
    assert "torchrun attempt 3" in report.render(result, "header", {})
    assert result.to_json()["attempt"] == 3 and result.to_json()["restarts"] == 2


def test_a_worker_under_the_launcher_ends_a_nan_run_without_a_restart(tmp_path):
    """Under partita's launcher (PARTITA_AGENT) a NaN is final: the worker exits 0 so torchrun's agent does not
    restart it, and its error file carries exit code 3 and the line the launcher prints."""
    (tmp_path / "plan.json").write_text(json.dumps(make_plan()))
    error = tmp_path / "error.json"
    proc = subprocess.run([sys.executable, "-m", "partita.runtime.train", str(tmp_path / "plan.json"), "--model",
                           "tiny-gpt", "--steps", "4"], cwd=ROOT, capture_output=True, text=True, timeout=180,
                          env=_env(PARTITA_AGENT="1", PARTITA_FAULT="nan,step=2",
                                   **{report.ERROR_FILE_ENV: str(error)}))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    failure = report.read_failure(0, 0, str(error), 0)
    assert failure.exitcode == 3 and failure.message.startswith("loss is nan at step 2: training stopped")


def test_a_lost_node_line_names_the_newest_committed_checkpoint_this_node_had_not_recorded(tmp_path, monkeypatch):
    """A node lost right after a save is committed: this node's ranks wait for it in the save's last collective,
    so what they recorded is the step before, without the checkpoint. The line still says where to resume: the
    newest committed checkpoint of the recorded directory (the CI run of stop 53 caught the line without it)."""
    from partita.runtime.launcher import agent
    from partita.runtime.failure import stop
    root = tmp_path / "ck"
    (root / "step-00000002").mkdir(parents=True)
    (root / "step-00000004.tmp-x").mkdir()  # a save not committed is no place to resume from
    monkeypatch.setenv(stop.PROGRESS_ENV, str(tmp_path / agent.PROGRESS_FILE))
    monkeypatch.setenv("LOCAL_RANK", "0")
    stop.record_step(1, 100, None, True, str(root))
    line = agent._lost_line("lost node n1", str(tmp_path))
    assert line == f"lost node n1; this node stops after step 1 of 100; resume from {root}/step-00000002 with --resume"
    stop.record_step(3, 100, None, False)  # no checkpoint directory: no resume hint
    assert agent._lost_line("lost node n1", str(tmp_path)) == "lost node n1; this node stops after step 3 of 100"


def test_a_node_waiting_while_the_round_runs_at_its_largest_size_is_a_spare_and_triggers_no_restart():
    """torch's rendezvous state, as DynamicRendezvousHandler keeps it: a node in the redundancy list, or in the
    wait list while a complete round holds MAX nodes, is a spare; a waiting node restarts the workers (is counted)
    only where a new round could take it in."""
    from types import SimpleNamespace as NS

    from partita.runtime.launcher.rendezvous import full_round, is_spare
    me = "node-d"

    def handler(participants: int, complete=True, wait=(), redundant=()):
        state = NS(participants={f"n{i}": i for i in range(participants)}, complete=complete,
                   wait_list=set(wait), redundancy_list=set(redundant))
        return NS(_state_holder=NS(state=state), _settings=NS(max_nodes=3), _this_node=me)

    assert is_spare(handler(3, redundant=[me])) and full_round(handler(3, redundant=[me]))
    assert is_spare(handler(3, wait=[me]))  # back in the wait list after a loss, the round full again
    assert not is_spare(handler(2, wait=[me])) and not full_round(handler(2, wait=[me]))  # a growth: taken in
    assert not is_spare(handler(3, complete=False, wait=[me]))  # the round still forming
    assert not is_spare(handler(3)) and not is_spare(NS()) and not full_round(NS())  # not waiting; no state
    # a stop by the ranks' vote is for a waiting node only where a new round can let it in (leave.waiting_at)
    from partita.runtime.launcher.leave import waiting_at

    def counting(h):
        h.num_nodes_waiting = lambda: len(h._state_holder.state.wait_list)
        return h

    assert waiting_at(counting(handler(2, wait=["other"]))) and not waiting_at(counting(handler(3, wait=["other"])))
    assert not waiting_at(counting(handler(2)), sleep=lambda s: None)


def test_a_stop_seen_before_the_cached_rendezvous_state_expires_asks_the_store_again():
    """torch's num_nodes_waiting answers from the state it read up to its cache duration ago: a node that joined
    since shows only in the next read, which `waiting_at` waits for before it takes a vote's stop for the end."""
    from types import SimpleNamespace as NS

    from partita.runtime.launcher.leave import waiting_at
    state = NS(participants={"n0": 0, "n1": 1}, complete=True, wait_list=set(), redundancy_list=set())
    store = {"wait_list": {"n2"}}  # the store's state: node 2 joined after this agent's last read
    handler = NS(_state_holder=NS(state=state, _cache_duration=1), _settings=NS(max_nodes=3), _this_node="n0")
    slept = []

    def read(seconds):
        slept.append(seconds)
        state.wait_list = store["wait_list"]  # the cache expired: the next call reads the store

    handler.num_nodes_waiting = lambda: len(state.wait_list)
    assert waiting_at(handler, sleep=read) and slept == [1.2]
    store["wait_list"], state.wait_list, slept[:] = set(), set(), []
    assert not waiting_at(handler, sleep=read) and slept == [1.2]  # nobody: a stop for the job's end

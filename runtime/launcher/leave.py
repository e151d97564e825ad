"""A hung node leaves an elastic job (issue 41, item 3): the others go on without it, re-planned, as after a lost node.

Under `--hang-timeout S` a rank that makes no progress for S seconds is a failure (runtime.failure.hang). In a job of
fixed size torchrun then restarts every node's workers at the same size, the hung node's too. In an elastic job
(`--nnodes MIN:MAX`) a node whose rank hung is taken for a bad node and leaves: its agent does not restart its
workers, ends with one line and exit 1, and does not close the rendezvous. The others' next collective fails, their
agents meet again without it (torch drops its keep-alive after runtime.launcher.elastic.KEEP_ALIVE_MISSES
seconds), and the job resumes from its newest checkpoint under the plan for the nodes left
(runtime.launcher.elastic), as after a node killed outright. Starting the same command again brings it back.

A node knows one of its ranks hung in one of two ways:
- its own hang watch named the rank (`HUNG_FILE`, written beside the marks): a rank held up its peers on this node;
- or every rank of the node has stopped moving (a node of one rank, or all of its ranks paused: nobody on it can
  name them, a paused process's own watch thread does not run) while the other nodes wait at the rendezvous for a
  new round, their own watches having fired. The agent, which is not paused, sees it (`Leave.others_wait`, asked
  each time torchrun's agent asks whether nodes wait) once the marks are older than S + `GRACE`: a healthy node's
  own watch fires within a second of S, so a node that reaches the rendezvous a little late is not taken for the
  hung one. The agent writes the verdict into the rank's error file and ends the rank.

A node leaves only when the job can go on without it: at least MIN nodes left, and this node does not host the
rendezvous store (the store ends with its launcher, and every node with it). Otherwise it restarts with the others,
as in a job of fixed size.

The other way round, a node must not leave by mistake: workers stopped by the ranks' stop vote for another node's
membership change look like a finished job to their agent (`leaving`, `stopped_by_vote`).
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import time
from pathlib import Path

from partita.runtime.failure.hang import HUNG_FILE, PHASES, live_marks
from partita.runtime.loop.console import stderr_line
from partita.runtime.loop.report import attempt_failures, write_error_file

GRACE_MAX = 30.0
"""Seconds past --hang-timeout after which still marks mean this node hung (`GRACE`: at most this, at most S)."""


class Leave:
    """An elastic node's decision to leave its job after a hang (module docstring)."""

    def __init__(self, least: int, timeout: float | None, log_dir: str, port: int | None = None, clock=time.time):
        self.least, self.timeout, self.dir, self.port, self.clock = least, timeout, Path(log_dir), port, clock
        self.nodes: int | None = None
        """Nodes in this node's current round."""
        self.line: str | None = None
        """Why this node leaves, once it does."""

    @property
    def grace(self) -> float:
        return min(self.timeout or 0.0, GRACE_MAX)

    def may_leave(self) -> bool:
        return (self.timeout is not None and self.nodes is not None and self.nodes - 1 >= self.least
                and not hosts_store(self.port))

    def after_failure(self) -> bool:
        """This node's workers failed: whether it leaves (its hang watch named one of its ranks)."""
        path = self.dir / HUNG_FILE
        try:
            named = json.loads(path.read_text())
        except (OSError, ValueError):
            named = None
        with contextlib.suppress(OSError):
            path.unlink()  # read once: a later failure of a node that stayed is not this one
        if self.line is None and isinstance(named, dict) and self.may_leave():
            ranks = ", ".join(map(str, named.get("ranks") or [])) or "?"
            self._leave(f"its rank {ranks} hung")
        return self.line is not None

    def others_wait(self) -> bool:
        """Other nodes wait at the rendezvous while this node's workers run: whether this node holds back from
        meeting them. It does while every live mark of its ranks is older than S (they wait for it, or its own
        watch is about to fire), and once they are older than S + GRACE it hung: the verdict goes to the
        furthest-behind rank's error file, this node's ranks are ended, and the node leaves."""
        if self.line is not None:
            return True
        if not self.may_leave():
            return False
        places = live_marks(self.dir)
        still = min((self.clock() - d["time"] for d in places.values()), default=0.0)
        if still <= self.timeout:
            return False
        if still <= self.timeout + self.grace:
            return True
        first = min(places.values(), key=lambda d: (d["step"], d["phase"], d["rank"]))
        line = (f"no progress for more than {self.timeout:g} s (--hang-timeout) in {PHASES[first['phase']]} of step "
                f"{first['step']}, while the other nodes' ranks gave up waiting for it; ended by its node's launcher")
        write_error_file(first["rank"], line, path=first.get("error_file"))
        for d in places.values():
            with contextlib.suppress(OSError):
                os.kill(d["pid"], signal.SIGKILL)
        self._leave(f"its rank {first['rank']} hung")
        return True

    def _leave(self, why: str) -> None:
        left = self.nodes - 1
        self.line = (f"partita: this node leaves the elastic job: {why}; the other {left} node{'s' * (left != 1)} "
                     "go on without it (start this command again to bring it back)")
        stderr_line(self.line)


def hosts_store(port: int | None) -> bool:
    """Whether this process listens on `port` (it hosts the rendezvous store), from /proc (Linux); True where
    that cannot be read, so that a node that may host it never leaves."""
    if port is None:
        return False
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return True
    inodes = set()
    for fd in fds:
        with contextlib.suppress(OSError):  # the descriptor listdir itself used is closed by now
            if (target := os.readlink(f"/proc/self/fd/{fd}")).startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    tables = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):  # tcp6: absent where IPv6 is off
        with contextlib.suppress(OSError):
            tables.append(Path(name).read_text().splitlines()[1:])
    for row in (r.split() for rows in tables for r in rows):
        if len(row) > 9 and row[3] == "0A" and int(row[1].rsplit(":", 1)[1], 16) == port and row[9] in inodes:
            return True
    return not tables


def stopped_by_vote(log_dir: Path) -> bool:
    """Whether every worker of this node's latest attempt ended by a stop at a step boundary (an exit code past 128
    in its error file: runtime.failure.stop) -- which, while this agent itself had no signal, another node asked for."""
    failures = attempt_failures(log_dir)
    return bool(failures) and all(f.exitcode > 128 for f in failures)


STATE_CACHE_MARGIN = 0.2
"""Seconds waited past torch's rendezvous state cache before `waiting_at` asks again."""


def waiting_at(handler, sleep=time.sleep) -> bool:
    """Whether a node waits at the rendezvous to be let in: torch's own count, not the rescale window's
    (runtime.launcher.rendezvous wraps the handler, `inner`) -- but not a spare, whom a full round cannot let in
    (a stop is never for it).

    torch answers from the rendezvous state it last read, which it keeps for its cache duration (1 s, the state
    holder's `cache_duration`) before reading the store again. A vote's stop can reach this agent faster than
    that after another node's agent saw a node join: its last read may predate the join. So a first "nobody" is
    asked again once that cache has expired -- the store's state then has the waiting node, or the node that
    stopped for it in the wait list, as long as this node is still in the round (2026-12-01: with fast steps node
    0's cached state, read before node 2 joined, showed an empty wait list in 3 runs of 8 under load, and node 0
    took the growth's stop for the job's end)."""
    from partita.runtime.launcher.rendezvous import full_round
    inner = getattr(handler, "inner", handler)
    try:
        if inner.num_nodes_waiting() > 0:
            return not full_round(inner)
        holder = getattr(inner, "_state_holder", None)
        sleep(float(getattr(holder, "_cache_duration", 1)) + STATE_CACHE_MARGIN)
        return inner.num_nodes_waiting() > 0 and not full_round(inner)
    except Exception:  # the store went away with the node that hosted it: the job is ending anyway
        return False


@contextlib.contextmanager
def leaving(leave: Leave | None):
    """While torchrun's agent runs here, in an elastic job:

    - a failure after which `leave` decides to leave spends the agent's restarts, so torchrun stops this node's
      workers and ends instead of meeting the others again;
    - workers that all stopped at a step boundary though this agent had no signal (torchrun's agent raises on its
      own signals before it monitors again), while a node waits at the rendezvous to be let in, stopped because
      another node's agent saw that node and stopped its workers for the new round (every rank stops after the same
      step): this node meets the others in that round, as if it had seen the node itself, rather than take the
      stop for the job's end. A node whose agent polled late under load was left out of the grown job this way
      (2026-11-30); the rescale window of an agent (`--rescale-every`) hides a waiting node from it alike. A stop
      with nobody waiting (a signal to another node's launcher) still ends the job on every node."""
    if leave is None:
        yield
        return
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerState

    def after(agent, worker_group, result):
        if getattr(result, "failures", None) and leave.after_failure():
            agent._remaining_restarts = 0
        elif getattr(result, "state", None) == WorkerState.SUCCEEDED and stopped_by_vote(leave.dir) \
                and waiting_at(worker_group.spec.rdzv_handler):
            agent._restart_workers(worker_group)
            return RunResult(state=WorkerState.HEALTHY)
        return result
    with after_monitor(after):
        yield


@contextlib.contextmanager
def after_monitor(after):
    """While torchrun's agent runs here: each result of its LocalElasticAgent._monitor_workers passed through
    `after(agent, worker_group, result)`, which returns the result torchrun acts on. A torch without that method
    runs unwatched."""
    try:
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    except ImportError:
        LocalElasticAgent = None
    monitor = getattr(LocalElasticAgent, "_monitor_workers", None)
    if monitor is None:
        yield
        return

    @functools.wraps(monitor)
    def monitored(agent, worker_group):
        return after(agent, worker_group, monitor(agent, worker_group))
    LocalElasticAgent._monitor_workers = monitored
    try:
        yield
    finally:
        LocalElasticAgent._monitor_workers = monitor


def for_job(nnodes, timeout: float | None, log_dir: str, endpoint: str | None) -> Leave | None:
    """This node's Leave in an elastic job (runtime.launcher.rendezvous.ELASTIC, registered), else None."""
    from partita.runtime.launcher import rendezvous
    if rendezvous.ELASTIC is None or not endpoint:
        return None
    port = endpoint.rpartition(":")[2]
    rendezvous.ELASTIC.leave = Leave(getattr(nnodes, "least", int(nnodes)), timeout, log_dir,
                                     int(port) if port.isdigit() else None)
    return rendezvous.ELASTIC.leave

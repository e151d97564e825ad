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
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import time
from pathlib import Path

from partita.runtime.failure.hang import HUNG_FILE
from partita.runtime.loop.console import stderr_line

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
        from partita.runtime.failure.hang import PHASES, live_marks
        places = live_marks(self.dir)
        still = min((self.clock() - d["time"] for d in places.values()), default=0.0)
        if still <= self.timeout:
            return False
        if still <= self.timeout + self.grace:
            return True
        first = min(places.values(), key=lambda d: (d["step"], d["phase"], d["rank"]))
        line = (f"no progress for more than {self.timeout:g} s (--hang-timeout) in {PHASES[first['phase']]} of step "
                f"{first['step']}, while the other nodes' ranks gave up waiting for it; ended by its node's launcher")
        from partita.runtime.loop.report import write_error_file
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


@contextlib.contextmanager
def leaving(leave: Leave | None):
    """While torchrun's agent runs here: a failure after which `leave` decides to leave spends the agent's
    restarts, so torchrun stops this node's workers and ends instead of meeting the others again."""
    if leave is None:
        yield
        return
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    monitor = LocalElasticAgent._monitor_workers

    @functools.wraps(monitor)
    def monitored(agent, worker_group):
        result = monitor(agent, worker_group)
        if getattr(result, "failures", None) and leave.after_failure():
            agent._remaining_restarts = 0
        return result
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

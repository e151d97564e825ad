"""The rendezvous of several nodes, watched: a deadline, progress lines while waiting, one line when it fails.

torchrun's c10d rendezvous waits in silence (10 minutes by default) and fails with an empty message, and an
endpoint whose port another program holds hangs in the store's connect retries and prints pages of C++ frames.
partita's launcher (runtime.api.agent) uses the same c10d rendezvous under its own backend name, BACKEND,
whose handler only adds watching:

- `check_endpoint`, before anything starts (below): a host that does not resolve, or a port held by another
  program than a rendezvous store, is one line.
- While waiting: each node adds itself to a counter in the rendezvous store (a key of this job and round),
  and a thread prints `partita: rendezvous at HOST:PORT: 1 of 2 nodes joined (12 s of 300 s)` to stderr when
  the count changes and every `EVERY` seconds; nothing when the rendezvous completes within `QUIET` seconds.
- The deadline `timeout` (--rdzv-timeout, default DEFAULT_TIMEOUT) bounds both the join and the wait for the
  store itself on a node that does not host it; `failure_line` turns torch's rendezvous errors into one line
  with the count last seen. A store client that connected to something that never answers does not return
  by itself (its C++ connect loop ignores the deadline and signals): past the deadline by GRACE the ticker ends
  the launcher with the same line (`FATAL`).
- Once the first rendezvous has completed, the launchers watch each other (runtime.launcher.peers.PeerWatch, `WATCH`):
  a lost node is noticed in seconds, not after torchrun's 300 s exit barrier.

`check_endpoint` runs on every node, before anything starts:
- a HOST that does not resolve is one line (torch would retry it for the whole deadline, printing a warning
  for each try, and then blame the store);
- an endpoint where something accepts connections but does not answer as a rendezvous store (another program
  on the port, e.g. on 0.0.0.0) is one line, whichever node reaches it under whichever address: a store client
  connected to such a program never returns. On the node that hosts the endpoint, a port that cannot be bound
  must belong to a rendezvous store too (another node of this job on the same machine). The store probe runs
  in a child process with a deadline and its own stderr (the store's C++ retry warnings).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from partita.costmodel.errors import PartitaError
from partita.runtime.launcher.store import APART
from partita.runtime.launcher.elastic import KEEP_ALIVE, KEEP_ALIVE_MISSES, LAST_CALL, ROUND_ENV
from partita.runtime.loop.console import stderr_line

BACKEND = "partita-c10d"
DEFAULT_TIMEOUT = 300.0
"""Seconds: long enough for the nodes of one batch allocation to start, short of torchrun's 600."""
QUIET, EVERY = 3.0, 15.0
GRACE = 30.0
"""Seconds past the deadline after which a store wait that never returned ends the launcher (`_Ticker`)."""
KEY = "partita/rendezvous/{run_id}/{round}"


@dataclass
class Seen:
    """What the watcher last saw, for the failure line."""

    joined: int = 0
    expected: int = 0
    endpoint: str = ""
    timeout: float = DEFAULT_TIMEOUT
    spare: bool = False
    """This node waits as a spare (`is_spare`)."""


SEEN = Seen()


class SpareNotNeeded(Exception):
    """The job closed its rendezvous while this node waited as a spare: nothing failed (exit 0)."""


def _state(handler):
    """torch's DynamicRendezvousHandler's last synced state (private: None where a torch release lacks it)."""
    return getattr(getattr(handler, "_state_holder", None), "state", None)


def full_round(handler) -> bool:
    """Whether the running round already holds the job's largest size (--nnodes MAX): a waiting node cannot be taken
    in, so a restart for it would only run the same round again (and again: the node stays waiting)."""
    state, settings = _state(handler), getattr(handler, "_settings", None)
    return state is not None and settings is not None and bool(getattr(state, "complete", False)) \
        and len(getattr(state, "participants", ())) >= settings.max_nodes


def is_spare(handler) -> bool:
    """Whether this node (torch's DynamicRendezvousHandler `handler`) waits while a round runs at the job's largest
    size: an idle spare, which takes the place of the first node lost at the next round. torch keeps such a node in
    its redundancy list (no re-rendezvous for it); a spare that went back to the wait list when a node was lost,
    and found the round full again, waits there (`full_round`: no restart for it either)."""
    state, node = _state(handler), getattr(handler, "_this_node", None)
    if state is None or node is None:
        return False
    return node in getattr(state, "redundancy_list", ()) or (node in getattr(state, "wait_list", ())
                                                             and full_round(handler))


def spare_line(expected: int) -> str:
    return (f"partita: this node waits as a spare at {SEEN.endpoint}: the job runs on its largest size, {expected} "
            "nodes; it takes the place of the first node lost")


WATCH = None
"""This launcher's runtime.launcher.peers.PeerWatch, once its first rendezvous completed (several nodes only)."""
ELASTIC = None
"""An elastic job's runtime.launcher.elastic.Rescale (`register`), else None."""
HANDLER = None
"""This launcher's rendezvous handler (`_create`), for `stop_heartbeats`."""


def _fatal(line: str) -> None:
    stderr_line(f"partita: error: {line}")
    os._exit(1)


FATAL = _fatal
"""Ends the launcher with one line when a wait ignores its deadline; runtime.api.agent also stops its workers
and removes its directory first."""
ON_LOST = None
"""What the launcher does when its PeerWatch finds a lost node (runtime.api.agent sets it)."""


def split_endpoint(endpoint: str) -> tuple[str, int]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise PartitaError(f"--rdzv-endpoint {endpoint!r} must be HOST:PORT with a port from 1 to 65535")
    return host.strip("[]"), int(port)


def _is_local(host: str) -> bool:
    if host in ("localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        return any(a[4][0].startswith("127.") for a in socket.getaddrinfo(host, None)) or \
            host in {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        return False


def _can_bind(host: str, port: int) -> bool:
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.bind((host, port))
        return True
    except OSError:
        return False


_PROBE = """
import datetime, os, sys, threading
import torch.distributed as d
host, port, wait = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
answered = []
threading.Thread(target=lambda: answered.append(d.TCPStore(host, port, is_master=False, use_libuv=True,
                 timeout=datetime.timedelta(seconds=wait))), daemon=True).start()
for _ in range(int(wait * 10)):
    if answered:
        break
    threading.Event().wait(0.1)
os._exit(0 if answered else 1)  # a client connected to a silent program never returns: do not wait for it
"""


def _is_store(host: str, port: int, wait: float) -> bool:
    """Whether a c10d store answers at host:port within `wait` seconds (in a child process: see the module
    docstring)."""
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE, host, str(port), str(wait)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=wait + 120)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def _resolve(host: str, port: int) -> None:
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        why = getattr(e, "strerror", None) or str(e)
        raise PartitaError(f"rendezvous endpoint {host}:{port}: the host name {host!r} does not resolve ({why}): give "
                           "--rdzv-endpoint a name every node can resolve, or the IP address of the node that hosts "
                           "the rendezvous") from None


def _accepts(host: str, port: int, wait: float = 3.0) -> bool:
    """Whether something accepts TCP connections at host:port now."""
    try:
        with socket.create_connection((host, port), timeout=wait):
            return True
    except OSError:
        return False


def check_endpoint(endpoint: str, wait: float = 5.0) -> None:
    """PartitaError (one line) when `endpoint`'s host does not resolve, or its port is held by another program
    than a rendezvous store: one that accepts connections there, or (on the node that hosts the endpoint) one
    that keeps the port from being bound. Nothing listening yet is no error: the hosting node may start later."""
    host, port = split_endpoint(endpoint)
    _resolve(host, port)
    taken = _accepts(host, port) or (_is_local(host) and not _can_bind(host, port))
    if not taken or _is_store(host, port, wait):
        return
    raise PartitaError(f"rendezvous endpoint {host}:{port}: the port is held by another program, not a rendezvous "
                       "store: choose a free port for --rdzv-endpoint (the same on every node)")


class _Ticker:
    """A thread printing the rendezvous' progress (module docstring) until stopped."""

    def __init__(self, count, expected: int, deadline: float | None = None, spare=lambda: False):
        self.count, self.expected, self.deadline, self.spare = count, expected, deadline, spare
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join(timeout=5)

    def _run(self) -> None:
        start, last_line, last_count = time.monotonic(), 0.0, None
        while not self.done.wait(1.0):
            now = time.monotonic() - start
            if self.deadline is not None and now > self.deadline:
                FATAL(f"rendezvous at {SEEN.endpoint}: no rendezvous store answered within {SEEN.timeout:g} s: "
                      "start the node that hosts HOST first (or together), and check that HOST:PORT is reachable "
                      "from here")
                return
            try:
                joined = self.count()
            except Exception:  # noqa: BLE001 -- the store went away: the rendezvous itself will say why
                return
            if joined is not None:
                SEEN.joined = joined
            if SEEN.spare or self.spare():  # said once: a spare may wait for days, without a deadline
                if not SEEN.spare:
                    SEEN.spare = True
                    stderr_line(spare_line(self.expected))
                continue
            if now < QUIET or (joined == last_count and now - last_line < EVERY):
                continue
            if joined is None:
                what = "waiting for the node that hosts the rendezvous store"
            elif joined > self.expected:  # an elastic job under way: its round-1 count holds its first nodes
                what = "waiting for the running job to take this node in at its next round"
            else:
                what = f"{joined} of {self.expected} nodes joined"
            stderr_line(f"partita: rendezvous at {SEEN.endpoint}: {what} ({now:.0f} s of {SEEN.timeout:g} s)")
            last_line, last_count = now, joined


def _joined(inner, count, expected: int):
    """torch's `inner.next_rendezvous()`, watched by a _Ticker (`count`: the nodes joined so far); a spare's wait said
    once, its end -- the job closed the rendezvous -- SpareNotNeeded, and its taking a lost node's place said."""
    from torch.distributed.elastic.rendezvous import RendezvousClosedError, RendezvousGracefulExitError
    with _Ticker(count, expected, spare=lambda: is_spare(inner)):
        try:
            info = inner.next_rendezvous()
        except (RendezvousGracefulExitError, RendezvousClosedError) as e:
            # torch raises the first for a node in its redundancy list, the second for one in its wait list
            if isinstance(e, RendezvousClosedError) and not (SEEN.spare or is_spare(inner)):
                raise
            raise SpareNotNeeded(f"partita: the job at {SEEN.endpoint} ended without needing this spare node") from None
    if SEEN.spare:
        SEEN.spare = False
        stderr_line(f"partita: this spare node takes a lost node's place: the job goes on on "
                    f"{getattr(info, 'world_size', expected)} nodes")
    return info


def _handler_type():
    from torch.distributed.elastic.rendezvous import RendezvousHandler

    class Watched(RendezvousHandler):
        """torch's c10d DynamicRendezvousHandler, each `next_rendezvous` counted and watched."""

        def __init__(self, inner, store, run_id: str, expected: int):
            self.inner, self.store, self.run_id, self.expected, self.rounds = inner, store, run_id, expected, 0

        def next_rendezvous(self):
            self.rounds += 1
            key = KEY.format(run_id=self.run_id, round=self.rounds)
            self.store.add(key, 1)
            info = _joined(self.inner, lambda: self.store.add(key, 0), self.expected)
            if ELASTIC is not None:  # the workers of this round continue the job (runtime.launcher.elastic)
                os.environ[ROUND_ENV] = str(self.rounds)
                ELASTIC.round_closed(getattr(info, "world_size", None))
                return info
            global WATCH
            if WATCH is None and self.expected > 1:
                from partita.runtime.launcher.peers import PeerWatch
                host, port = split_endpoint(SEEN.endpoint)
                WATCH = PeerWatch(host, port, self.run_id, on_lost=ON_LOST).start()
            return info

        def get_backend(self) -> str:
            return BACKEND  # the registry checks that a handler is of the backend asked for

        @property
        def use_agent_store(self) -> bool:
            return self.inner.use_agent_store

        def is_closed(self) -> bool:
            return self.inner.is_closed()

        def set_closed(self):
            return self.inner.set_closed()

        def num_nodes_waiting(self) -> int:
            count = self.inner.num_nodes_waiting()  # syncs the state full_round reads
            if count and full_round(self.inner):  # spares: no new round could take them in
                return 0
            return ELASTIC.waiting(count) if ELASTIC is not None else count

        def get_run_id(self) -> str:
            return self.inner.get_run_id()

        def shutdown(self) -> bool:
            if ELASTIC is not None and ELASTIC.leave is not None and ELASTIC.leave.line:
                return True  # a node leaving after a hang (runtime.launcher.leave): the others go on
            return self.inner.shutdown()

    return Watched


def _create(params):
    """The registry's creator for BACKEND: torch's c10d backend and handler, watched."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler
    SEEN.expected = params.max_nodes
    with _Ticker(lambda: None, params.max_nodes, deadline=SEEN.timeout + GRACE):  # a node that does not host
        # the store waits for it here
        backend, store = create_backend(params)
    global HANDLER
    HANDLER = _handler_type()(create_handler(store, backend, params), store, params.run_id, params.max_nodes)
    return HANDLER


def stop_heartbeats() -> None:
    """Stop this launcher's rendezvous keep-alive thread, leaving the rendezvous open. torch's agent does not shut
    the rendezvous down when a signal stops it (the job may still scale), so that thread outlived the agent; where
    the handler was then freed inside it, torch's finalizer joined the thread from itself and printed "cannot join
    current thread" after the stop's own line (a fresh-clone CI in session 70, a SIGQUIT stop). Once stopped, or after a
    shutdown, this does nothing."""
    inner = getattr(HANDLER, "inner", None)
    stop = getattr(inner, "_stop_heartbeats", None)  # torch's DynamicRendezvousHandler (pyproject: private APIs)
    if stop is not None:
        stop()


def register(endpoint: str, timeout: float, elastic=None) -> list[str]:
    """Register BACKEND with torch's rendezvous registry (once) and return torchrun's rendezvous arguments.
    `elastic`: an elastic job's runtime.launcher.elastic.Rescale (no PeerWatch: torchrun's own membership handles
    a lost node; the rounds are numbered for the workers; a short last call)."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry
    global WATCH, ELASTIC, HANDLER
    SEEN.endpoint, SEEN.timeout, SEEN.joined = endpoint, timeout, 0
    WATCH, ELASTIC, HANDLER = None, elastic, None
    try:
        rendezvous_handler_registry.register(BACKEND, _create)
    except ValueError:  # registered before in this process
        pass
    seconds = max(1, round(timeout))
    # elastic: a short last call, and a lost node's keep-alive given up after KEEP_ALIVE_MISSES x KEEP_ALIVE s, not
    # torch's 15 s (the survivors' next round waits for that before it starts)
    last_call = (f",last_call_timeout={LAST_CALL:g},keep_alive_interval={KEEP_ALIVE},"
                 f"keep_alive_max_attempt={KEEP_ALIVE_MISSES}") if elastic is not None else ""
    return [f"--rdzv-backend={BACKEND}", f"--rdzv-endpoint={endpoint}",
            f"--rdzv-conf=join_timeout={seconds},read_timeout={seconds}{last_call}"]


def failure_line(e: BaseException) -> str | None:
    """One line for a rendezvous failure (torch's RendezvousError family), or None for anything else."""
    from torch.distributed.elastic.rendezvous.api import (RendezvousClosedError, RendezvousConnectionError,
                                                          RendezvousError, RendezvousTimeoutError)
    where = f"rendezvous at {SEEN.endpoint}"
    if isinstance(e, RendezvousTimeoutError):
        return (f"{where} timed out after {SEEN.timeout:g} s with {SEEN.joined} of {SEEN.expected} nodes joined: "
                "start the same command on every node, or give them longer with --rdzv-timeout")
    if isinstance(e, RendezvousConnectionError):
        apart = APART.format(port=SEEN.endpoint.rpartition(":")[2])
        if SEEN.spare:  # the store served by a training node: gone at the job's end, or with that node
            return (f"{where}: the rendezvous store went away while this node waited as a spare: the job ended, or "
                    f"lost the node that served the store; {apart}")
        if ELASTIC is not None and ELASTIC.closed_at is not None:  # it answered before: it went with its node
            return f"{where}: the rendezvous store went away with the node that served it; {apart}"
        return (f"{where}: no rendezvous store answered within {SEEN.timeout:g} s: start the node that hosts "
                "HOST first (or together), and check that HOST:PORT is reachable from here")
    if isinstance(e, RendezvousClosedError):
        return f"{where} is closed (its job has ended): give this run another --rdzv-id"
    if isinstance(e, RendezvousError):
        return f"{where} failed: {' '.join(str(e).split()) or type(e).__name__}"
    return None

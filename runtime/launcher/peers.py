"""Noticing a lost node in seconds: the launchers of a multi-node run watch each other through the rendezvous store.

Without this, a node whose launcher was killed (SIGKILL, a crashed machine, a cut network) left the others
silent for 300 s: their workers stopped or failed, and torchrun's agent then waited out its exit barrier (300 s)
for an agent that would never arrive -- or, with restarts left, a re-rendezvous (--rdzv-timeout) for a node
that would never join. A silent machine also leaves gloo waiting in a collective for its own timeout (30 min).

Each node's launcher (runtime.api.agent, through runtime.launcher.rendezvous) starts a `PeerWatch` once its first
rendezvous has completed. The watch opens its own client of the rendezvous store (operations bounded by
OP_TIMEOUT, so a store that stops answering cannot block it, and never waiting behind torchrun's own blocking
calls on the agent's connection), takes an index, says who it is, and every BEAT seconds adds one to its
heartbeat counter and reads the others'. Counters are compared with their own earlier values on this node's
clock, never with another machine's clock.

- A peer whose counter has not moved for LOST seconds, and that has not said it is done (its workers have
  finished: `mark_done`, at torchrun's exit barrier), is lost.
- A store that fails every operation for LOST seconds is lost too: the node that hosts it is gone -- unless
  every peer, or this node itself, had said it was done (the job is ending).

A loss is reported once, as `partita: error: lost node ...`, by `on_lost` (runtime.api: the workers of this
node are stopped, the line printed, the launcher exits 1), or handed to a launcher that is already reporting
a failure of its own workers (`verdict`): a peer that only saw "connection closed" or a stop requested from the
lost node then names the lost node instead. LOST + BEAT + the workers' grace keeps the line within 30 s.
"""
from __future__ import annotations

import datetime
import os
import socket
import threading
import time
from typing import Callable

from partita.runtime.launcher.store import APART

BEAT = 1.0
"""Seconds between heartbeats."""
LOST = 12.0
"""Seconds without a heartbeat (or without an answering store) after which a peer is lost."""
OP_TIMEOUT = 5.0
"""Seconds one store operation of the watch may take."""
KEY = "partita/peers/{run_id}/"


class PeerWatch:
    """The heartbeat thread of one node's launcher (module docstring)."""

    def __init__(self, host: str, port: int, run_id: str, on_lost: Callable[[str], None] | None = None,
                 lost: float = LOST, beat: float = BEAT, op_timeout: float = OP_TIMEOUT):
        self.host, self.port, self.base = host, port, KEY.format(run_id=run_id)
        self.on_lost, self.lost_after, self.beat, self.op_timeout = on_lost, lost, beat, op_timeout
        self.index: int | None = None
        self.line: str | None = None
        """The loss, once seen."""
        self.found = threading.Event()
        self.claimed: str | None = None
        """Who reports the loss, once: "watch" (`on_lost`) or "launcher" (`verdict`)."""
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.done = False
        self._store = None
        self._seen: dict[int, tuple[int, float]] = {}  # peer index: (counter, when it last moved, this clock)
        self._known: set[int] = set()  # every peer index seen
        self._done_peers: set[int] = set()
        self._failing_since: float | None = None
        self.thread = threading.Thread(target=self._run, name="partita-peer-watch", daemon=True)

    # ---- the store ---------------------------------------------------------------------------------

    def _client(self):
        if self._store is None:
            import torch.distributed as dist
            self._store = dist.TCPStore(self.host, self.port, is_master=False, use_libuv=True,
                                        timeout=datetime.timedelta(seconds=self.op_timeout))
        return self._store

    def _add(self, key: str, n: int) -> int:
        return int(self._client().add(self.base + key, n))

    def start(self) -> "PeerWatch":
        try:
            self.index = self._add("agents", 1)
            self._client().set(self.base + f"who/{self.index}", f"{socket.gethostname()} (launcher pid {os.getpid()})")
        except Exception:  # noqa: BLE001 -- no store now: the watch starts failing, and judges that
            self._store = None
        self.thread.start()
        return self

    # ---- the thread --------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self.stopped.wait(self.beat):
            if self.done:
                self._say_done()
            try:
                line = self._look()
                self._failing_since = None
            except Exception:  # noqa: BLE001 -- the store went away, or stopped answering
                self._store = None
                now = time.monotonic()
                self._failing_since = self._failing_since or now
                # the job is ending: every peer, or this node (past torchrun's exit barrier, which a store gone
                # with its host releases by itself), had finished its workers
                ending = self.done or self._all_done()
                line = None if ending or now - self._failing_since < self.lost_after else (
                    f"lost the rendezvous store at {self.host}:{self.port}: the node that hosts it was killed, or "
                    f"its machine or network went down ({now - self._failing_since:.0f} s without an answer); "
                    + APART.format(port=self.port))
            if line:
                self._found(line)
                return

    def _look(self) -> str | None:
        """One heartbeat and one look at the peers: the line of a lost one, or None."""
        if self.index is None:
            self.index = self._add("agents", 1)
        self._add(f"beat/{self.index}", 1)
        now = time.monotonic()
        for peer in range(1, self._add("agents", 0) + 1):
            if peer == self.index or peer in self._done_peers:
                continue
            self._known.add(peer)
            if self._client().check([self.base + f"done/{peer}"]):
                self._done_peers.add(peer)
                continue
            count = self._add(f"beat/{peer}", 0)
            last = self._seen.get(peer)
            if last is None or last[0] != count:
                self._seen[peer] = (count, now)
            elif now - last[1] >= self.lost_after:
                who = self._client().get(self.base + f"who/{peer}").decode(errors="replace")
                return (f"lost node {who}: no heartbeat for {now - last[1]:.0f} s -- it was killed, or its machine "
                        "or network went down")
        return None

    def _all_done(self) -> bool:
        """Whether every peer this watch has seen said it was done."""
        return bool(self._known) and self._known <= self._done_peers

    def _found(self, line: str) -> None:
        self.line = line
        self.found.set()
        with self.lock:
            if self.claimed:
                return
            self.claimed = "watch"
        if self.on_lost is not None:
            self.on_lost(line)

    def _say_done(self) -> None:
        try:
            if self.index is not None:
                self._client().set(self.base + f"done/{self.index}", "1")
        except Exception:  # noqa: BLE001 -- nobody left to tell
            pass

    # ---- the launcher's side -----------------------------------------------------------------------

    def mark_done(self) -> None:
        """This node's workers have finished (torchrun's exit barrier): its peers stop watching it."""
        self.done = True
        self._say_done()

    def verdict(self, wait: float) -> str | None:
        """The launcher is reporting a failure that may be a lost peer's consequence: wait up to `wait`
        seconds for the watch to find a lost node (returned: this caller then reports it, `on_lost` does
        not), or for every peer to be done or the watch to end (None)."""
        with self.lock:
            watch_reports = self.claimed == "watch" and self.on_lost is not None
            self.claimed = self.claimed or "launcher"
        if watch_reports:  # `on_lost` is stopping this launcher and says why
            self.stopped.wait(2 * self.lost_after)
            return self.line
        end = time.monotonic() + wait
        while time.monotonic() < end and not self.found.is_set() and self.thread.is_alive():
            if self._all_done():
                break
            self.found.wait(0.2)
        return self.line

    def stop(self) -> None:
        """The launcher ends: say so (so no peer mistakes it for lost), and end the thread."""
        self.mark_done()
        self.stopped.set()

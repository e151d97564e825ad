"""A rendezvous store in a process of its own (`partita rendezvous --port P`), so that a multi-node job survives the
loss of any of its training nodes.

torchrun's c10d rendezvous keeps its state in a TCPStore that the agent on the endpoint's host serves: when that
node is lost, the store goes with it and every node's job ends, elastic or not. Served by this process instead --
on a machine that trains nothing (a login or head node), or on a training node started before its `partita run`
-- the store outlives every training node:

- torch's c10d backend first tries to serve the store on the endpoint's host and, finding the port taken there,
  connects to it like every other node (torch.distributed.elastic.rendezvous.c10d_rendezvous_backend
  `_create_tcp_store`); nodes on other hosts connect anyway. So no training node serves it.
- The workers of each round meet in a store of their own that the round's rank 0 serves
  (TORCH_DISABLE_SHARE_RDZV_TCP_STORE, set by runtime.launcher.agent), made anew every round: a round after the
  loss of the node that was rank 0 does not look for that node's store.
- `partita run`'s endpoint check (runtime.launcher.rendezvous.check_endpoint) probes the port: this store
  answers as a rendezvous store does.

One store serves job after job, each under its --rdzv-id; a job that has ended closes its id (runtime.launcher
.rendezvous.failure_line: the next job needs another id). The process serves until SIGINT, SIGTERM or SIGHUP,
then exits 0; a port it cannot take is one line, exit 2 (partita.cli).
"""
from __future__ import annotations

import signal
import socket

from partita.costmodel.errors import PartitaError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
APART = ("serve the store apart from the training nodes (`partita rendezvous --port {port}`) so that no node's loss "
         "ends the job")
"""The remedy named wherever a job ends because the node that served its rendezvous store was lost."""


def open_store(port: int):
    """torch's TCPStore served on `port` (every interface) by this process; PartitaError in one line where the
    port cannot be served."""
    import torch.distributed as dist
    if not 0 < port < 65536:
        raise PartitaError(f"--port {port} must be from 1 to 65535")
    try:
        return dist.TCPStore("0.0.0.0", port, is_master=True, wait_for_workers=False, use_libuv=True)
    except (RuntimeError, ValueError) as e:  # DistNetworkError (a RuntimeError): the port is taken
        first = " ".join(str(e).split())[:200]
        raise PartitaError(f"cannot serve a rendezvous store on port {port} ({first}): choose a free port") from None


def serve(port: int, say=print) -> int:
    """Serve the rendezvous store on `port` until a stop signal; say how the nodes reach it. Returns 0."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # taken by sigwait below, not by a handler
    store = open_store(port)
    host = socket.getfqdn()
    say(f"partita: rendezvous store serving on {host}:{port}; start every node with --rdzv-endpoint {host}:{port} "
        f"(or this machine's address) and its own --rdzv-id per job; Ctrl-C ends it", flush=True)
    received = signal.sigwait(STOP_SIGNALS)
    del store
    say(f"partita: rendezvous store on port {port} stopped ({signal.Signals(received).name})", flush=True)
    return 0

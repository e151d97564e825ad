"""runtime.launcher.peers.PeerWatch on a real TCPStore, in one process (issue 47 item 5): the launchers' heartbeats, with
short LOST and BEAT so a test takes seconds. A peer that stops beating without a word is lost and named; one that
said it was done is not; a store that goes away is lost too, unless this node had finished. The whole launcher
path (two `partita run` nodes, one killed) is in tests/e2e/test_agreement_and_peers.py."""
import datetime
import os
import socket

import torch.distributed as dist

from partita.runtime.launcher.peers import PeerWatch

FAST = {"lost": 1.0, "beat": 0.1, "op_timeout": 1.0}


def end(*watches: PeerWatch) -> None:
    for w in watches:
        w.stop()
    for w in watches:
        w.thread.join(timeout=30)  # none left inside a store call when the interpreter ends


def store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=10))


def test_a_silent_peer_is_lost_and_a_finished_one_is_not():
    s = store()
    me = PeerWatch("127.0.0.1", s.port, "job", **FAST).start()
    done = PeerWatch("127.0.0.1", s.port, "job", **FAST).start()
    silent = PeerWatch("127.0.0.1", s.port, "job", **FAST).start()
    done.stop()              # its workers finished: it says so, and stops beating
    silent.stopped.set()     # killed: it stops beating without a word
    line = me.verdict(wait=60)
    assert line is not None and line.startswith(f"lost node {socket.gethostname()} (launcher pid {os.getpid()}): "
                                                "no heartbeat for "), line
    assert line.endswith("s -- it was killed, or its machine or network went down")
    assert done.index in me._done_peers and silent.index not in me._done_peers
    end(me, done, silent)


def test_peers_that_all_finished_are_no_loss():
    s = store()
    me = PeerWatch("127.0.0.1", s.port, "job2", **FAST).start()
    other = PeerWatch("127.0.0.1", s.port, "job2", **FAST).start()
    other.stop()
    assert me.verdict(wait=60) is None  # returns once every peer it saw is done
    end(me, other)


def test_a_store_that_goes_away_is_lost_unless_this_node_had_finished():
    s = store()
    me = PeerWatch("127.0.0.1", s.port, "job3", **FAST).start()
    finished = PeerWatch("127.0.0.1", s.port, "job3", **FAST).start()
    finished.mark_done()
    port = s.port
    del s  # the node that hosted the store is gone
    line = me.verdict(wait=60)
    assert line.startswith(f"lost the rendezvous store at 127.0.0.1:{port}: the node that hosts it was killed, or "
                           "its machine or network went down ("), line
    assert line.endswith(f"; serve the store apart from the training nodes (`partita rendezvous --port {port}`) so "
                         "that no node's loss ends the job"), line
    assert finished.line is None and finished.thread.is_alive()  # it had finished: no loss
    end(me, finished)

"""The rendezvous' real causes, each one line (issue 47 item 9), checked without launching torchrun: a HOST that
does not resolve (torch retried it for the whole deadline, ~50 warning lines, and then blamed the store), and a
port held on all addresses by a program that is not a rendezvous store, reached under any of this machine's
names (only a port the hosting node could not bind was caught, so a node reaching it as a client connected
and hung). tests/e2e/test_agreement_and_peers.py runs the launcher on such a port."""
import socket
import pytest

from partita.costmodel import PartitaError
from partita.runtime.launcher import rendezvous

def test_a_host_that_does_not_resolve_is_one_line():
    with pytest.raises(PartitaError) as e:
        rendezvous.check_endpoint("nosuchhost.invalid:29400")
    assert str(e.value).startswith("rendezvous endpoint nosuchhost.invalid:29400: the host name 'nosuchhost.invalid' "
                                   "does not resolve (")
    assert str(e.value).endswith("give --rdzv-endpoint a name every node can resolve, or the IP address of the "
                                 "node that hosts the rendezvous")


def addresses() -> list[str]:
    """0.0.0.0 and this machine's own addresses besides loopback (what another node would be given)."""
    found = {"0.0.0.0"}
    for name in (socket.gethostname(), socket.getfqdn()):
        try:
            found |= {a[4][0] for a in socket.getaddrinfo(name, None, socket.AF_INET)}
        except OSError:
            pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent: only the route's source address is asked for
            found.add(s.getsockname()[0])
    except OSError:
        pass
    return sorted(a for a in found if not a.startswith("127."))


def test_a_program_on_all_addresses_is_one_line_whichever_address_a_node_uses():
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen(16)  # accepts connections (the kernel does, up to 16) and never answers
        port = held.getsockname()[1]
        for host in addresses():
            with pytest.raises(PartitaError, match=f"rendezvous endpoint {host}:{port}: the port is held by another "
                                                   "program, not a rendezvous store"):
                rendezvous.check_endpoint(f"{host}:{port}", wait=2)


def test_nothing_listening_yet_is_no_error():
    """The node that hosts the endpoint may start after this one: a free port on a resolvable host passes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    rendezvous.check_endpoint(f"localhost:{free}")
    rendezvous.check_endpoint(f"0.0.0.0:{free}")


def test_a_stopped_launcher_stops_its_keep_alive_thread_and_leaves_the_rendezvous_open(monkeypatch):
    """torch's agent leaves the rendezvous open when a signal stops it, and with it the handler's keep-alive thread;
    `stop_heartbeats` ends that thread (a real one-node c10d rendezvous on this machine), and the rendezvous stays
    open for the job's other nodes."""
    import threading

    from torch.distributed.elastic.rendezvous import RendezvousParameters

    from rank_pool import free_port
    monkeypatch.setattr(rendezvous, "HANDLER", None)
    port = free_port()
    rendezvous.SEEN.endpoint, rendezvous.SEEN.timeout = f"127.0.0.1:{port}", 30
    params = RendezvousParameters(backend=rendezvous.BACKEND, endpoint=f"127.0.0.1:{port}", run_id="heartbeats",
                                  min_nodes=1, max_nodes=1, is_host=True, join_timeout=30)
    handler = rendezvous._create(params)
    handler.next_rendezvous()

    def keep_alive():
        return [t for t in threading.enumerate() if t.name.startswith("RendezvousKeepAliveTimer")]
    assert keep_alive()
    rendezvous.stop_heartbeats()
    assert not keep_alive()
    assert not handler.inner.is_closed()
    rendezvous.stop_heartbeats()  # again, or after a shutdown: nothing
    handler.shutdown()
    assert handler.inner.is_closed()

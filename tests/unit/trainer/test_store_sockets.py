"""The store's connections are found by their peer and get TCP_NODELAY (real sockets, one process)."""

from __future__ import annotations

import socket

from edl.frameworks.rendezvous import no_delay, store_sockets


def test_the_connections_to_the_store_and_only_those_get_no_delay():
    store = socket.create_server(("127.0.0.1", 0))
    other = socket.create_server(("127.0.0.1", 0))
    port = store.getsockname()[1]
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    bystander = socket.create_connection(other.getsockname())
    accepted = [store.accept()[0] for _ in clients]  # the server's ends: their peer is the client, not the port
    try:
        found = store_sockets("127.0.0.1", port)
        assert sorted(found) == sorted(c.fileno() for c in clients)
        assert all(c.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0 for c in clients)  # Linux's default
        no_delay(found)
        assert all(c.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0 for c in clients)
        assert bystander.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
        # The duplicates it opened are closed again; the sockets themselves still work.
        clients[0].sendall(b"x")
        assert accepted[0].recv(1) == b"x"
        assert store_sockets("localhost", port) == found  # a name is resolved to the address it connects to
    finally:
        for s in [*clients, bystander, *accepted, store, other]:
            s.close()

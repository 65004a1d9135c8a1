"""The fault suite's proxy cuts a path the way a network does: what was sent waits
and arrives once the path heals, in order, never dropped from the middle of the
stream. It read and dropped the bytes that became readable just as the cut began
(the selector's answer came before the cut, the read after it): a query lost that
way left the engine's writer waiting for an answer that could never come, and the
suite then stopped that engine the hard way (a make test run on PostgreSQL:
112 duplicates no fault explained)."""

import socket

from tests.support.faults.proxy import Proxy


def test_bytes_ready_as_the_path_is_cut_arrive_once_it_heals():
    upstream = socket.create_server(("127.0.0.1", 0))
    proxy = Proxy(upstream.getsockname()[:2])
    try:
        client = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        server, _ = upstream.accept()
        server.settimeout(5)
        client.sendall(b"before")
        assert server.recv(100) == b"before"
        proxy.cut()
        client.sendall(b"query")
        # The proxy's loop acting on readiness it saw before the cut.
        inner = next(sock for sock in list(proxy._peer) if proxy._is_client(sock))
        proxy._forward(inner)
        proxy.heal()
        assert server.recv(100) == b"query"
        client.close()
        server.close()
    finally:
        proxy.stop()
        upstream.close()

"""The fault suite's recording receiver must not make duplicates of its own.

Its listen backlog was 5 (request_queue_size set after the socket listened): an
engine's burst of new connections after a take-over waited in the kernel past the
attempt's deadline, the engine retried, and the receiver then answered both — a
duplicate no fault explained (docs/faults.md, the 300-fault run)."""

import socket

from tests.support.faults.receiver import Receiver

BURST = 300


def test_the_kernel_holds_an_engines_burst_of_connections_for_the_receiver():
    receiver = Receiver()
    receiver.server.shutdown()  # still listening; nothing accepts
    held = []
    try:
        for _ in range(BURST):
            client = socket.socket()
            client.settimeout(0.5)
            try:
                client.connect(("127.0.0.1", receiver.port))
            except TimeoutError:  # the backlog is full: the SYN was dropped
                client.close()
                break
            held.append(client)
        assert len(held) == BURST
    finally:
        for client in held:
            client.close()
        receiver.server.server_close()

"""The engine's HTTP client (deliveries/targets/transport.py) against real local
servers: what one receiver's trouble may cost the others."""

import gc
import os
import socket
import threading

import pytest

from deliveries.targets import transport


def test_a_silent_nameserver_does_not_stall_other_targets(dns, sink):
    """Lookups cannot be cancelled: an attempt that timed out leaves its lookup
    running. One target's ten attempts whose name never resolves must not hold every
    thread that resolves names for new connections."""
    answer = threading.Event()
    dns["silent.test"] = lambda: (answer.wait(30), ["127.0.0.1"])[1]
    dns["healthy.test"] = ["127.0.0.1"]
    try:
        stuck = [
            transport.client.submit(
                transport.send(
                    transport.request(
                        f"http://silent.test:{sink.port}/s", data=b"{}", headers={}, timeout=1
                    )
                )
            )
            for _ in range(10)
        ]
        for future in stuck:
            assert future.result(10).error.startswith("timed out after 1 s")
        # Queued behind the silent lookups, it would time out too.
        outcome = transport.post(
            f"http://healthy.test:{sink.port}/h", data=b"{}", headers={}, timeout=3
        )
        assert outcome.success, outcome.error
    finally:
        answer.set()


def test_a_connect_timeout_above_five_seconds_is_named_as_one(full_listener):
    """aiohttp rounds timeouts above 5 s up to the next whole second unless told not
    to; the connect would then outlast the attempt's deadline and be called a plain
    timeout."""
    outcome = transport.post(
        f"http://127.0.0.1:{full_listener}/", data=b"{}", headers={}, timeout=5.2
    )
    assert outcome.error.split("\n", 1)[0] == "could not connect within 5.2 s"


def test_a_forked_child_sends_on_a_loop_of_its_own_and_leaves_the_parents_alone(sink):
    """A process forked after the parent's loop started (gunicorn's workers from a
    preloaded master, multiprocessing's fork) inherits the loop but not the thread
    that runs it: its first attempt starts a loop of its own. What it inherited
    shares the parent's kernel objects (the epoll instance): tearing it down in the
    child must not take the parent's kept-alive connections out of the parent's
    loop, whose next attempt on one would then wait out its whole deadline."""
    url = f"http://127.0.0.1:{sink.port}/forked"
    assert transport.post(url, data=b"{}", headers={}, timeout=3).success
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 if its post went through
        code = 1
        try:
            code = 0 if transport.post(url, data=b"{}", headers={}, timeout=3).success else 1
            gc.collect()  # what it dropped of the parent's loop is finalized now
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent's kept-alive connection, used again.
    outcome = transport.post(url, data=b"{}", headers={}, timeout=3)
    assert outcome.success, outcome.error


@pytest.fixture
def closed_port():
    """A loopback port nothing listens on: a connect there is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_refused_attempt_leaves_nothing_for_the_cyclic_collector(closed_port):
    """A failed attempt keeps its words, not its frames. The exceptions behind it
    hold tracebacks, and those the frames of the request that failed, in reference
    cycles only the cyclic collector frees: some 80 objects an attempt, which an
    engine with a receiver down collected again and again."""
    url = f"http://127.0.0.1:{closed_port}/"
    attempts = 20

    def fail_all():
        futures = [
            transport.client.submit(
                transport.send(transport.request(url, data=b"{}", headers={}, timeout=5))
            )
            for _ in range(attempts)
        ]
        return [future.result(10) for future in futures]

    fail_all()  # the loop, the session and the pool as they will be
    gc.collect()
    gc.disable()
    try:
        outcomes = fail_all()
        left = gc.collect()
    finally:
        gc.enable()
    assert all(outcome.error.startswith("connection refused") for outcome in outcomes)
    assert left < attempts, f"{left} objects in cycles after {attempts} failed attempts"

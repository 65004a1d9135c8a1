"""The inbound edge under hostile load (webhooker/server/): slow senders, floods,
stalled writers, full disks, senders that hang up, and requests kept as received."""

import contextlib
import logging
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
import requests
from django.db import OperationalError, connection, connections
from django.test import Client

from deliveries import ingest
from deliveries.models import Delivery, Event, Webhook
from deliveries.targets import transport
from tests.support.engines import make_engine, pump
from tests.support.processes import ROOT, process_env, start_web, wait_until

pytestmark = pytest.mark.django_db


def exchange(base, payload: bytes, timeout=10.0) -> tuple[int, dict, bytes]:
    """Send one raw request; read one response: (status, headers, body)."""
    with connect(base, timeout) as sock:
        sock.sendall(payload)
        return read_response(sock)


def connect(base, timeout=10.0) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=timeout)


def read_response(sock) -> tuple[int, dict, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return 0, {}, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", 0))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split(" ", 2)[1]), headers, body


def post_bytes(path: str, body=b"{}", headers=b"", close=True) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n".encode()
        + headers
        + (b"Connection: close\r\n" if close else b"")
        + b"\r\n"
        + body
    )


class WriterLock:
    """The SQLite write lock held by this process, as a stalled writer holds it."""

    def __init__(self):
        self.conn = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)

    def __enter__(self):
        self.conn.execute("BEGIN IMMEDIATE")
        return self

    def __exit__(self, *exc):
        self.conn.execute("ROLLBACK")
        self.conn.close()


sqlite_only = pytest.mark.skipif(
    "connection.vendor != 'sqlite'", reason="SQLite's single writer lock"
)


# --- faithful requests ----------------------------------------------------------------


def test_query_string_is_stored_as_received(client, entrypoint):
    response = client.post(
        f"/webhook/{entrypoint.code}?a=1&a=2&b=%20x", b"{}", content_type="application/json"
    )
    assert response.status_code == 200
    assert Event.objects.get().query_string == "a=1&a=2&b=%20x"


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_every_header_line_and_the_query_string_are_stored_as_received(entrypoint, data_dir):
    web, base = start_web(data_dir, workers=1)
    try:
        status, _, _ = exchange(
            base,
            post_bytes(
                f"/webhook/{entrypoint.code}?x=1&y=%2F",
                headers=b"Cookie: a=1\r\nX_Under: kept\r\nCookie: b=2\r\n"
                b"X-Multi: one\r\nX-Multi: two, three\r\n"
                b"X-GitHub-Event: push\r\nx-lower: as sent\r\nDNT: 1\r\n",
            ),
        )
        # A chunked body's trailer fields come after the body: not header lines.
        chunked = (
            f"POST /webhook/{entrypoint.code} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            "Transfer-Encoding: chunked\r\nTrailer: X-Trailer\r\nConnection: close\r\n\r\n"
            "2\r\n{}\r\n0\r\nX-Trailer: after the body\r\n\r\n"
        ).encode()
        chunked_status, _, _ = exchange(base, chunked)
    finally:
        web.stop()
    assert status == 200
    assert chunked_status == 200
    event, chunked_event = Event.objects.order_by("id")
    assert event.query_string == "x=1&y=%2F"
    lines = [tuple(pair) for pair in event.headers]
    assert [v for n, v in lines if n == "Cookie"] == ["a=1", "b=2"]
    assert [v for n, v in lines if n == "X-Multi"] == ["one", "two, three"]
    # Names as the sender spelled them.
    assert ("X_Under", "kept") in lines
    assert ("X-GitHub-Event", "push") in lines
    assert ("x-lower", "as sent") in lines
    assert ("DNT", "1") in lines
    names = [n for n, _ in lines]
    assert names.index("Cookie") < names.index("X_Under") < names.index("X-Multi")
    assert "X-Trailer" not in [n for n, _ in chunked_event.headers]
    assert chunked_event.body == b"{}"


def deliver(
    entrypoint,
    make_target,
    sink,
    *,
    config=None,
    query="a=1&a=2",
    headers=None,
    content_type="application/json",
):
    make_target(config={"url": sink.url("/fwd?x=1"), **(config or {})})
    ingest.store_event(
        ingest.find_entrypoint(entrypoint.code, fresh=True),
        method="POST",
        headers=headers
        or [
            ["Content-Type", "application/json"],
            ["Cookie", "a=1"],
            ["Expect", "100-continue"],
            ["Cookie", "b=2"],
        ],
        body=b"{}",
        content_type=content_type,
        remote_addr="127.0.0.1",
        query_string=query,
    )
    engine = make_engine()
    engine.recover_once(at_start=True)
    pump(engine, lambda: not Delivery.objects.unfinished().exists())
    [received] = sink.requests()
    return received


def test_forwarded_with_the_query_appended_and_every_header_line(entrypoint, make_target, sink):
    received = deliver(entrypoint, make_target, sink)
    assert received.path == "/fwd?x=1&a=1&a=2"
    assert [v for n, v in received.lines if n == "Cookie"] == ["a=1", "b=2"]
    sent = {n.lower() for n, _ in received.lines}
    # Never sent by the sender, or only to webhooker itself.
    assert not sent & {"expect", "accept-encoding", "accept", "user-agent", "connection"}


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_header_that_never_ends_is_refused_once_past_the_heads_limit(entrypoint, data_dir):
    """The parser holds a header line until it ends, and the limits were checked
    only then: forty such connections grew a worker by a gigabyte. The head's
    bytes are counted as they arrive."""
    web, base = start_web(data_dir, workers=1)
    try:
        with connect(base, timeout=30) as sock:
            sock.sendall(
                f"POST /webhook/{entrypoint.code} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
                + b"X-Endless: "
            )
            with contextlib.suppress(OSError):  # the server may close before we finish
                for _ in range(64):
                    sock.sendall(b"a" * 16384)
            code, _, body = read_response(sock)
    finally:
        web.stop()
    assert code == 400, body


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_bodies_held_in_memory_have_a_budget_per_worker(entrypoint, data_dir):
    """Sixty senders each one byte short of a 10 MiB body held 685 MB of a worker
    until the body deadline. Past WEB_BODY_BUFFER bytes of bodies held (beyond each
    one's first 64 KiB, which most events fit in), a request is answered 503 with
    Retry-After, at once; the budget comes back as requests finish."""
    budget = 1_000_000
    web, base = start_web(data_dir, workers=1, WEB_BODY_BUFFER=budget)
    head = f"POST /webhook/{entrypoint.code} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    held = []

    def partial(sent: int) -> int:
        """A large body of which `sent` bytes come, the rest not yet: its status,
        or 0 if it is still waiting for the rest."""
        with connect(base, timeout=5) as sock:
            sock.sendall(f"{head}Content-Length: 300000\r\n\r\n".encode() + b" " * sent)
            try:
                return read_response(sock)[0]
            except OSError:
                return 0

    try:
        for _ in range(2):  # 560 000 bytes each sent (988 928 counted), more to come
            sock = connect(base)
            sock.sendall(f"{head}Content-Length: 600000\r\n\r\n".encode() + b" " * 560_000)
            held.append(sock)
        # What they sent read and counted (a body counted before theirs would make
        # them the ones past the budget), 80 000 bytes more (14 464 past the first
        # 64 KiB) are too many: refused once all of them are read, so the 503 is not
        # lost to a reset.
        time.sleep(1)
        over = partial(80_000)
        small, _, _ = exchange(base, post_bytes(f"/webhook/{entrypoint.code}", b"{}"))
        for sock in held:
            sock.close()
        wait_until(
            lambda: (
                exchange(base, post_bytes(f"/webhook/{entrypoint.code}", b" " * 300_000))[0] == 200
            ),
            message="the budget back once the held bodies are gone",
        )
    finally:
        for sock in held:
            sock.close()
        web.stop()
    assert over == 503
    assert small == 200


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_body_declared_too_large_is_refused_without_inviting_it(entrypoint, data_dir):
    """With `Expect: 100-continue` a client waits to be asked for its body: a body
    refused from its Content-Length alone is answered 413, never 100 Continue."""
    web, base = start_web(data_dir, workers=1)
    try:
        with connect(base) as sock:
            sock.sendall(
                f"POST /webhook/{entrypoint.code} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                "Content-Length: 104857600\r\nExpect: 100-continue\r\n\r\n".encode()
            )
            code, _, _ = read_response(sock)
    finally:
        web.stop()
    assert code == 413


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_forwarded_for_from_an_untrusted_peer_is_not_the_senders_address(entrypoint, data_dir):
    """Only WEBHOOKER_TRUSTED_PROXIES may name the client (TrustedProxyMiddleware);
    the server itself must not take X-Forwarded-For from whoever connects."""
    web, base = start_web(data_dir, workers=1)
    try:
        status, _, _ = exchange(
            base,
            post_bytes(
                f"/webhook/{entrypoint.code}",
                headers=b"X-Forwarded-For: 203.0.113.9\r\nX-Forwarded-Proto: https\r\n",
            ),
        )
    finally:
        web.stop()
    assert status == 200
    assert Event.objects.get().remote_addr == "127.0.0.1"


def test_the_query_is_forwarded_as_received_not_requoted(entrypoint, make_target, sink):
    """Escapes the sender sent stay as sent (none decoded, none quoted again, none
    recased, even beside a stray "%"); only what a URL cannot carry is
    percent-encoded."""
    received = deliver(
        entrypoint,
        make_target,
        sink,
        query="a=%41&y=%2f&lower=%c3%a9&c={1}|x&d=%zz&e=%20&f=caf\xe9",
    )
    assert received.path == (
        "/fwd?x=1&a=%41&y=%2f&lower=%c3%a9&c=%7B1%7D%7Cx&d=%25zz&e=%20&f=caf%E9"
    )
    delivery = Delivery.objects.get()
    assert delivery.results.get().request_url.endswith(received.path)


def test_content_type_lines_are_forwarded_as_received(entrypoint, make_target, sink):
    """The event's content_type column is cut at 255 characters and merges repeated
    lines; the header lines themselves are what the sender sent."""
    long = "multipart/form-data; boundary=" + "b" * 270
    received = deliver(
        entrypoint,
        make_target,
        sink,
        headers=[["Content-Type", long]],
        content_type=long[:255],
    )
    assert [v for n, v in received.lines if n.lower() == "content-type"] == [long]


def test_credentials_in_the_target_url_win_over_the_senders_authorization(
    entrypoint, make_target, sink
):
    """As a target's configured headers replace the sender's lines of that name."""
    url = sink.url("/fwd").replace("http://", "http://user:pass@")
    received = deliver(
        entrypoint,
        make_target,
        sink,
        config={"url": url},
        headers=[["Authorization", "Bearer the-senders"]],
    )
    assert [v for n, v in received.lines if n.lower() == "authorization"] == [
        "Basic dXNlcjpwYXNz"  # user:pass
    ]
    # The attempt's record shows what was sent, not the sender's line.
    recorded = Delivery.objects.get().results.get().request_headers
    assert "Bearer the-senders" not in [v for _, v in recorded]


def test_a_target_can_turn_query_forwarding_off(entrypoint, make_target, sink):
    received = deliver(entrypoint, make_target, sink, config={"drop_query": True})
    assert received.path == "/fwd?x=1"


def test_the_senders_user_agent_is_forwarded(entrypoint, make_target, sink):
    received = deliver(entrypoint, make_target, sink, headers=[["User-Agent", "GitHub-Hookshot"]])
    assert [v for n, v in received.lines if n.lower() == "user-agent"] == ["GitHub-Hookshot"]


def test_a_receivers_cookie_is_never_sent_on_later_deliveries(sink):
    """A client session keeps a receiver's Set-Cookie and sends it back to that
    host: a header the sender never sent, maybe another tenant's target."""
    sink.always("/c", 200, {"Set-Cookie": "session=theirs; Path=/"})
    for _ in range(2):
        outcome = transport.post(sink.url("/c"), data=b"{}", headers={}, timeout=5, forwarded=True)
        assert outcome.success
    for received in sink.requests("/c"):
        assert "cookie" not in {n.lower() for n, _ in received.lines}


def test_credentials_in_the_target_url_are_sent_as_basic_auth(sink):
    url = sink.url("/auth").replace("http://", "http://user:p%40ss@")
    assert transport.post(url, data=b"{}", headers={}, timeout=5, forwarded=True).success
    [received] = sink.requests("/auth")
    assert received.headers["Authorization"] == "Basic dXNlcjpwQHNz"  # user:p@ss


# --- slow senders, floods, senders that hang up ----------------------------------------


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_slow_senders_hold_no_thread(entrypoint, data_dir):
    """Fifty senders trickling bodies, over one worker of four threads: normal
    senders are still answered at once."""
    web, base = start_web(data_dir, workers=1)
    slow = []
    try:
        for _ in range(50):
            sock = connect(base)
            sock.sendall(
                f"POST /webhook/{entrypoint.code} HTTP/1.1\r\nHost: x\r\n"
                "Content-Length: 100\r\n\r\n{".encode()
            )
            slow.append(sock)
        took = []
        for _ in range(20):
            started = time.monotonic()
            status, _, _ = exchange(base, post_bytes(f"/webhook/{entrypoint.code}"), timeout=5)
            took.append(time.monotonic() - started)
            assert status == 200
        assert max(took) < 2.0, took
    finally:
        for sock in slow:
            sock.close()
        web.stop()
    assert Event.objects.count() == 20


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_request_head_that_never_ends_is_cut_off(entrypoint, data_dir):
    """Slowloris on the headers: uvicorn alone would wait for them forever."""
    web, base = start_web(data_dir, workers=1, WEBHOOKER_HEADER_TIMEOUT=1)
    try:
        with connect(base, timeout=30) as sock:
            started = time.monotonic()
            sock.sendall(
                f"POST /webhook/{entrypoint.code} HTTP/1.1\r\nHost: x\r\nX-Slow: ".encode()
            )
            assert sock.recv(1024) == b""  # closed by the server
            took = time.monotonic() - started
    finally:
        web.stop()
    # By the setting's deadline, not the default 10 s (the clock starts at the
    # connection, a little before `started`).
    assert 0.5 < took < 8


@sqlite_only
@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_the_healthcheck_and_metrics_answer_past_the_admission_limit(entrypoint, data_dir):
    """Every thread busy and the queue full of inbound requests (the writer held):
    the healthcheck and /metrics have a thread of their own, and answer for
    themselves rather than with the admission's 503 (issue 30)."""
    web, base = start_web(data_dir, workers=1, WEB_THREADS=1, WEB_QUEUE=0, SQLITE_BUSY_TIMEOUT=30)
    url = f"{base}/webhook/{entrypoint.code}"
    answered = []
    try:
        with WriterLock():
            # Two at once: one takes the thread (and waits for the writer), the
            # other is refused by the admission limit.
            senders = [
                threading.Thread(
                    target=lambda: answered.append(requests.post(url, data=b"{}", timeout=30))
                )
                for _ in range(2)
            ]
            for sender in senders:
                sender.start()
            wait_until(lambda: answered, message="one refused")
            health = requests.get(f"{base}/.well-known/healthcheck", timeout=10)
            metrics = requests.get(f"{base}/metrics", timeout=10)
        for sender in senders:
            sender.join(30)
    finally:
        web.stop()
    assert sorted(r.status_code for r in answered) == [200, 503]
    assert health.headers["Content-Type"] == "application/json"
    assert "database" in health.json()
    assert metrics.status_code == 404  # no METRICS_USERNAME: its own answer, not 503


@sqlite_only
@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_flood_past_capacity_is_answered_503_with_retry_after_at_once(entrypoint, data_dir):
    """One thread and a queue of two: with the writer held, three requests are
    admitted and every other one is refused fast; all recover when it is free."""
    web, base = start_web(data_dir, workers=1, WEB_THREADS=1, WEB_QUEUE=2, SQLITE_BUSY_TIMEOUT=30)
    url = f"{base}/webhook/{entrypoint.code}"
    results = []

    def send():
        started = time.monotonic()
        response = requests.post(url, data=b"{}", timeout=30)
        results.append((response.status_code, response.headers, time.monotonic() - started))

    try:
        with WriterLock():
            senders = [threading.Thread(target=send) for _ in range(20)]
            for sender in senders:
                sender.start()
            wait_until(lambda: len(results) >= 17, timeout=10, message="17 refusals")
            refused = list(results)
        for sender in senders:
            sender.join(30)
        after = requests.post(url, data=b"{}", timeout=5)
    finally:
        web.stop()
    assert all(status == 503 for status, _, _ in refused)
    assert all(headers["Retry-After"].isdigit() for _, headers, _ in refused)
    assert max(took for _, _, took in refused) < 3
    assert sorted(status for status, _, _ in results) == [200] * 3 + [503] * 17
    assert after.status_code == 200
    assert Event.objects.count() == 4


@sqlite_only
@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_an_event_whose_sender_hung_up_is_not_stored(entrypoint, data_dir):
    web, base = start_web(data_dir, workers=1, WEB_THREADS=1, SQLITE_BUSY_TIMEOUT=30)
    try:
        with WriterLock():
            sock = connect(base)
            sock.sendall(post_bytes(f"/webhook/{entrypoint.code}", body=b'{"gone": 1}'))
            # Lets the request reach the database (blocked on the lock) before the
            # sender gives up; nothing is waited for here.
            time.sleep(0.5)
            sock.close()
            time.sleep(0.2)
        # One thread: this one is handled after the abandoned one has finished.
        after = requests.post(f"{base}/webhook/{entrypoint.code}", data=b'{"n": 2}', timeout=10)
    finally:
        web.stop()
    assert after.status_code == 200
    assert [bytes(e.body) for e in Event.objects.all()] == [b'{"n": 2}']


def test_sender_gone_before_commit_rolls_the_event_back(entrypoint, make_target):
    make_target(url="http://example.com/a")
    gone = threading.Event()
    gone.set()
    response = Client().post(
        f"/webhook/{entrypoint.code}",
        b"{}",
        content_type="application/json",
        **{"webhooker.gone": gone},
    )
    assert response.status_code == 499
    assert Event.objects.count() == 0
    assert Delivery.objects.count() == 0


# --- a stalled writer, a full disk ---------------------------------------------------------

HOLDER = """
import os, signal, sys, django
django.setup()
from django.db import transaction
from deliveries.models import Webhook
with transaction.atomic():
    Webhook.objects.filter(id=0).update(name="x")
    print("holding", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
"""


@sqlite_only
@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_stalled_writer_gets_inbound_requests_503_not_a_hang(entrypoint, data_dir):
    """A process stopped (SIGSTOP) inside a write transaction, as the engine was."""
    web, base = start_web(data_dir, workers=1, SQLITE_BUSY_TIMEOUT=1)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER],
        cwd=ROOT,
        env=process_env(data_dir),
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline() == b"holding\n"
        started = time.monotonic()
        response = requests.post(f"{base}/webhook/{entrypoint.code}", data=b"{}", timeout=15)
        took = time.monotonic() - started
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        log = web.log()
        web.stop()
    assert response.status_code == 503
    assert response.headers["Retry-After"].isdigit()
    assert took < 10
    assert "Traceback" not in log
    assert Event.objects.count() == 0


@sqlite_only
@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_requests_queued_behind_a_stalled_writer_wait_the_bound_once_not_in_turn(
    entrypoint, data_dir
):
    """The writer-lock bound counts from a request's arrival, not from when a thread
    takes it up: behind one thread busy waiting, eight requests each waited the
    whole bound in turn (the last 16 s for a 2 s bound; 20 s each by default, two
    minutes for the queue's last)."""
    bound = 2
    web, base = start_web(
        data_dir, workers=1, SQLITE_BUSY_TIMEOUT=bound, WEB_THREADS=1, WEB_QUEUE=8
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER], cwd=ROOT, env=process_env(data_dir), stdout=subprocess.PIPE
    )
    answers = {}

    def post(n):
        started = time.monotonic()
        response = requests.post(f"{base}/webhook/{entrypoint.code}", data=b"{}", timeout=60)
        answers[n] = (response.status_code, time.monotonic() - started)

    try:
        assert holder.stdout.readline() == b"holding\n"
        senders = [threading.Thread(target=post, args=(n,)) for n in range(8)]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join(60)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        web.stop()
    assert sorted(status for status, _ in answers.values()) == [503] * 8
    # Each waited about the bound since it arrived (a wide margin for a slow
    # machine; in turn, the last would wait eight bounds).
    assert max(took for _, took in answers.values()) < 3 * bound, answers
    assert Event.objects.count() == 0


@sqlite_only
@pytest.mark.django_db(transaction=True)
def test_a_new_connection_reads_while_a_writer_holds_the_lock():
    """WAL readers never wait for the writer, and connecting is no exception: a web
    worker's or an admin page's first connection does not wait behind a long write
    (nor, behind a stalled one, fail with "database is locked")."""
    outcome = {}

    def read():
        conn = connections.create_connection("default")
        try:
            with conn.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM deliveries_event")
                outcome["count"] = cursor.fetchone()[0]
        except Exception as exc:
            outcome["error"] = exc
        finally:
            conn.close()

    with WriterLock():
        reader = threading.Thread(target=read)
        reader.start()
        reader.join(10)
        assert not reader.is_alive(), "connecting waited for the writer"
    assert outcome == {"count": 0}


def test_a_full_disk_answers_503_with_retry_after_and_one_log_line(entrypoint, caplog):
    def full(execute, sql, params, many, context):
        if "INSERT" in sql:
            raise OperationalError("database or disk is full")
        return execute(sql, params, many, context)

    client = Client(raise_request_exception=False)
    with caplog.at_level(logging.INFO), connection.execute_wrapper(full):
        response = client.post(f"/webhook/{entrypoint.code}", b"{}", content_type="x/y")
    assert response.status_code == 503
    assert response["Retry-After"].isdigit()
    assert len(caplog.records) == 1
    assert "disk is full" in caplog.records[0].getMessage()
    assert caplog.records[0].exc_info is None
    assert Event.objects.count() == 0


def test_the_event_page_shows_the_query_string(alice):
    from django.urls import reverse

    from tests.support.admin import client_for

    hook = Webhook.objects.create(name="h", owner=alice)
    hook.ensure_entrypoint()
    response = Client().post(
        f"/webhook/{hook.entrypoints.get().code}?topic=orders%2Fpaid", b"{}", content_type="x/y"
    )
    event = Event.objects.get(code=response.json()["event"])
    page = client_for(alice).get(reverse("admin:deliveries_event_change", args=[event.pk]))
    assert "topic=orders%2Fpaid" in page.content.decode()


@pytest.mark.parametrize(
    ("config", "error"),
    [
        ({"url": "https://example.com/", "drop_query": True}, None),
        ({"url": "https://example.com/", "drop_query": "yes"}, "true or false"),
    ],
)
def test_drop_query_is_a_per_target_switch(config, error):
    from django.core.exceptions import ValidationError

    from deliveries.targets import clean_config

    if error is None:
        assert clean_config("http", config) == config
    else:
        with pytest.raises(ValidationError, match=error):
            clean_config("http", config)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGQUIT, signal.SIGTERM])
def test_gunicorn_stops_at_once_on_each_stop_signal(data_dir, signum):
    # SIGINT and SIGQUIT are gunicorn's quick stop: it sends its workers SIGQUIT,
    # which uvicorn's worker class took in without stopping its server (gunicorn
    # then waited its 30 s graceful timeout and killed them).
    web, _base = start_web(data_dir, workers=1)
    started = time.monotonic()
    web.send(signum)
    assert web.wait(15) == 0
    assert time.monotonic() - started < 10
    assert "SIGKILL" not in web.log()

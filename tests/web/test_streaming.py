"""Responses whose body comes in pieces (exports, files) go to the client as they are
produced, through the edge in front of Django (webhooker/server/bridge.py), never
gathered whole in the worker."""

import asyncio
import json
import threading

import pytest
import requests
from django.utils import timezone

from deliveries.models import Event
from tests.support.admin import world
from tests.support.api import key_for
from tests.support.history import copies
from tests.support.processes import start_web
from webhooker.server.bridge import STREAM_WRITE, Edge

PIECE = b"x" * STREAM_WRITE


def serve(
    app, *, written=lambda: None, hang_up_after_first_write=False, stalls=False, body_timeout=10
) -> list[dict]:
    """One GET through an Edge in front of the WSGI `app`; the ASGI messages it
    sent. `written()` is called on each body write as the client receives it."""
    sent, asked = [], []

    async def run():
        hung_up = asyncio.Event()

        async def receive():
            if not asked:
                asked.append(True)
                return {"type": "http.request", "body": b"", "more_body": False}
            await hung_up.wait()  # the edge watching for a hang-up
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)
            if message["type"] == "http.response.body":
                written()
                if hang_up_after_first_write:
                    hung_up.set()
                if stalls:  # a client that stops reading: the write never drains
                    await asyncio.Event().wait()
            await asyncio.sleep(0)

        scope = {
            "type": "http",
            "method": "GET",
            "path": "/export",
            "raw_path": b"/export",
            "query_string": b"",
            "headers": [],
            "http_version": "1.1",
            "scheme": "http",
            "server": ("127.0.0.1", 8000),
            "client": ("127.0.0.1", 5000),
        }
        await edge(scope, receive, send)

    edge = Edge(app, threads=2, queue=2, body_timeout=body_timeout, max_body=1024)
    try:
        asyncio.run(run())
    finally:
        edge.requests.executor.shutdown(wait=True)
    return sent


def writes(sent) -> list[dict]:
    return [m for m in sent if m["type"] == "http.response.body"]


def test_a_body_in_pieces_reaches_the_client_before_its_last_piece_is_made():
    """The first write is with the client while the view still produces the rest:
    the view waits for it before it makes its last piece (a worker gathering the
    body whole would have had the view wait out its bound)."""
    received = threading.Event()
    waited = []

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])

        def pieces():
            yield PIECE
            waited.append(received.wait(timeout=30))
            yield b"end"

        return pieces()

    sent = serve(app, written=received.set)
    assert waited == [True]
    assert sent[0]["type"] == "http.response.start"
    assert sent[0]["status"] == 200
    assert b"".join(m["body"] for m in writes(sent)) == PIECE + b"end"
    assert [m["more_body"] for m in writes(sent)] == [True, False]


def test_small_pieces_are_gathered_into_writes_and_a_whole_body_is_one_message():
    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return iter([b"a" * 1000] * 200)  # 200 000 bytes in 1 000-byte pieces

    sent = serve(app)
    assert b"".join(m["body"] for m in writes(sent)) == b"a" * 200_000
    assert len(writes(sent)) == 4  # three writes of 66 000 bytes, then the rest

    def whole(environ, start_response):
        start_response("200 OK", [("Content-Length", "2")])
        return [b"ok"]

    assert [m.get("more_body", False) for m in writes(serve(whole))] == [False]
    assert writes(serve(whole))[0]["body"] == b"ok"


def test_a_client_that_hangs_up_mid_body_stops_the_view_producing_it():
    made, closed = [], []

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])

        def pieces():
            try:
                for n in range(200):  # 12.5 MiB, were it all made
                    made.append(n)
                    yield PIECE
            finally:
                closed.append(True)

        return pieces()

    sent = serve(app, hang_up_after_first_write=True)
    assert closed == [True]
    assert len(made) < 10
    assert all(m["more_body"] for m in writes(sent))  # never finished: the client left


def test_a_client_that_stops_reading_is_cut_off_and_frees_the_thread(caplog):
    """Its write is not taken within WEBHOOKER_BODY_TIMEOUT: the view stops, its
    generator closed, and the thread goes back to the pool."""
    made, closed = [], []

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])

        def pieces():
            try:
                for n in range(200):
                    made.append(n)
                    yield PIECE
            finally:
                closed.append(True)

        return pieces()

    sent = serve(app, stalls=True, body_timeout=0.2)
    assert closed == [True]
    assert len(made) < 10
    assert len(writes(sent)) == 1
    assert "took no part of a response" in caplog.text


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_an_export_through_the_server_arrives_whole(alice, data_dir):
    """The API's export through gunicorn and the edge: every row, once. That it
    goes in pieces as they are made is shown by the edge's tests above, which
    hold the view between its pieces; through a real server it is not observable
    without timing."""
    hook, *_ = world(alice, "streamed")
    copies(Event.objects.create(webhook=hook, method="POST", received_at=timezone.now()), 19_999)
    key = key_for(alice)
    web, base = start_web(data_dir, workers=1)
    try:
        response = requests.get(
            f"{base}/api/v1/events/export/",
            headers={"Authorization": f"Bearer {key}"},
            stream=True,
            timeout=60,
        )
        assert response.status_code == 200
        assert response.headers["Transfer-Encoding"] == "chunked"
        lines = b"".join(response.iter_content(65536)).splitlines()
    finally:
        web.stop()
    assert len(lines) == 20_001  # world's event and the 20 000 here
    assert len({json.loads(line)["code"] for line in lines}) == 20_001

"""Whatever a client sends, the inbound endpoint never answers 5xx, and what it
accepts is stored byte for byte."""

import re
import socket
import time

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deliveries.models import Event
from tests.support.processes import start_web

TOKEN = st.text(
    alphabet="!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    min_size=1,
    max_size=20,
)
HEADER_VALUE = st.text(
    alphabet=st.characters(min_codepoint=0, max_codepoint=255, blacklist_characters="\r\n"),
    max_size=200,
)


@pytest.mark.django_db
@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    method=st.one_of(
        st.sampled_from(
            ["POST", "GET", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE", "CONNECT"]
        ),
        TOKEN,
    ),
    headers=st.dictionaries(TOKEN, HEADER_VALUE, max_size=15),
    body=st.binary(max_size=3000),
    content_type=st.one_of(HEADER_VALUE, st.just("application/json")),
)
def test_any_request_never_5xx_and_accepted_bodies_are_exact(
    entrypoint, method, headers, body, content_type
):
    client = Client(raise_request_exception=False)
    extra = {"HTTP_" + k.upper().replace("-", "_"): v for k, v in headers.items()}
    extra.pop("HTTP_HOST", None)
    before = Event.objects.count()
    response = client.generic(
        method, f"/webhook/{entrypoint.code}", body, content_type=content_type, **extra
    )
    assert response.status_code < 500
    if response.status_code == 200:
        event = Event.objects.get(code=response.json()["event"])
        assert bytes(event.body) == body
        assert Event.objects.count() == before + 1
    else:
        assert Event.objects.count() == before


def raw(base, payload: bytes, chunks=None, pause=0.0) -> bytes:
    """Send `payload` (or `chunks`, `pause` apart) and read one response.

    The socket is not half-closed after sending: a sender that closes its side has
    hung up, and the server rightly stores nothing for it (test_edge.py).
    """
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        for part in chunks or [payload]:
            sock.sendall(part)
            time.sleep(pause)  # a slow sender, not a wait for a result
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            if sep and length and len(body) >= int(length.group(1)):
                break
    return data


def status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response else 0


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_hostile_requests_through_gunicorn_never_5xx(entrypoint, data_dir):
    # A body that never comes in full is answered 408 after this many seconds.
    web, base = start_web(data_dir, workers=1, WEBHOOKER_BODY_TIMEOUT=2)
    path = f"/webhook/{entrypoint.code}".encode()
    try:
        many_headers = b"".join(b"X-H%d: v\r\n" % n for n in range(5000))
        huge_header = b"X-Big: " + b"a" * 100_000 + b"\r\n"
        cases = {
            "thousands of headers": b"POST "
            + path
            + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + many_headers
            + b"Content-Length: 0\r\n\r\n",
            "huge header": b"POST "
            + path
            + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + huge_header
            + b"Content-Length: 0\r\n\r\n",
            "malformed header": b"POST "
            + path
            + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nNo colon here\r\n\r\n",
            "odd method": b"FROB " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
            "bad content-length": b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Length: banana\r\n\r\n",
            "truncated body": b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Length: 1000\r\nConnection: close\r\n\r\nshort",
            "binary body": b"POST "
            + path
            + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/png\r\n"
            b"Content-Length: 4\r\nConnection: close\r\n\r\n\x00\xff\xfe\x01",
            "huge request line": b"POST " + path + b"?" + b"q" * 20000 + b" HTTP/1.1\r\n\r\n",
        }
        for name, payload in cases.items():
            code = status(raw(base, payload))
            assert code < 500, (name, code)
        slow = [
            b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 6\r\n"
            b"Connection: close\r\n\r\n",
            b"sl",
            b"ow",
            b"ly",
        ]
        assert status(raw(base, b"", chunks=slow, pause=0.3)) == 200
        assert "Traceback" not in web.log()
    finally:
        web.stop()
    assert bytes(Event.objects.get(content_type="image/png").body) == b"\x00\xff\xfe\x01"

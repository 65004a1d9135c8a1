"""https targets against real local TLS servers: what a failed handshake records.

Certificates come from trustme (a test CA); the engine trusts that CA only where a
test sets DELIVERY_CA_BUNDLE, as an operator with a private CA would.
"""

import datetime
import errno
import http.server
import re
import socket
import ssl
import threading

import aiohttp
import pytest
import trustme
from aiohttp.client_reqrep import ConnectionKey

from deliveries.models import Delivery, DeliveryResult
from deliveries.targets.errors import summary
from tests.support.engines import attempt_one

pytestmark = pytest.mark.django_db


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


@pytest.fixture
def tls_server():
    """Start an https server with the given certificate; yield its port."""
    servers = []

    def start(configure=None):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        if configure is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            configure(context)
            server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        return server.server_address[1]

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def ca(tmp_path, settings):
    authority = trustme.CA()
    bundle = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(bundle))
    settings.DELIVERY_CA_BUNDLE = str(bundle)
    return authority


def deliver_to(entrypoint, make_target, url):
    make_target(url=url, max_retries=0)
    attempt_one(entrypoint)
    return DeliveryResult.objects.get()


def test_a_certificate_from_a_trusted_ca_is_delivered(entrypoint, make_target, tls_server, ca):
    port = tls_server(ca.issue_cert("127.0.0.1").configure_cert)
    result = deliver_to(entrypoint, make_target, f"https://127.0.0.1:{port}/ok")
    assert result.success and result.status_code == 200


def test_self_signed_certificate(entrypoint, make_target, tls_server, caplog):
    # A CA's own certificate, presented as the server's and trusted by nobody.
    authority = trustme.CA()
    port = tls_server(lambda context: _serve_ca_itself(authority, context))
    with caplog.at_level("ERROR"):
        result = deliver_to(entrypoint, make_target, f"https://127.0.0.1:{port}/")
    first, detail = result.error.split("\n", 1)
    assert first == "TLS: certificate verify failed: self-signed certificate"
    assert "SSLError" in detail or "SSLCertVerificationError" in detail
    assert not [r for r in caplog.records if r.levelname == "ERROR"]  # no traceback logged
    assert Delivery.objects.get().status == "failed"


def test_hostname_mismatch(entrypoint, make_target, tls_server, ca):
    port = tls_server(ca.issue_cert("receiver.example").configure_cert)
    result = deliver_to(entrypoint, make_target, f"https://127.0.0.1:{port}/")
    first = result.error.split("\n", 1)[0]
    assert first.startswith("TLS: certificate verify failed: ")
    assert "127.0.0.1" in first  # the name it was not valid for


def test_expired_certificate(entrypoint, make_target, tls_server, ca):
    now = datetime.datetime.now(datetime.UTC)
    leaf = ca.issue_cert(
        "127.0.0.1",
        not_before=now - datetime.timedelta(days=30),
        not_after=now - datetime.timedelta(days=1),
    )
    port = tls_server(leaf.configure_cert)
    result = deliver_to(entrypoint, make_target, f"https://127.0.0.1:{port}/")
    assert result.error.split("\n", 1)[0] == (
        "TLS: certificate verify failed: certificate has expired"
    )


def test_https_to_a_plain_http_port(entrypoint, make_target, tls_server):
    port = tls_server()  # no TLS
    result = deliver_to(entrypoint, make_target, f"https://127.0.0.1:{port}/")
    assert result.error.split("\n", 1)[0] == (
        "TLS: the receiver does not speak TLS on this port (plain HTTP?)"
    )


def test_connection_refused_is_said_plainly(entrypoint, make_target):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = deliver_to(entrypoint, make_target, f"http://127.0.0.1:{port}/")
    first, detail = result.error.split("\n", 1)
    assert first == "connection refused"
    assert "Cannot connect to host" in detail  # the library's text, kept underneath
    assert "Max retries" not in detail  # an attempt is one try, not a spent retry budget


def test_a_name_that_does_not_resolve(entrypoint, make_target):
    # The tests' resolver answers "no such name" for *.test, with no network.
    result = deliver_to(entrypoint, make_target, "http://nowhere.test/x")
    assert result.error.split("\n", 1)[0] == "DNS name not found"


@pytest.fixture
def listener():
    server = socket.create_server(("127.0.0.1", 0), backlog=0)
    yield server
    server.close()


def test_a_receiver_that_closes_without_answering(entrypoint, make_target, listener):
    def hang_up():
        conn, _ = listener.accept()
        # The whole request first (head and body come in separate sends): closing
        # with some of it unread would answer with a reset instead.
        received = b""
        while b"\r\n\r\n" not in received:
            received += conn.recv(65536)
        head, _, body = received.partition(b"\r\n\r\n")
        length = int(re.search(rb"content-length: *(\d+)", head, re.I).group(1))
        while len(body) < length:
            body += conn.recv(65536)
        conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    result = deliver_to(entrypoint, make_target, f"http://127.0.0.1:{listener.getsockname()[1]}/")
    first, detail = result.error.split("\n", 1)
    assert first == "the receiver closed the connection without answering"
    assert "ServerDisconnectedError" in detail


def test_a_connection_that_fails_at_once_is_not_called_a_timeout():
    # aiohttp's connector errors are OSErrors by class, whatever stopped the
    # connection; only its ConnectionTimeoutError is a connect that took too long.
    key = ConnectionKey("example.com", 80, False, True, None, None, None)
    unreachable = OSError(errno.ENETUNREACH, "Network is unreachable")
    for exc in (aiohttp.ClientConnectorError(key, unreachable), aiohttp.ClientConnectionError()):
        assert summary(exc, 10) == "connection failed"
    assert summary(aiohttp.ConnectionTimeoutError(), 10) == "could not connect within 10 s"


def test_a_receiver_that_never_accepts_is_a_connect_timeout(entrypoint, make_target, full_listener):
    url = f"http://127.0.0.1:{full_listener}/"
    make_target(config={"url": url, "timeout": 0.5}, max_retries=0)
    attempt_one(entrypoint)
    first, detail = DeliveryResult.objects.get().error.split("\n", 1)
    assert first == "could not connect within 0.5 s"
    assert "ConnectionTimeoutError" in detail


def test_a_receiver_that_never_answers_times_out(entrypoint, make_target, listener):
    accepted = []
    threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True).start()
    port = listener.getsockname()[1]
    make_target(config={"url": f"http://127.0.0.1:{port}/", "timeout": 0.5}, max_retries=0)
    attempt_one(entrypoint)
    assert DeliveryResult.objects.get().error.split("\n", 1)[0] == "timed out after 0.5 s"


def _serve_ca_itself(authority, context):
    import tempfile

    with tempfile.NamedTemporaryFile("wb", suffix=".pem", delete=False) as handle:
        handle.write(authority.private_key_pem.bytes() + authority.cert_pem.bytes())
    context.load_cert_chain(handle.name)

"""Local servers for the egress tests: receivers that may require a client
certificate, a forward proxy that records what it forwarded, and the helpers that
deliver to them through the engine's real HTTP client."""

import http.client
import http.server
import select
import socket
import ssl
import threading
import urllib.parse

from deliveries.models import Delivery, DeliveryResult, Target
from tests.support.engines import attempt_one, make_engine, pump, store


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


def serve(handler, configure=None):
    server = Server(("127.0.0.1", 0), handler)
    if configure is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        configure(context)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server


def local_servers():
    """(The `servers` fixture, tests/conftest.py.) Yields start(handler, configure)."""
    started = []

    def start(handler, configure=None):
        server = serve(handler, configure)
        started.append(server)
        return server

    yield start
    for server in started:
        server.shutdown()
        server.server_close()


def answer(handler, status: int, data: bytes, content_type: str = "") -> None:
    handler.send_response(status)
    if content_type:
        handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class Receiver(http.server.BaseHTTPRequestHandler):
    """Answers 200, or 401 to an Authorization in `refused`; records each request."""

    protocol_version = "HTTP/1.1"
    seen: list
    refused: set

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append({"path": self.path, **{k.lower(): v for k, v in self.headers.items()}})
        answer(self, 401 if self.headers.get("Authorization") in self.refused else 200, b"ok")

    def log_message(self, *args):
        pass


def receiver(servers, configure=None):
    handler = type("R", (Receiver,), {"seen": [], "refused": set()})
    server = servers(handler, configure)
    return server.server_address[1], handler


def deliver(entrypoint, webhook, **config):
    Target.objects.create(webhook=webhook, name="t", max_retries=0, config=config)
    attempt_one(entrypoint)
    return DeliveryResult.objects.order_by("-id").first()


def requiring_client_certificates(ca):
    def configure(context):
        ca.issue_cert("127.0.0.1").configure_cert(context)
        ca.configure_trust(context)
        context.verify_mode = ssl.CERT_REQUIRED

    return configure


def client_pems(authority, **dates):
    leaf = authority.issue_cert("client@example.com", **dates)
    return leaf.cert_chain_pems[0].bytes().decode(), leaf.private_key_pem.bytes().decode()


def run(entrypoint, n=1):
    engine = make_engine()
    engine.recover_once(at_start=True)
    store(entrypoint, n=n)
    pump(engine, lambda: not Delivery.objects.filter(status__in=["pending", "retrying"]).exists())


class Proxy(http.server.BaseHTTPRequestHandler):
    """Forwards absolute-form requests and tunnels CONNECT; records each."""

    protocol_version = "HTTP/1.1"
    forwarded: list

    def do_CONNECT(self):
        self.forwarded.append(
            {
                "method": "CONNECT",
                "target": self.path,
                "auth": self.headers.get("Proxy-Authorization"),
            }
        )
        host, port = self.path.rsplit(":", 1)
        upstream = socket.create_connection((host, int(port)))
        self.send_response(200)
        self.end_headers()
        sockets = [self.connection, upstream]
        while True:
            ready, _, _ = select.select(sockets, [], [], 5)
            if not ready:
                break
            for sock in ready:
                data = sock.recv(65536)
                if not data:
                    upstream.close()
                    return
                (upstream if sock is self.connection else self.connection).sendall(data)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.forwarded.append(
            {"method": "POST", "target": self.path, "auth": self.headers.get("Proxy-Authorization")}
        )
        url = urllib.parse.urlsplit(self.path)
        upstream = http.client.HTTPConnection(url.hostname, url.port)
        headers = {
            k: v
            for k, v in self.headers.items()
            if k.lower() not in ("proxy-authorization", "proxy-connection")
        }
        upstream.request("POST", url.path or "/", body, headers)
        upstream_answer = upstream.getresponse()
        answer(self, upstream_answer.status, upstream_answer.read())

    def log_message(self, *args):
        pass


def forward_proxy(servers):
    """(The `proxy` fixture.) A forward proxy: (its port, what it forwarded)."""
    handler = type("P", (Proxy,), {"forwarded": []})
    server = servers(handler)
    return server.server_address[1], handler.forwarded

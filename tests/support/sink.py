"""A real local HTTP server to deliver to, recording every request it gets."""

import http.server
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass


@dataclass
class Received:
    path: str
    headers: dict
    body: bytes
    at: float
    # Every header line as received, repeated names apart, in order.
    lines: list | None = None


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    # A receiver's listen backlog, not socketserver's 5: an engine opens up to
    # DELIVERY_TARGET_CONCURRENCY connections per target at once, and connects
    # beyond the backlog wait for SYN retransmits (1 s, 3 s, 7 s): attempts timed
    # out at a receiver that was only slow to accept.
    request_queue_size = 1024


class Sink:
    """Threaded HTTP server on 127.0.0.1. Script answers per path with `respond`."""

    def __init__(self):
        self.received: list[Received] = []
        self._cond = threading.Condition()
        self._scripts = defaultdict(deque)
        self._default = {}
        self.hang = threading.Event()  # set: paths in `hanging` never answer
        self.hanging: set[str] = set()
        self.delays: dict[str, float] = {}  # path -> seconds to wait before answering
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes; without this, Nagle and the
            # client's delayed ACK add 40 ms to every answer.
            disable_nagle_algorithm = True

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                path = self.path
                if path in sink.hanging:
                    sink.hang.wait(60)
                    self.close_connection = True
                    return
                with sink._cond:
                    sink.received.append(
                        Received(path, dict(self.headers), body, time.time(), self.headers.items())
                    )
                    sink._cond.notify_all()
                    script = sink._scripts[path]
                    status, headers = (
                        script.popleft() if script else sink._default.get(path, (200, {}))
                    )
                if path in sink.delays:
                    time.sleep(sink.delays[path])
                payload = b"ok"
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def url(self, path="/"):
        return f"http://127.0.0.1:{self.port}{path}"

    def respond(self, path, *answers):
        """Queue answers for `path`: each a status or (status, headers)."""
        with self._cond:
            for answer in answers:
                self._scripts[path].append(answer if isinstance(answer, tuple) else (answer, {}))

    def always(self, path, status, headers=None):
        self._default[path] = (status, headers or {})

    def requests(self, path=None):
        with self._cond:
            return [r for r in self.received if path is None or r.path == path]

    def wait_for(self, count, path=None, timeout=30.0):
        """Block until `count` requests (to `path`) arrived; return them."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                got = [r for r in self.received if path is None or r.path == path]
                if len(got) >= count:
                    return got
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"sink got {len(got)} of {count} requests to {path}")
                self._cond.wait(left)

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.hang.set()
        self.server.shutdown()
        self.server.server_close()

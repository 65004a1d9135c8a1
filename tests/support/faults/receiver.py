"""The recording receiver: every request it answers, in a log of its own.

Each target of the fault suite posts to a path of its own. A delivery is told apart
by its `webhook-id` (the same on every attempt of it). Paths under /fail/ answer
500 to the first attempt of every fifth event and 200 after: retries and the
scheduler stay busy through the faults. (Failing every first attempt would keep the
circuit breaker open for good: each probe would be some delivery's first attempt.)
"""

import http.server
import json
import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Receipt:
    path: str
    message_id: str
    seq: int | None
    status: int
    at: float


class Quiet(http.server.ThreadingHTTPServer):
    # The listen backlog: an engine opens a connection per attempt in flight, a
    # burst of them after a take-over. A class attribute, read when the socket
    # listens (set on the instance after that, it was 5: connections waited in the
    # kernel past the attempt's deadline, and the engine's retry was a duplicate).
    request_queue_size = 1024

    def handle_error(self, request, client_address):
        pass  # an engine killed mid-request resets its connection: expected here


class Receiver:
    def __init__(self, delay: float = 0.02):
        self.receipts: list[Receipt] = []
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str], int] = {}
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                message_id = self.headers.get("webhook-id", "")
                try:
                    seq = json.loads(body).get("seq")
                except (ValueError, AttributeError):
                    seq = None
                time.sleep(delay)
                with receiver._lock:
                    key = (self.path, message_id)
                    count = receiver._seen.get(key, 0) + 1
                    receiver._seen[key] = count
                    failing = self.path.startswith("/fail/") and (seq or 0) % 5 == 0
                    status = 500 if failing and count == 1 else 200
                    receiver.receipts.append(
                        Receipt(self.path, message_id, seq, status, time.time())
                    )
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:
                    # The engine went (killed) before the answer: the receipt stands,
                    # as it would at a real receiver.
                    self.close_connection = True

            def log_message(self, *args):
                pass

        self.server = Quiet(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.1,), daemon=True)
        self._thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def snapshot(self) -> list[Receipt]:
        with self._lock:
            return list(self.receipts)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

"""An ASGI application in front of a WSGI one: each request read whole on the event
loop (under a deadline and a body budget), then run on a small pool of threads
(see the package's docstring)."""

from __future__ import annotations

import asyncio
import io
import logging
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from webhooker.request_context import ARRIVED, GONE, HEADER_NAMES, RAW_HEADERS, request_arrived

logger = logging.getLogger("deliveries.edge")

# Seconds a client waiting for an overloaded worker is asked to wait before retrying.
OVERLOADED_RETRY_AFTER = 5
# The first bytes of every body, not counted against the body budget: the events of
# most senders fit (GitHub's pushes run to tens of kilobytes), so a budget filled
# by a few large bodies held open refuses large bodies, not every sender. Counted
# as they arrive, never from a declared length: a length declared and never sent
# would fill the budget for free.
SMALL_BODY = 64 * 1024
# Probe requests (the healthcheck, /metrics) admitted at once in a worker.
PROBE_QUEUE = 8
# A response whose body comes in several pieces (an export, a file) is written to
# the client as it is produced, in writes of at least this many bytes (a file's
# 8 KiB blocks are gathered; an export's chunks of rows mostly go as they come).
STREAM_WRITE = 64 * 1024


class Edge:
    """ASGI application in front of a WSGI one; see the module docstring."""

    def __init__(
        self,
        app,
        *,
        threads: int,
        queue: int,
        body_timeout: float,
        max_body: int,
        body_buffer: int | None = None,
        probes: tuple[str, ...] = (),
    ):
        self.app = app
        self.requests = _Lane(threads, threads + queue, "request")
        # Paths of the health and metrics probes: served on a thread of their own,
        # outside the requests' admission bound, so a worker busy with webhooks
        # still answers whether it is healthy.
        self.probes = frozenset(probes)
        self.probe_lane = _Lane(1, PROBE_QUEUE, "probe")
        # Bytes of request bodies this worker may hold at once, beyond each one's
        # first SMALL_BODY, and how many it holds: only the event loop's thread
        # touches it.
        self.body_buffer = body_buffer
        self.buffered = 0
        self.body_timeout = body_timeout
        self.max_body = max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        held = [0]  # bytes of the body budget this request holds
        try:
            await self._serve(scope, receive, send, held)
        finally:
            self.buffered -= held[0]

    async def _serve(self, scope, receive, send, held):
        try:
            async with asyncio.timeout(self.body_timeout):
                body, complete = await self._read_body(scope, receive, held)
        except TimeoutError:
            await answer(send, 408, "the request was not received in time\n", close=True)
            return
        except SenderGone:
            return
        except OverBudget:
            await answer(
                send,
                503,
                "too many request bodies in memory, retry later\n",
                retry_after=OVERLOADED_RETRY_AFTER,
                close=True,
            )
            return
        lane = self.probe_lane if scope["path"] in self.probes else self.requests
        if lane.inflight >= lane.limit:
            await answer(
                send,
                503,
                "overloaded, retry later\n",
                retry_after=OVERLOADED_RETRY_AFTER,
                close=not complete,
            )
            return
        gone = threading.Event()
        environ = wsgi_environ(scope, body, gone)
        environ[ARRIVED] = time.monotonic()
        lane.inflight += 1
        # Watching for a hang-up means asking for more of the request, which is
        # what makes uvicorn send 100 Continue: not for a body left unread (too
        # large, refused whatever happens, nothing stored).
        watcher = asyncio.create_task(_watch(receive, gone)) if complete else None
        loop = asyncio.get_running_loop()
        stream = _Stream(loop, send, gone, close=not complete, timeout=self.body_timeout)
        try:
            result = await loop.run_in_executor(lane.executor, self._call, environ, stream)
        finally:
            lane.inflight -= 1
            if watcher is not None:
                watcher.cancel()
        if result is None or stream.started or gone.is_set():
            return
        status, headers, content = result
        if not complete:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    async def _read_body(self, scope, receive, held) -> tuple[bytes, bool]:
        """The body, at most max_body + 1 bytes of it, and whether it was read whole.

        A declared length over the limit is not read at all: the view refuses it
        from the header alone. Raises OverBudget when holding what has arrived
        would take the worker past its body budget.
        """
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            return b"", False
        parts, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise SenderGone
            chunk = message.get("body", b"")
            parts.append(chunk)
            size += len(chunk)
            if size - SMALL_BODY > held[0]:
                self._hold(held, size - SMALL_BODY - held[0])
            if not message.get("more_body", False):
                return b"".join(parts), True
            if size > self.max_body:
                return b"".join(parts)[: self.max_body + 1], False

    def _hold(self, held, size: int) -> None:
        """Count `size` more bytes against the body budget for this request, or
        raise OverBudget. A request is let through when nothing else is held, so
        that a body larger than the budget is still served alone."""
        if (
            self.body_buffer is not None
            and self.buffered
            and self.buffered + size > self.body_buffer
        ):
            raise OverBudget
        held[0] += size
        self.buffered += size

    def _call(self, environ, stream):
        """Run the WSGI application on a pool thread; None if the sender left first."""
        if environ[GONE].is_set():
            return None
        # Waits for the SQLite writer are bounded from here, not from this thread.
        arrival = request_arrived.set(environ[ARRIVED])
        try:
            return self._respond(environ, stream)
        finally:
            request_arrived.reset(arrival)

    def _respond(self, environ, stream):
        """(status, headers, body) of a response held whole, for the event loop to
        send. A streaming one (StreamingHttpResponse, FileResponse: an export of
        any length) is written by `stream` from this thread as its pieces are
        produced, never held whole: then the return value is None."""
        started = []

        def start_response(status, headers, exc_info=None):
            started[:] = [status, headers]

        result = self.app(environ, start_response)
        try:
            # Django's responses say whether they stream; any other WSGI
            # application's list is one body, and an iterator is pieces.
            if not getattr(result, "streaming", not isinstance(result, list | tuple)):
                return (*_status_and_headers(started), b"".join(result))
            # Iterated here, on the thread that ran the view: an export reads its
            # rows through this thread's database connection as it goes.
            pieces = iter(result)
            stream.start(*_status_and_headers(started))
            for piece in pieces:
                if not stream.write(piece):
                    return None  # the client hung up: nothing more is produced
            stream.end()
            return None
        finally:
            if hasattr(result, "close"):
                result.close()

    async def _lifespan(self, receive, send):
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                for lane in (self.requests, self.probe_lane):
                    lane.executor.shutdown(wait=True)
                await send({"type": "lifespan.shutdown.complete"})
                return


def _status_and_headers(started) -> tuple[int, list[tuple[bytes, bytes]]]:
    status, headers = started
    return (
        int(status.split(" ", 1)[0]),
        [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
    )


class _Stream:
    """A response written to the client from a pool thread, piece by piece, each
    write waiting until the connection takes it (uvicorn's flow control): an export
    is produced as fast as its client reads it, and a worker holds a write's worth
    of it at a time. A client that takes none of a write for `timeout` seconds is
    cut off, so one that stops reading does not keep the thread."""

    def __init__(self, loop, send, gone: threading.Event, *, close: bool, timeout: float):
        self.loop = loop
        self.send = send
        self.gone = gone
        self.close = close
        self.timeout = timeout
        self.started = False
        self.pending: list[bytes] = []
        self.size = 0

    def start(self, status: int, headers: list) -> None:
        if self.close:
            headers.append((b"connection", b"close"))
        self.started = True
        self._send({"type": "http.response.start", "status": status, "headers": headers})

    def write(self, piece: bytes) -> bool:
        """Queue `piece`, writing once STREAM_WRITE bytes are queued; False once the
        client has gone (nothing more need be produced)."""
        if self.gone.is_set():
            return False
        if piece:
            self.pending.append(piece)
            self.size += len(piece)
        if self.size >= STREAM_WRITE:
            self._flush(more=True)
        return not self.gone.is_set()

    def end(self) -> None:
        if not self.gone.is_set():
            self._flush(more=False)

    def _flush(self, *, more: bool) -> None:
        body = b"".join(self.pending)
        self.pending.clear()
        self.size = 0
        self._send({"type": "http.response.body", "body": body, "more_body": more})

    def _send(self, message) -> None:
        future = asyncio.run_coroutine_threadsafe(self.send(message), self.loop)
        try:
            future.result(self.timeout)
        except TimeoutError:
            future.cancel()
            self.gone.set()
            # Nothing more is produced (write() says so), and the connection is
            # closed with the response unfinished, as the client will see.
            logger.warning("a client took no part of a response for %g s: cut off", self.timeout)


class _Lane:
    """Threads requests run on, and how many may be admitted at once (running or
    waiting for a thread); past it, 503 at once. `inflight` (admitted, not yet
    answered) is touched only on the event loop's thread: no lock."""

    def __init__(self, threads: int, limit: int, name: str):
        self.executor = ThreadPoolExecutor(threads, thread_name_prefix=name)
        self.limit = limit
        self.inflight = 0


class SenderGone(Exception):
    """The client hung up before its request was read: there is no one to answer."""


class OverBudget(Exception):
    """The worker holds as many bytes of request bodies as it may (WEB_BODY_BUFFER)."""


async def _watch(receive, gone: threading.Event):
    """Set `gone` when the client disconnects while its request is being handled."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            gone.set()
            return


async def answer(send, status: int, text: str, *, retry_after=None, close=False):
    headers = [(b"content-type", b"text/plain; charset=utf-8")]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": text.encode()})


def _header(scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1").strip()
    return None


def wsgi_environ(scope, body: bytes, gone: threading.Event) -> dict:
    """PEP 3333's environ for a request read whole, plus every header line as sent.

    CGI variables merge repeated headers and cannot name one with "_" (it would be
    indistinguishable from "-": a spoofing risk, so such headers are left out of
    them, as gunicorn and Django do); environ[RAW_HEADERS] keeps every line, in
    order, for the inbound view to store.
    """
    path = urllib.parse.unquote_to_bytes(scope.get("raw_path") or scope["path"].encode())
    server = scope.get("server") or ("localhost", 80)
    client = scope.get("client")
    environ = {
        "REQUEST_METHOD": scope["method"],
        "SCRIPT_NAME": "",
        "PATH_INFO": path.decode("latin-1"),
        "QUERY_STRING": scope.get("query_string", b"").decode("latin-1"),
        "SERVER_NAME": str(server[0]),
        "SERVER_PORT": str(server[1]),
        "SERVER_PROTOCOL": "HTTP/" + scope.get("http_version", "1.1"),
        "REMOTE_ADDR": client[0] if client else "",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.get("scheme", "http"),
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
        GONE: gone,
    }
    raw = []
    spelled = scope.get(HEADER_NAMES)
    for i, (name, value) in enumerate(scope["headers"]):
        name, value = name.decode("latin-1"), value.decode("latin-1")
        raw.append((spelled[i].decode("latin-1") if spelled else name, value))
        if "_" in name:
            continue
        key = name.upper().replace("-", "_")
        if key == "CONTENT_LENGTH":
            # The body as read: all of it, or the first max_body + 1 bytes of one
            # too large, which the view tells apart by length.
            if len(body) == 0 and value.isdigit():
                environ[key] = value
            continue
        if key != "CONTENT_TYPE":
            key = "HTTP_" + key
        environ[key] = f"{environ[key]},{value}" if key in environ else value
    environ[RAW_HEADERS] = raw
    return environ

"""The web side's front: requests are read by an event loop, handled by a few threads.

gthread workers read each request body on one of their few threads, so twelve
senders trickling bodies held every thread and stopped all ingest. Here gunicorn
runs uvicorn's worker, whose event loop reads every request - headers and whole
body, each under a deadline - and only a complete request reaches Django, on a
small pool of threads, as a buffering proxy in front would arrange. A slow sender
costs a connection and a few kilobytes, never a thread.

Django runs behind it as the WSGI application it always was, not through its
ASGIHandler: that handler gives every request a thread of its own, with a fresh
database connection each time and no bound on how many; the pool here keeps
`threads` threads and their persistent connections (CONN_MAX_AGE).

Admission is bounded: past `threads + queue` requests in this worker, a request is
answered 503 with Retry-After at once, from the event loop, so a flood is shed in
microseconds per request and the backlog a worker can build is `queue` requests
deep, which is why it recovers as soon as the flood stops.

A sender that hangs up is "gone": its request is skipped if it has not started,
and the inbound view checks just before COMMIT (environ["webhooker.gone"]), so an
event is never stored for a sender that saw a timeout and will send it again.
"""

from __future__ import annotations

import asyncio
import io
import logging
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn_worker import UvicornWorker

from webhooker.request_context import ARRIVED, GONE, RAW_HEADERS, request_arrived

logger = logging.getLogger("deliveries.edge")

# Seconds a client waiting for an overloaded worker is asked to wait before retrying.
OVERLOADED_RETRY_AFTER = 5
# The first bytes of every body, not counted against the body budget: the events of
# most senders fit (GitHub's pushes run to tens of kilobytes), so a budget filled
# by a few large bodies held open refuses large bodies, not every sender. Counted
# as they arrive, never from a declared length: a length declared and never sent
# would fill the budget for free.
SMALL_BODY = 64 * 1024
# Key of the ASGI scope with the header names as the client spelled them (uvicorn
# lower-cases scope["headers"]), one per line, in order.
HEADER_NAMES = "webhooker.header_names"


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
    ):
        self.app = app
        # Bytes of request bodies this worker may hold at once, beyond each one's
        # first SMALL_BODY, and how many it holds: only the event loop's thread
        # touches it.
        self.body_buffer = body_buffer
        self.buffered = 0
        self.limit = threads + queue
        self.body_timeout = body_timeout
        self.max_body = max_body
        self.executor = ThreadPoolExecutor(threads, thread_name_prefix="request")
        # Requests admitted and not yet answered; only the event loop's thread
        # touches it, so it needs no lock.
        self.inflight = 0

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
        if self.inflight >= self.limit:
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
        self.inflight += 1
        # Watching for a hang-up means asking for more of the request, which is
        # what makes uvicorn send 100 Continue: not for a body left unread (too
        # large, refused whatever happens, nothing stored).
        watcher = asyncio.create_task(_watch(receive, gone)) if complete else None
        try:
            result = await asyncio.get_running_loop().run_in_executor(
                self.executor, self._call, environ
            )
        finally:
            self.inflight -= 1
            if watcher is not None:
                watcher.cancel()
        if result is None or gone.is_set():
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

    def _call(self, environ):
        """Run the WSGI application on a pool thread; None if the sender left first."""
        if environ[GONE].is_set():
            return None
        # Waits for the SQLite writer are bounded from here, not from this thread.
        arrival = request_arrived.set(environ[ARRIVED])
        try:
            return self._respond(environ)
        finally:
            request_arrived.reset(arrival)

    def _respond(self, environ):
        started = []

        def start_response(status, headers, exc_info=None):
            started[:] = [status, headers]

        result = self.app(environ, start_response)
        try:
            content = b"".join(result)
        finally:
            if hasattr(result, "close"):
                result.close()
        status, headers = started
        return (
            int(status.split(" ", 1)[0]),
            [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
            content,
        )

    async def _lifespan(self, receive, send):
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.executor.shutdown(wait=True)
                await send({"type": "lifespan.shutdown.complete"})
                return


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


class Protocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol with gunicorn's request limits and a header
    deadline, which keeps each header name as the client spelled it and leaves a
    chunked body's trailer fields out of the header lines.

    uvicorn itself bounds neither the size of a request head nor the time a client
    may take to send it: a client could hold a connection open forever with one
    header byte a minute, or grow one header without end.
    """

    HEADER_TIMEOUT = 10.0
    MAX_REQUEST_LINE = 8190
    MAX_FIELDS = 200
    MAX_FIELD_SIZE = 16384
    # All header lines together: generous for signed senders, a bound on what one
    # connection can make a worker hold.
    MAX_HEAD = 64 * 1024

    def connection_made(self, transport):
        super().connection_made(transport)
        self._head_deadline = None
        self._head_done = True
        self._head_bytes = 0
        self._began = False
        self._arm_head_deadline()

    def data_received(self, data):
        self._began = False
        super().data_received(data)
        # The parser keeps a header line it has not seen the end of and calls
        # on_header only at its end, so the limits there come too late for a line
        # that never ends: the head's bytes are counted as they arrive. A chunk in
        # which a message began is not counted (where it began in it is not known),
        # so the bound is the limits plus one read.
        if self._head_done or self._began or self.transport.is_closing():
            return
        self._head_bytes += len(data)
        if self._head_bytes > self.MAX_REQUEST_LINE + self.MAX_HEAD + self.MAX_FIELDS * 4:
            self.send_400_response("request head too large")

    def connection_lost(self, exc):
        self._disarm_head_deadline()
        super().connection_lost(exc)

    def on_message_begin(self):
        super().on_message_begin()
        self._fields = 0
        self._head = 0
        self._names = []
        self._head_done = False
        self._head_bytes = 0
        self._began = True
        self._arm_head_deadline()

    def on_url(self, url):
        super().on_url(url)
        if len(self.url) > self.MAX_REQUEST_LINE:
            raise RequestHeadTooLarge("request line too long")

    def on_header(self, name, value):
        self._fields += 1
        self._head += len(name) + len(value)
        if (
            self._fields > self.MAX_FIELDS
            or len(name) + len(value) > self.MAX_FIELD_SIZE
            or self._head > self.MAX_HEAD
        ):
            raise RequestHeadTooLarge("request headers too large")
        if self._head_done:
            # A trailer field, after a chunked body: not one of the request's
            # header lines (uvicorn would append it to them), so not stored.
            return
        self._names.append(name)
        super().on_header(name, value)

    def on_headers_complete(self):
        self._disarm_head_deadline()
        self._head_done = True
        self.scope[HEADER_NAMES] = self._names
        super().on_headers_complete()

    def _arm_head_deadline(self):
        if self._head_deadline is None:
            self._head_deadline = self.loop.call_later(self.HEADER_TIMEOUT, self._head_late)

    def _disarm_head_deadline(self):
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_late(self):
        self._head_deadline = None
        if not self.transport.is_closing():
            self.transport.close()


class RequestHeadTooLarge(Exception):
    """Raised in a parser callback: uvicorn answers 400 and closes the connection."""


class Worker(UvicornWorker):
    """gunicorn's worker class for webhooker (gunicorn.conf.py)."""

    # proxy_headers off: uvicorn would take X-Forwarded-For and -Proto from any
    # peer in gunicorn's forwarded_allow_ips (127.0.0.1 by default), so a local
    # proxy passing clients' headers through would let them name their address.
    # Which proxies are trusted is WEBHOOKER_TRUSTED_PROXIES' to say
    # (deliveries.middleware.TrustedProxyMiddleware).
    CONFIG_KWARGS = {"loop": "asyncio", "http": Protocol, "lifespan": "on", "proxy_headers": False}

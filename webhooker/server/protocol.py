"""uvicorn's HTTP/1.1 protocol with gunicorn's request limits and a header deadline.

Every use of uvicorn's internals (its parser callbacks, `url`, `scope`,
`send_400_response`) is in this file; tests/unit/test_contracts.py fails loudly when
an upgrade renames or reshapes one of them.
"""

from django.conf import settings
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from webhooker.request_context import HEADER_NAMES


class Protocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol with gunicorn's request limits and a header
    deadline, which keeps each header name as the client spelled it and leaves a
    chunked body's trailer fields out of the header lines.

    uvicorn itself bounds neither the size of a request head nor the time a client
    may take to send it: a client could hold a connection open forever with one
    header byte a minute, or grow one header without end.
    """

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
            self._head_deadline = self.loop.call_later(
                settings.WEBHOOKER_HEADER_TIMEOUT, self._head_late
            )

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

"""Django's PostgreSQL backend, with the per-request health check made free and
prepared statements for the inbound endpoint.

With CONN_HEALTH_CHECKS, Django sends "SELECT 1" on a reused connection at the
start of every request, so that one the server has closed (a restart,
pg_terminate_backend, an idle timeout) is replaced rather than failing the
request. On the inbound endpoint that is a third of its round trips
(bench/RESULTS.md). A connection the server has closed always has something to
read - its termination message, then end of file - while a healthy idle one has
nothing (the web side listens for no notifications). So the socket is polled
first, without waiting, and Django's check runs only when there is input.

A server that vanished without closing the connection is found by neither: the
"SELECT 1" would wait for TCP to give up, as the request's own query does. Nor is a
backend told to stop that has not closed its socket yet: a request in that instant
loses the connection mid-statement, stores nothing and is answered 503 with
Retry-After (the statement is not sent again: whether a lost one committed is
unknown, and a second copy would be a duplicate).

Django binds parameters on the client (the body quoted into the SQL text) and
prepares nothing, so every statement is parsed and planned again. The inbound
endpoint and the engine's result writer each run one statement thousands of times
per connection: `prepared_cursor()` binds on the server and prepares each
statement on its first run, still through Django's cursor wrapper (execute
wrappers, error translation, query logging). Django opens psycopg connections
with preparing switched off altogether (`prepare_threshold=None`, under which
psycopg ignores `prepare=True`, so these statements were parsed and planned on
every run). A PreparedCursor lifts that for its own statements only, for the
length of each execute: the connection otherwise keeps the threshold off, so
psycopg does not track the text of every client-bound query Django runs (its
cache key holds the values). An explicit OPTIONS["prepare_threshold"] is obeyed:
None there (a pooler that cannot keep prepared statements) means nothing is
prepared, a number means psycopg's own behaviour.

A PreparedCursor's rows come back in PostgreSQL's binary format, read by psycopg's
C loaders: the statements run through it are read by webhooker's own code, never by
a model. Django registers a text loader of its own for timestamptz, a subclass of
psycopg's pure-Python one, which parses each value with a regular expression; in
binary, timestamps, ids, UUIDs and JSON skip text parsing altogether. A binary
timestamp is aware in the session's time zone, which Django sets to its own.
"""

import select

import psycopg
from django.db.backends.postgresql import base


class PreparedCursor(psycopg.Cursor):
    """Server-side binding; every statement prepared (kept per connection) unless
    the settings turned preparing off (`allowed`)."""

    allowed = True

    def execute(self, query, params=None, *, prepare=True, binary=None):
        conn = self._conn
        if not self.allowed or conn.prepare_threshold is not None:
            prepare = prepare and self.allowed
            return super().execute(query, params, prepare=prepare, binary=binary)
        conn.prepare_threshold = ONLY_WHEN_ASKED
        try:
            return super().execute(query, params, prepare=prepare, binary=binary)
        finally:
            conn.prepare_threshold = None

    def _send_query_prepared(self, name, pgq, *, binary=None):
        # psycopg records the query it sent for Django's query log
        # (last_executed_query reads `_query`) only when it was not prepared.
        self._query = pgq
        return super()._send_query_prepared(name, pgq, binary=binary)


# While a PreparedCursor executes: statements are prepared when asked to, never
# by repetition.
ONLY_WHEN_ASKED = 2**31 - 1


class DatabaseWrapper(base.DatabaseWrapper):
    def prepared_cursor(self):
        """A cursor for statements run over and over: see the module docstring."""
        self.close_if_health_check_failed()
        self.ensure_connection()
        with self.wrap_database_errors:
            cursor = PreparedCursor(self.connection)
            cursor.format = psycopg.pq.Format.BINARY
            options = self.settings_dict["OPTIONS"]
            cursor.allowed = options.get("prepare_threshold", 0) is not None
            return self._prepare_cursor(cursor)

    def close_if_health_check_failed(self):
        if (
            self.connection is not None
            and self.health_check_enabled
            and not self.health_check_done
            and not self.pool
            and not _has_input(self.connection)
        ):
            self.health_check_done = True
            return
        super().close_if_health_check_failed()


def _has_input(conn) -> bool:
    try:
        fd = conn.pgconn.socket
    except psycopg.Error:  # closed, or never opened: let Django's check decide
        return True
    # poll, not select: a worker holding a thousand sender connections gives the
    # database socket a descriptor past select's limit of 1023.
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))

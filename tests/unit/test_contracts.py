"""The private names of other libraries webhooker overrides or reads, each in one
place: Django's and psycopg's in webhooker/db/, uvicorn's in
webhooker/server/protocol.py, asyncio's in deliveries/targets/transport.py. Their pins
in pyproject.toml hold them; these tests say at once, by name, which one an upgrade
renamed or reshaped, instead of a behaviour failing somewhere far from it."""

import inspect

import pytest
from django.db import connection
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.sqlite3.base import DatabaseWrapper as SQLiteWrapper
from django.db.backends.sqlite3.base import SQLiteCursorWrapper
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# (owner, name, the parameters it must take): every method overridden or called.
METHODS = [
    # Django: webhooker/db/sqlite/base.py queues writers around these.
    (SQLiteWrapper, "_start_transaction_under_autocommit", ["self"]),
    (BaseDatabaseWrapper, "_commit", ["self"]),
    (BaseDatabaseWrapper, "_rollback", ["self"]),
    (BaseDatabaseWrapper, "_close", ["self"]),
    # Django: webhooker/db/sqlite/base.py's cursor converts placeholders once.
    (SQLiteWrapper, "create_cursor", ["self", "name"]),
    (SQLiteCursorWrapper, "convert_query", ["self", "query", "param_names"]),
    # Django: webhooker/db/postgresql/base.py.
    (BaseDatabaseWrapper, "_prepare_cursor", ["self", "cursor"]),
    (BaseDatabaseWrapper, "close_if_health_check_failed", ["self"]),
    # uvicorn: webhooker/server/protocol.py.
    (HttpToolsProtocol, "connection_made", ["self", "transport"]),
    (HttpToolsProtocol, "data_received", ["self", "data"]),
    (HttpToolsProtocol, "connection_lost", ["self", "exc"]),
    (HttpToolsProtocol, "on_message_begin", ["self"]),
    (HttpToolsProtocol, "on_url", ["self", "url"]),
    (HttpToolsProtocol, "on_header", ["self", "name", "value"]),
    (HttpToolsProtocol, "on_headers_complete", ["self"]),
    (HttpToolsProtocol, "send_400_response", ["self", "msg"]),
]


@pytest.mark.parametrize(
    ("owner", "name", "parameters"), METHODS, ids=[f"{o.__name__}.{n}" for o, n, _ in METHODS]
)
def test_every_private_method_used_is_there_with_its_parameters(owner, name, parameters):
    method = getattr(owner, name, None)
    assert callable(method), f"{owner.__module__}.{owner.__name__}.{name} is gone"
    found = list(inspect.signature(method).parameters)
    assert found[: len(parameters)] == parameters, f"{owner.__name__}.{name}{found}"


def test_django_health_check_state_is_where_the_backend_reads_it(db):
    """webhooker/db/postgresql skips Django's SELECT 1 by setting these."""
    if connection.vendor != "postgresql":
        pytest.skip("the health check's shortcut is PostgreSQL's backend")
    connection.ensure_connection()
    for name in ("health_check_enabled", "health_check_done", "pool"):
        assert hasattr(type(connection), name) or hasattr(connection, name), name


def test_psycopg_cursor_internals_the_prepared_cursor_uses(db):
    """webhooker/db/postgresql/base.py: PreparedCursor reads `_conn` and records
    `_query` around `_send_query_prepared`."""
    if connection.vendor != "postgresql":
        pytest.skip("psycopg is PostgreSQL's")
    import psycopg

    parameters = list(inspect.signature(psycopg.Cursor._send_query_prepared).parameters)
    assert parameters[:3] == ["self", "name", "pgq"]
    connection.ensure_connection()
    cursor = psycopg.Cursor(connection.connection)
    try:
        assert cursor._conn is connection.connection
        assert hasattr(cursor, "_query")
    finally:
        cursor.close()


def test_uvicorn_protocol_sets_what_the_protocol_reads():
    """Protocol reads `url`, `scope`, `loop` and `transport` off uvicorn's protocol."""
    source = inspect.getsource(HttpToolsProtocol)
    for name in ("self.url", "self.scope", "self.loop", "self.transport"):
        assert name in source, name


def test_asyncio_selector_loops_keep_their_selector_where_a_forked_child_replaces_it():
    """transport._disowned gives a loop inherited across fork a selector of its own:
    asyncio's selector loop must keep it in `_selector` and register and unregister
    its readers and writers there."""
    import asyncio
    import selectors

    loop = asyncio.new_event_loop()
    try:
        assert isinstance(loop._selector, selectors.BaseSelector)
        for method in ("_add_reader", "_remove_reader", "_remove_writer"):
            assert "self._selector" in inspect.getsource(getattr(type(loop), method)), method
    finally:
        loop.close()

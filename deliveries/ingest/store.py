"""Storing an inbound event: the one service function the inbound view calls.

The hottest path in webhooker: every event a sender posts goes through it while
the sender waits. It speaks SQL directly (statements.py), where the ORM would spend
more time building queries than the database spends running them, and it counts
round trips (bench/RESULTS.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import ipaddress
import uuid
from collections.abc import Callable

from django.db import connection, transaction
from django.utils import timezone

from deliveries import bodies, tracing, verification, wake
from deliveries.ingest import statements as queries
from deliveries.ingest.entrypoints import Inbound
from deliveries.models import Delivery, Event
from webhooker import request_context
from webhooker.db.sqlite.group_commit import group_commit


class SenderGone(Exception):
    """The sender hung up before its event was committed: nothing was stored, since
    it will send it again and a stored copy would be a duplicate no one acknowledged."""


class EntrypointChanged(Exception):
    """The entrypoint is no longer as it was read (switched off, deleted, configured
    anew): nothing was stored; read it again with find_entrypoint(fresh=True)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Stored:
    event_id: int
    code: uuid.UUID
    deliveries: int
    # A repeat of a kept event's provider id: nothing was stored, and event_id and
    # code are the first event's.
    duplicate: bool = False


def store_event(
    entrypoint: Inbound,
    *,
    method: str,
    headers: list[list[str]],
    body: bytes,
    content_type: str,
    remote_addr: str | None,
    provider_id: str = "",
    dedup: bool = False,
    query_string: str = "",
    gone: Callable[[], bool] | None = None,
) -> Stored:
    """Store the event and one pending delivery per active target, atomically.

    Returns only after COMMIT, so the caller's 200 promises both are durable
    (invariant 1 in docs/architecture.md). The engine is woken after the commit; a
    lost wake-up costs latency, never a delivery, because the rows themselves are the
    message.

    With `dedup` and a `provider_id`, an event of the webhook kept with the same
    provider id makes this a duplicate: nothing is stored, the first event counts
    one more receipt, and its id and code are returned with duplicate=True.

    `gone` is asked, as late as the database allows, whether the sender has hung up:
    just before COMMIT on SQLite, just before the one statement on PostgreSQL. If
    so, nothing is stored and SenderGone raised.

    Raises EntrypointChanged, storing nothing, when the entrypoint is no longer as
    `entrypoint` was read.
    """
    code = uuid.uuid4()
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    deduplicated = bool(dedup and provider_id)
    # Whatever the entrypoint, the sender's own id is kept for search (never for
    # deduplication, which reads only the entrypoint's source).
    says = verification.sender_says(headers, body)
    provider_id = provider_id or says.event_id
    # A large body on SQLite: written and synced first, outside the writer's
    # transaction, which stores only its name (bodies.py).
    body_file = bodies.write_or_unavailable(body) if bodies.spills(len(body)) else None
    values = [
        Event._meta.get_field("code").get_db_prep_value(code, connection),
        entrypoint.webhook_id,
        method,
        query_string,
        Event._meta.get_field("headers").get_db_prep_value(headers, connection),
        b"" if body_file else body,
        body_file,
        len(body),
        content_type,
        ip_or_none(remote_addr),
        now,
        provider_id,
        deduplicated,
        0,
        says.event_type,
        request_context.request_id.get() or "",
        tracing.current_traceparent.get(),
        entrypoint.id,
        *entrypoint.as_read,
    ]
    statements = queries.for_vendor(connection.vendor)
    insert = _Insert(statements, entrypoint, provider_id, deduplicated)
    delivery_values = [Delivery.Status.PENDING.value, now, now, entrypoint.webhook_id]
    if connection.vendor == "postgresql":
        return _store_postgresql(insert, code, values + delivery_values, gone)
    stored = _store_sqlite(insert, code, values, delivery_values, gone)
    if stored.duplicate and body_file:
        bodies.discard(body_file)  # the kept event has its own; nothing names this one
    # Any other way out leaves the file to retention.sweep_body_files: a failed
    # COMMIT may still have stored the row that names it.
    return stored


@dataclasses.dataclass(slots=True)
class _Insert:
    """The event's INSERT, run until it stores a row (returned), or the event turns
    out a kept one's duplicate (that Stored)."""

    statements: dict[str, str]
    entrypoint: Inbound
    provider_id: str
    deduplicated: bool

    def __call__(self, cursor, params) -> tuple | Stored:
        sql = self.statements["event_dedup" if self.deduplicated else "event"]
        while True:
            cursor.execute(sql, params)
            row = cursor.fetchone()
            if row is not None:
                return row
            first = _not_stored(
                cursor, self.statements, self.entrypoint, self.provider_id, self.deduplicated
            )
            if first is not None:
                return first


def _store_postgresql(insert: _Insert, code, params, gone) -> Stored:
    """One statement: the event, its deliveries and the engine's wake-up."""
    if gone is not None and gone():
        raise SenderGone
    # Atomic on its own in autocommit, as the web side runs it; inside a caller's
    # transaction, a savepoint keeps a failure from aborting that.
    nested = transaction.atomic() if connection.in_atomic_block else contextlib.nullcontext()
    with nested, connection.prepared_cursor() as cursor:
        row = insert(cursor, params)
    if isinstance(row, Stored):
        return row
    return Stored(event_id=row[0], code=code, deliveries=row[1])


def _store_sqlite(insert: _Insert, code, values, delivery_values, gone) -> Stored:
    """Two statements in a transaction shared with the process's concurrent events
    (webhooker.db.sqlite.group_commit), or in the caller's own."""

    def store() -> Stored:
        with connection.cursor() as cursor:
            row = insert(cursor, values)
            if isinstance(row, Stored):
                return row
            event_id = row[0]
            cursor.execute(insert.statements["deliveries"], [event_id, *delivery_values])
            deliveries = cursor.rowcount
            if gone is not None and gone():
                raise SenderGone
            if deliveries:
                wake.notify_on_commit(connection)
        return Stored(event_id=event_id, code=code, deliveries=deliveries)

    if connection.in_atomic_block:
        # Part of the caller's transaction, on its connection.
        with transaction.atomic():
            return store()
    return group_commit.run(store)


def _not_stored(
    cursor, statements, entrypoint: Inbound, provider_id: str, deduplicated: bool
) -> Stored | None:
    """The event's INSERT stored nothing: the entrypoint changed (raises
    EntrypointChanged), or its provider id is a kept event's (that event, counted
    once more). None: store again - the kept event was deleted (retention) after the
    insert met it, so its provider id is free again, or the entrypoint changed and
    changed back."""
    cursor.execute(statements["unchanged"], [entrypoint.id, *entrypoint.as_read])
    if cursor.fetchone() is None:
        raise EntrypointChanged
    if not deduplicated:
        return None
    return _count_duplicate(cursor, statements, entrypoint.webhook_id, provider_id)


def _count_duplicate(cursor, statements, webhook_id: int, provider_id: str) -> Stored | None:
    """Count one more receipt of the kept event with this provider id; None if
    there is none any more."""
    cursor.execute(statements["count_duplicate"], [webhook_id, provider_id])
    row = cursor.fetchone()
    if row is None:
        return None
    code = row[1] if isinstance(row[1], uuid.UUID) else uuid.UUID(row[1])
    return Stored(event_id=row[0], code=code, deliveries=0, duplicate=True)


@functools.lru_cache(maxsize=4096)
def ip_or_none(value: str | None) -> str | None:
    """The address in its canonical form, or None. Cached: a service hears from
    the same few senders again and again."""
    if not value:
        return None
    try:
        return str(ipaddress.ip_address(value.split("%", 1)[0]))
    except ValueError:
        return None

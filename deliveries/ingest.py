"""Storing an inbound webhook: the one service function the inbound view calls.

This is the hottest path in webhooker: every event a sender posts goes through it
while the sender waits. It therefore speaks SQL directly, three statements in one
transaction, where the ORM would spend more time building queries than the
database spends running them (measured: bench/RESULTS.md). The statements write
exactly the columns the models define, values prepared by the models' own fields.
"""

from __future__ import annotations

import ipaddress
import uuid
from dataclasses import dataclass

from django.db import connection, transaction
from django.utils import timezone

from deliveries import wake
from deliveries.models import Delivery, Entrypoint, Event, Target


@dataclass(frozen=True, slots=True)
class Stored:
    event_id: int
    code: uuid.UUID
    deliveries: int


@dataclass(frozen=True, slots=True)
class Inbound:
    """What the view needs of an entrypoint: found by its code in one query."""

    id: int
    webhook_id: int
    webhook_code: uuid.UUID
    active: bool


def _tables():
    q = connection.ops.quote_name
    return {
        "event": q(Event._meta.db_table),
        "delivery": q(Delivery._meta.db_table),
        "target": q(Target._meta.db_table),
        "entrypoint": q(Entrypoint._meta.db_table),
        "webhook": q(Entrypoint._meta.get_field("webhook").related_model._meta.db_table),
    }


def find_entrypoint(code: uuid.UUID) -> Inbound | None:
    t = _tables()
    sql = (
        f"SELECT e.id, e.webhook_id, w.code, e.active FROM {t['entrypoint']} e "
        f"JOIN {t['webhook']} w ON w.id = e.webhook_id WHERE e.code = %s"
    )
    prep = Entrypoint._meta.get_field("code").get_db_prep_value(code, connection)
    with connection.cursor() as cursor:
        cursor.execute(sql, [prep])
        row = cursor.fetchone()
    if row is None:
        return None
    webhook_code = row[2] if isinstance(row[2], uuid.UUID) else uuid.UUID(row[2])
    return Inbound(id=row[0], webhook_id=row[1], webhook_code=webhook_code, active=bool(row[3]))


def store_event(
    entrypoint: Inbound,
    *,
    method: str,
    headers: list[list[str]],
    body: bytes,
    content_type: str,
    remote_addr: str | None,
) -> Stored:
    """Store the event and one pending delivery per active target, atomically.

    Returns only after COMMIT, so the caller's 200 promises both are durable
    (invariant 1 in docs/architecture.md). The engine is woken after the commit; a lost wake-up
    costs latency, never a delivery, because the rows themselves are the message.
    """
    t = _tables()
    ops = connection.ops
    now = ops.adapt_datetimefield_value(timezone.now())
    code = uuid.uuid4()
    event_values = [
        Event._meta.get_field("code").get_db_prep_value(code, connection),
        entrypoint.webhook_id,
        entrypoint.id,
        method,
        Event._meta.get_field("headers").get_db_prep_value(headers, connection),
        body,
        len(body),
        content_type,
        _ip_or_none(remote_addr),
        now,
    ]
    insert_event = (
        f"INSERT INTO {t['event']} (code, webhook_id, entrypoint_id, method, headers, body, "
        "body_size, content_type, remote_addr, received_at) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id"
    )
    # One statement reads the active targets and writes their deliveries inside
    # the transaction: a target switched off a moment ago gets no delivery, one
    # switched on gets one, never half of each.
    insert_deliveries = (
        f"INSERT INTO {t['delivery']} (event_id, target_id, status, attempts, "
        "next_attempt_at, created_at, updated_at) "
        f"SELECT %s, id, %s, 0, NULL, %s, %s FROM {t['target']} "
        "WHERE webhook_id = %s AND active"
    )
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(insert_event, event_values)
        event_id = cursor.fetchone()[0]
        cursor.execute(
            insert_deliveries,
            [event_id, Delivery.Status.PENDING, now, now, entrypoint.webhook_id],
        )
        deliveries = cursor.rowcount
        if deliveries:
            wake.notify_on_commit(connection)
    return Stored(event_id=event_id, code=code, deliveries=deliveries)


def _ip_or_none(value: str | None) -> str | None:
    if not value:
        return None
    try:
        return str(ipaddress.ip_address(value.split("%", 1)[0]))
    except ValueError:
        return None

"""Storing an inbound webhook: the one service function the inbound view calls.

This is the hottest path in webhooker: every event a sender posts goes through it
while the sender waits. It therefore speaks SQL directly, three statements in one
transaction, where the ORM would spend more time building queries than the
database spends running them (measured: bench/RESULTS.md). The statements write
exactly the columns the models define, values prepared by the models' own fields.
"""

from __future__ import annotations

import ipaddress
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import connection, transaction
from django.utils import timezone

from deliveries import verification, wake
from deliveries.models import Delivery, Entrypoint, Event, Target


class SenderGone(Exception):
    """The sender hung up before COMMIT: the event was rolled back, since it will
    send it again and a stored copy would be a duplicate no one acknowledged."""


@dataclass(frozen=True, slots=True)
class Stored:
    event_id: int
    code: uuid.UUID
    deliveries: int
    # A repeat of a kept event's provider id: nothing was stored, and event_id and
    # code are the first event's.
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class Inbound:
    """What the view needs of an entrypoint: found by its code in one query."""

    id: int
    webhook_id: int
    webhook_code: uuid.UUID
    active: bool
    code: uuid.UUID | None = None
    verification: str = "none"
    verification_config: dict = field(default_factory=dict, repr=False)
    dedup: bool = False
    # Where provider event ids are read from ("" when nowhere).
    id_source: str = ""


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
        f"SELECT e.id, e.webhook_id, w.code, e.active, e.verification, e.verification_config, "
        f"e.dedup, e.dedup_source FROM {t['entrypoint']} e "
        f"JOIN {t['webhook']} w ON w.id = e.webhook_id WHERE e.code = %s"
    )
    prep = Entrypoint._meta.get_field("code").get_db_prep_value(code, connection)
    with connection.cursor() as cursor:
        cursor.execute(sql, [prep])
        row = cursor.fetchone()
    if row is None:
        return None
    webhook_code = row[2] if isinstance(row[2], uuid.UUID) else uuid.UUID(row[2])
    preset, config, dedup, dedup_source = row[4:8]
    if preset == "none":
        config = {}
    elif isinstance(config, str | bytes):
        config = json.loads(config)
    return Inbound(
        id=row[0],
        webhook_id=row[1],
        webhook_code=webhook_code,
        active=bool(row[3]),
        code=code,
        verification=preset,
        verification_config=config,
        dedup=bool(dedup),
        id_source=verification.id_source(preset, dedup_source),
    )


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
    (invariant 1 in docs/architecture.md). The engine is woken after the commit; a lost wake-up
    costs latency, never a delivery, because the rows themselves are the message.

    With `dedup` and a `provider_id`, an event of the webhook kept with the same
    provider id makes this a duplicate: nothing is stored, the first event counts
    one more receipt, and its id and code are returned with duplicate=True.

    `gone` is asked just before COMMIT whether the sender has hung up; if so,
    everything is rolled back and SenderGone raised.
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
        query_string,
        Event._meta.get_field("headers").get_db_prep_value(headers, connection),
        body,
        len(body),
        content_type,
        ip_or_none(remote_addr),
        now,
        provider_id,
        deduplicated := bool(dedup and provider_id),
        0,
        event_type(headers, body, content_type),
    ]
    # The unique index event_provider_id_uniq decides between concurrent posts of
    # one provider id: the loser's insert does nothing (after waiting for the
    # winner's transaction on PostgreSQL) and it answers with the winner's event.
    insert_event = (
        f"INSERT INTO {t['event']} (code, webhook_id, entrypoint_id, method, query_string, "
        "headers, body, body_size, content_type, remote_addr, received_at, provider_id, "
        "deduplicated, duplicates, event_type) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
        f"{'ON CONFLICT DO NOTHING ' if deduplicated else ''}RETURNING id"
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
        while True:
            cursor.execute(insert_event, event_values)
            row = cursor.fetchone()
            if row is not None:
                break
            first = _count_duplicate(cursor, t, entrypoint.webhook_id, provider_id)
            if first is not None:
                return first
            # The first event was deleted (retention) after our insert met it: its
            # provider id is free again, so this one is stored after all.
        event_id = row[0]
        cursor.execute(
            insert_deliveries,
            [event_id, Delivery.Status.PENDING, now, now, entrypoint.webhook_id],
        )
        deliveries = cursor.rowcount
        if gone is not None and gone():
            raise SenderGone
        if deliveries:
            wake.notify_on_commit(connection)
    return Stored(event_id=event_id, code=code, deliveries=deliveries)


def _count_duplicate(cursor, t, webhook_id: int, provider_id: str) -> Stored | None:
    """Count one more receipt of the kept event with this provider id; None if
    there is none any more."""
    cursor.execute(
        f"UPDATE {t['event']} SET duplicates = duplicates + 1 "
        "WHERE webhook_id = %s AND provider_id = %s AND deduplicated RETURNING id, code",
        [webhook_id, provider_id],
    )
    row = cursor.fetchone()
    if row is None:
        return None
    code = row[1] if isinstance(row[1], uuid.UUID) else uuid.UUID(row[1])
    return Stored(event_id=row[0], code=code, deliveries=0, duplicate=True)


# Headers that name the kind of event, as senders send them (GitHub, GitLab,
# Bitbucket, Shopify, Gitea, Twilio-style); else a JSON body's "type" (Stripe,
# Standard Webhooks) or "event".
EVENT_TYPE_HEADERS = (
    "x-github-event",
    "x-gitlab-event",
    "x-event-key",
    "x-shopify-topic",
    "x-gitea-event",
    "x-event-type",
)
# Bodies parsed for their "type" only up to this size: the list column is a
# convenience, never worth parsing megabytes in the inbound request.
EVENT_TYPE_BODY_LIMIT = 64 * 1024


def event_type(headers: list[list[str]], body: bytes, content_type: str) -> str:
    """What the sender says the event is, or ""."""
    for name, value in headers:
        if name.lower() in EVENT_TYPE_HEADERS and value.strip():
            return value.strip()[:200]
    if len(body) > EVENT_TYPE_BODY_LIMIT or body.lstrip()[:1] != b"{":
        return ""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return ""
    for key in ("type", "event", "event_type"):
        value = document.get(key) if isinstance(document, dict) else None
        if isinstance(value, str) and value.strip():
            return value.strip()[:200]
    return ""


def ip_or_none(value: str | None) -> str | None:
    if not value:
        return None
    try:
        return str(ipaddress.ip_address(value.split("%", 1)[0]))
    except ValueError:
        return None

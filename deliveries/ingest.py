"""Storing an inbound webhook: the one service function the inbound view calls."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from django.db import connection, transaction
from django.utils import timezone

from deliveries import wake
from deliveries.models import Delivery, Entrypoint, Event, Target


@dataclass(frozen=True, slots=True)
class Stored:
    event: Event
    deliveries: int


def store_event(
    entrypoint: Entrypoint,
    *,
    method: str,
    headers: list[list[str]],
    body: bytes,
    content_type: str,
    remote_addr: str | None,
) -> Stored:
    """Store the event and one pending delivery per active target, atomically.

    Returns only after COMMIT, so the caller's 200 promises both are durable
    (DESIGN §2 invariant 1). The engine is woken after the commit; a lost wake-up
    costs latency, never a delivery, because the rows themselves are the message.
    """
    now = timezone.now()
    with transaction.atomic():
        event = Event.objects.create(
            webhook_id=entrypoint.webhook_id,
            entrypoint=entrypoint,
            method=method,
            headers=headers,
            body=body,
            body_size=len(body),
            content_type=content_type,
            remote_addr=_ip_or_none(remote_addr),
            received_at=now,
        )
        # Read inside the transaction: a target switched off a moment ago gets no
        # delivery, one switched on gets one, never half of each.
        target_ids = Target.objects.filter(
            webhook_id=entrypoint.webhook_id, active=True
        ).values_list("id", flat=True)
        deliveries = Delivery.objects.bulk_create(
            Delivery(event=event, target_id=tid, created_at=now, updated_at=now)
            for tid in target_ids
        )
        if deliveries:
            wake.notify_on_commit(connection)
    return Stored(event=event, deliveries=len(deliveries))


def _ip_or_none(value: str | None) -> str | None:
    if not value:
        return None
    try:
        return str(ipaddress.ip_address(value.split("%", 1)[0]))
    except ValueError:
        return None

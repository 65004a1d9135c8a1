"""A past outage, written in bulk: events and their deliveries as it left them."""

import datetime

from django.db import connection
from django.utils import timezone

from deliveries.models import Delivery, Event

OUTAGE_START = timezone.now().replace(microsecond=0) - datetime.timedelta(days=1)
OUTAGE_END = OUTAGE_START + datetime.timedelta(hours=6)
HOUR = datetime.timedelta(hours=1)


def history(webhook, targets, n, *, start, span, status):
    """`n` events spread over `span` from `start`, each with a delivery in `status`
    to each of `targets`, written in bulk (as a past outage left them)."""
    step = span / max(n, 1)
    events = Event.objects.bulk_create(
        Event(webhook=webhook, method="POST", body=b'{"n": %d}' % i, received_at=start + i * step)
        for i in range(n)
    )
    Delivery.objects.bulk_create(
        Delivery(event=e, target=t, status=status, attempts=1) for e in events for t in targets
    )
    if connection.vendor == "postgresql":
        # A past outage's rows have been analyzed (autovacuum) by the time anyone
        # replays them. Without it the planner takes these fresh tables for empty
        # and joins them by nested loops, seconds per query.
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE deliveries_event, deliveries_delivery")
    return events


def outage(webhook, targets, n=10_000, *, outside=500):
    """`n` failed deliveries in the six-hour outage, delivered ones around it, and
    failed ones just outside: those must never be sent."""
    history(webhook, targets, outside, start=OUTAGE_START - HOUR, span=HOUR, status="delivered")
    history(webhook, targets, outside, start=OUTAGE_END, span=HOUR, status="failed")
    return history(webhook, targets, n, start=OUTAGE_START, span=6 * HOUR, status="failed")

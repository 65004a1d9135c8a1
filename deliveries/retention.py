"""Retention: events older than their webhook's retention_days go, with their
deliveries and attempt results, in small batches."""

import datetime
from collections import Counter

from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from deliveries.models import Delivery, DeliveryResult, Event, Webhook

# Events per transaction: each batch is a short write lock, so on SQLite the
# inbound view and the engine get their turn between batches.
BATCH = 500


def prune_events(*, now=None, batch=BATCH) -> Counter:
    """Delete what retention allows; return counts of events, deliveries, results.

    An event with a pending or retrying delivery is never deleted: it is still on
    its way, however old.
    """
    now = now or timezone.now()
    removed = Counter()
    for webhook_id, days in Webhook.objects.values_list("id", "retention_days"):
        try:
            cutoff = now - datetime.timedelta(days=days)
        except OverflowError:  # longer than the calendar: nothing is old enough
            continue
        expired = (
            Event.objects.filter(webhook_id=webhook_id, received_at__lt=cutoff)
            .exclude(
                Exists(
                    Delivery.objects.filter(event=OuterRef("pk"), status__in=Delivery.UNFINISHED)
                )
            )
            .order_by("received_at")
        )
        while True:
            with transaction.atomic():
                ids = list(expired.values_list("id", flat=True)[:batch])
                if not ids:
                    break
                # Lock the events and their deliveries, then look again: a redeliver
                # or replay that committed since the SELECT above keeps its event
                # (on PostgreSQL; SQLite's single writer already rules it out).
                list(Event.objects.select_for_update().filter(id__in=ids).values_list("id"))
                list(
                    Delivery.objects.select_for_update().filter(event_id__in=ids).values_list("id")
                )
                busy = set(
                    Delivery.objects.filter(
                        event_id__in=ids, status__in=Delivery.UNFINISHED
                    ).values_list("event_id", flat=True)
                )
                ids = [i for i in ids if i not in busy]
                if not ids:
                    continue
                removed["results"] += DeliveryResult.objects.filter(
                    delivery__event_id__in=ids
                ).delete()[0]
                removed["deliveries"] += Delivery.objects.filter(event_id__in=ids).delete()[0]
                removed["events"] += Event.objects.filter(id__in=ids).delete()[0]
    return removed

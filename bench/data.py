"""Rows the benchmarks start from, written in bulk rather than through ingest, and
how a benchmark waits for them to be delivered."""

import json

from tests.support.processes import wait_until

BATCH = 1000
BODY = json.dumps(
    {"id": "evt_" + "0" * 20, "type": "invoice.paid", "data": {"blob": "x" * 940}}
).encode()[:1024]
BODY = BODY if len(BODY) == 1024 else BODY + b" " * (1024 - len(BODY))


def event_batches(webhook, n, body, received_at):
    """Store `n` JSON events of `webhook` with `body`, received at `received_at`;
    yield them a batch of saved rows at a time, for the caller's deliveries."""
    from deliveries.models import Event

    for start in range(0, n, BATCH):
        yield Event.objects.bulk_create(
            Event(
                webhook=webhook,
                method="POST",
                body=body,
                body_size=len(body),
                content_type="application/json",
                headers=[["Content-Type", "application/json"]],
                received_at=received_at,
            )
            for _ in range(min(BATCH, n - start))
        )


def drained_rate(ids):
    """Deliveries per second between the first and the last result written."""
    from django.db.models import Max, Min

    from deliveries.models import DeliveryResult

    span = DeliveryResult.objects.filter(delivery_id__in=ids).aggregate(
        a=Min("created_at"), b=Max("created_at")
    )
    seconds = (span["b"] - span["a"]).total_seconds()
    return len(ids) / max(seconds, 1e-3)


def wait_delivered(ids, timeout):
    """Until every one of `ids` is delivered. Polled with one query that reads the
    deliveries between the lowest and the highest id by the primary key: a backlog's
    ids are consecutive, and none of them can be undelivered once nothing in their
    range is (a delivery of someone else's in the range could only make the wait
    longer). Asking for each id by name (900 bound parameters a query) cost the
    measuring process 95 ms of CPU per poll with 8 000 ids, and PostgreSQL 60 ms more:
    a third of a core taken from the engines being measured. The rates are read from
    the results' own times (drained_rate), so the poll's interval costs no precision."""
    from deliveries.models import Delivery

    unfinished = Delivery.objects.filter(id__range=(min(ids), max(ids))).exclude(status="delivered")
    wait_until(
        lambda: not unfinished.exists(),
        timeout=timeout,
        interval=0.2,
        message=f"{len(ids)} deliveries",
    )

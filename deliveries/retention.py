"""Retention: events older than their webhook's retention_days go, with their
deliveries and attempt results, in short transactions that yield to ingest.

Pruning 160 000 events in batches of 500 held SQLite's one writer lock for about
115 ms at a time, back to back, and inbound p95 went from 3 ms to 462 ms. Now a
batch is small (tens of milliseconds), its events are chosen before the write
transaction, and after each one the pruner pauses for as long as the batch took,
so writers waiting for the lock get at least half of the time.

Space: deleted rows leave free pages inside the SQLite file. A database created
with PRAGMA auto_vacuum=INCREMENTAL (settings set it on every connection; SQLite
only applies it to a file that has no tables yet) gives them back to the file
system after each prune, a few megabytes per short transaction. A file created
before that keeps its free pages for reuse until `pruneevents --vacuum` rebuilds
it once (VACUUM: it takes the writer lock for the whole rebuild and needs free
disk as large as the file, so it is run by hand, in a quiet moment). On
PostgreSQL, autovacuum makes deleted rows' space reusable by the next inserts;
the file never shrinks without VACUUM FULL, which steady retention does not need.
"""

import datetime
import threading
import time
from collections import Counter

from django.db import connection, transaction
from django.utils import timezone

from deliveries.models import Delivery, DeliveryResult, Event, Webhook

# Events per transaction: with their deliveries and results, a few hundred rows
# deleted in tens of milliseconds of write lock.
BATCH = 100
# After each batch, pause this many times as long as the batch took.
YIELD = 1.0
# Free pages given back per transaction by the incremental vacuum (4 MiB of
# 4 KiB pages, ~10 ms).
VACUUM_STEP = 1000


def prune_events(*, now=None, batch=BATCH, stop: threading.Event | None = None) -> Counter:
    """Delete what retention allows; return counts of events, deliveries, results.

    An event with a pending or retrying delivery is never deleted: it is still on
    its way, however old. `stop` (set: finish early) is waited on between batches.
    """
    now = now or timezone.now()
    stop = stop or threading.Event()
    removed = Counter()
    for webhook_id, days in Webhook.objects.values_list("id", "retention_days"):
        try:
            cutoff = now - datetime.timedelta(days=days)
        except OverflowError:  # longer than the calendar: nothing is old enough
            continue
        # Candidates only: events still on their way are skipped by _delete, which
        # looks under lock. Left out of this query, that check cannot turn it into
        # an anti-join, which PostgreSQL with stale statistics (right after a bulk
        # load) ran at ~0.7 ms per old event: 11 s a batch.
        expired = Event.objects.filter(webhook_id=webhook_id, received_at__lt=cutoff)
        after = 0
        while True:
            # Chosen outside the write transaction: on SQLite a read does not hold
            # up writers, and the transaction below looks again anyway.
            ids = list(
                expired.filter(id__gt=after).order_by("id").values_list("id", flat=True)[:batch]
            )
            if not ids:
                break
            after = ids[-1]
            started = time.monotonic()
            removed += _delete(ids)
            if stop.wait((time.monotonic() - started) * YIELD):
                return removed
    if removed["events"]:
        give_back_space(stop)
    return removed


def _delete(ids) -> Counter:
    removed = Counter()
    with transaction.atomic():
        # Lock the events and their deliveries, then look again: a redeliver or
        # replay that committed since the SELECT keeps its event (on PostgreSQL;
        # SQLite's single writer already rules it out).
        list(Event.objects.select_for_update().filter(id__in=ids).values_list("id"))
        list(Delivery.objects.select_for_update().filter(event_id__in=ids).values_list("id"))
        busy = set(
            Delivery.objects.filter(event_id__in=ids, status__in=Delivery.UNFINISHED).values_list(
                "event_id", flat=True
            )
        )
        ids = [i for i in ids if i not in busy]
        if not ids:
            return removed
        # Plain DELETEs, children first: Django's delete() would load every row
        # into Python to collect cascades, several times the CPU of the statements,
        # on the cores the inbound view needs meanwhile. These three tables are the
        # only ones pointing at events (tests/test_retention.py holds that); only
        # quoted table names from model metadata are interpolated.
        q = connection.ops.quote_name
        event, delivery, result = (q(m._meta.db_table) for m in (Event, Delivery, DeliveryResult))
        marks = ", ".join(["%s"] * len(ids))
        with connection.cursor() as cursor:
            children = f"SELECT id FROM {delivery} WHERE event_id IN ({marks})"  # noqa: S608
            cursor.execute(f"DELETE FROM {result} WHERE delivery_id IN ({children})", ids)  # noqa: S608
            removed["results"] += cursor.rowcount
            cursor.execute(f"DELETE FROM {delivery} WHERE event_id IN ({marks})", ids)  # noqa: S608
            removed["deliveries"] += cursor.rowcount
            cursor.execute(f"DELETE FROM {event} WHERE id IN ({marks})", ids)  # noqa: S608
            removed["events"] += cursor.rowcount
    return removed


def give_back_space(stop: threading.Event | None = None) -> int:
    """SQLite with incremental auto-vacuum: return free pages to the file system,
    VACUUM_STEP pages per short transaction; the number of pages returned."""
    if connection.vendor != "sqlite" or _pragma("auto_vacuum") != 2:  # 2: INCREMENTAL
        return 0
    stop = stop or threading.Event()
    returned = 0
    while (free := _pragma("freelist_count")) and not stop.is_set():
        started = time.monotonic()
        with transaction.atomic(), connection.cursor() as cursor:
            # Each step of the statement frees one page: Python's sqlite3 runs
            # one step per execute.
            for _ in range(min(free, VACUUM_STEP)):
                cursor.execute("PRAGMA incremental_vacuum")
        returned += min(free, VACUUM_STEP)
        stop.wait((time.monotonic() - started) * YIELD)
    return returned


def vacuum() -> None:
    """Rebuild the SQLite file once, switching it to incremental auto-vacuum."""
    if connection.vendor != "sqlite":
        return
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA auto_vacuum=INCREMENTAL")
        cursor.execute("VACUUM")


def _pragma(name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"PRAGMA {name}")
        return cursor.fetchone()[0]

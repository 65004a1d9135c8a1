"""Retention: events older than their webhook's retention_days go, with their
deliveries and attempt results, in short transactions that yield to ingest.

An inbound request that arrives during a prune's batch on SQLite waits for all of
what is left of it (one writer lock), and with the lock held half of the time, one
in two does: batches sized by count hold it for as long as their events' rows take,
which multiplies inbound p95 (bench/RESULTS.md). So on SQLite a batch is sized by
time, not by count (`Pacer`): each
transaction aims to hold the lock about HOLD (2 ms), the size following the rate
the last batches showed (PostgreSQL keeps batches of SERVER_BATCH: its row locks
hold up no inbound request), its events are chosen before the write transaction
(READ_AHEAD at a time), and after each one the pruner pauses for twice as long as
the batch held the lock, so writers waiting for it get two thirds of the time.
A request that arrives during a batch waits for the rest of it: the shorter
the batch, the less its p95 grows, at the cost of the prune's own speed.

Space: deleted rows leave free pages inside the SQLite file. A database created
with PRAGMA auto_vacuum=INCREMENTAL (the backend, webhooker/db/sqlite, sets it on a
new file; SQLite only applies it to a file that has no tables yet) gives them back
to the file system after each prune, a few megabytes per short transaction. A file
created before that keeps its free pages for reuse until `pruneevents --vacuum` rebuilds
it once (VACUUM: it takes the writer lock for the whole rebuild and needs free
disk as large as the file, and memory as large as its pages in use with the bundled
SQLite, which keeps its temporary store in memory; so it is run by hand, in a quiet moment). On
PostgreSQL, autovacuum makes deleted rows' space reusable by the next inserts;
the file never shrinks without VACUUM FULL, which steady retention does not need.
"""

import datetime
import logging
import threading
import time
from collections import Counter

from django.db import OperationalError, connection, transaction
from django.utils import timezone

from deliveries import audit, bodies
from deliveries.models import Delivery, DeliveryResult, Event, IdempotentRequest, Webhook

logger = logging.getLogger(__name__)

# How long each prune transaction aims to hold the writer lock: what it may add
# to an inbound request that arrives meanwhile (SQLite has one writer).
HOLD = 0.002
# Events in the first transaction, before the pruner has measured any; and the
# most in one.
FIRST_BATCH = 10
MAX_BATCH = 1000
# Events per transaction on a database server, which is not paced (prune_events).
SERVER_BATCH = 100
# Candidate events read at a time, for as many batches as they make.
READ_AHEAD = 1000
# After each batch, pause this many times as long as the batch took: on SQLite,
# where it held the one writer lock, and on PostgreSQL, where it did not.
YIELD = 2.0
SERVER_YIELD = 1.0
# Body bytes in one transaction at most (at least one event): with large bodies the
# pacer's floor of FIRST_BATCH events would hold the lock far past HOLD.
MAX_BATCH_BYTES = 1 << 20
# Times a batch is tried when PostgreSQL aborts it to break a deadlock (SQLSTATE
# 40P01), before it is left for the next prune.
DEADLOCK_TRIES = 3
DEADLOCK_DETECTED = "40P01"
# Free pages given back by the incremental vacuum's first transaction (paced to
# HOLD like the batches after it), and the most.
FIRST_VACUUM_STEP = 100
MAX_VACUUM_STEP = 10_000


class Pacer:
    """Batch sizes that keep each transaction near `hold` seconds.

    The next size is what the last batch's rate would do in `hold`: at most twice
    the last size (one fast batch proves little), at most `limit`, and at least
    `least`: a transaction's fixed cost (BEGIN, the COMMIT's fsync) does not shrink
    with its size, and on a disk whose fsync alone outlasts `hold` the sizes would
    otherwise fall to one and the prune crawl. No `hold`: the size stays `first`.
    """

    def __init__(
        self,
        hold: float | None = HOLD,
        first: int = FIRST_BATCH,
        limit: int = MAX_BATCH,
        least: int = FIRST_BATCH,
    ):
        self.hold = hold
        self.size = first
        self.limit = limit
        self.least = least

    def record(self, done: int, took: float) -> None:
        if self.hold is None or done <= 0:
            return
        rate = done / max(took, 1e-6)
        self.size = max(self.least, min(self.limit, 2 * self.size, int(rate * self.hold)))


def prune_events(
    *, now=None, batch: int | None = None, stop: threading.Event | None = None
) -> Counter:
    """Delete what retention allows; return counts of events, deliveries, results.

    An event with a pending or retrying delivery is never deleted: it is still on
    its way, however old. `stop` (set: finish early) is waited on between batches.
    `batch` fixes the events per transaction; by default they are paced to HOLD.
    """
    now = now or timezone.now()
    stop = stop or threading.Event()
    if batch:
        pacer = Pacer(hold=None, first=batch)
    elif connection.vendor == "sqlite":
        pacer = Pacer()
    else:
        # PostgreSQL's row locks hold up no inbound request, while each of its
        # transactions costs round trips: paced to HOLD it would delete an event
        # at a time.
        pacer = Pacer(hold=None, first=SERVER_BATCH)
    pause = YIELD if connection.vendor == "sqlite" else SERVER_YIELD
    removed = Counter()
    for webhook_id, days in Webhook.objects.values_list("id", "retention_days"):
        try:
            cutoff = now - datetime.timedelta(days=days)
        except OverflowError:  # longer than the calendar: nothing is old enough
            continue
        # Candidates only: events still on their way are skipped by _delete, which
        # looks under lock. Left out of this query, that check cannot turn it into
        # an anti-join, which PostgreSQL with stale statistics (right after a bulk
        # load) runs in time proportional to every old event, for every batch.
        expired = Event.objects.filter(webhook_id=webhook_id, received_at__lt=cutoff)
        after = 0
        while True:
            # Chosen outside the write transaction (on SQLite a read does not hold
            # up writers, and the transaction below looks again anyway), many
            # batches at a time: with stale statistics PostgreSQL runs this read as
            # a sort of every expired event, each time.
            candidates = list(
                expired.filter(id__gt=after)
                .order_by("id")
                .values_list("id", "body_size")[: max(READ_AHEAD, pacer.size)]
            )
            if not candidates:
                break
            after = candidates[-1][0]
            while candidates:
                batch_ids = _batch(candidates, pacer.size)
                del candidates[: len(batch_ids)]
                files = _body_files(batch_ids)
                deleted, held = _delete(batch_ids)
                removed += deleted
                removed["body files"] += _discard_unnamed(files)
                pacer.record(len(batch_ids), held)
                if stop.wait(held * pause):
                    return removed
    # API keys' Idempotency-Key records past their day (deliveries/api/idempotency.py).
    removed["idempotency keys"] = IdempotentRequest.objects.filter(
        created_at__lt=now - IdempotentRequest.KEPT
    ).delete()[0]
    removed["audit entries"] = audit.prune(now)
    removed["body files"] += sweep_body_files()
    if removed["events"]:
        give_back_space(stop)
    return removed


def sweep_body_files(now: float | None = None) -> int:
    """Delete the body files (bodies.py) no event names that are over
    bodies.ORPHAN_AGE old: a crash, or a failed request, between a file and its
    row, and the files of events deleted otherwise than by pruning (a webhook
    deleted, events deleted in the console). Return how many went."""
    cutoff = (now or time.time()) - bodies.ORPHAN_AGE
    old = [name for name, modified in bodies.listing() if modified < cutoff]
    return sum(_discard_unnamed(old[i : i + 1000]) for i in range(0, len(old), 1000))


def _body_files(event_ids) -> list[str]:
    """The body files of these events (only SQLite keeps any)."""
    if connection.vendor != "sqlite":
        return []
    return list(
        Event.objects.filter(id__in=event_ids, body_file__isnull=False).values_list(
            "body_file", flat=True
        )
    )


def _discard_unnamed(names) -> int:
    """Delete the files among `names` that no event names (any more)."""
    if not names:
        return 0
    named = set(Event.objects.filter(body_file__in=names).values_list("body_file", flat=True))
    gone = [name for name in names if name not in named]
    for name in gone:
        bodies.discard(name)
    return len(gone)


def _batch(candidates: list[tuple[int, int]], size: int) -> list[int]:
    """The ids of the first `size` candidates (id, body size), fewer if their bodies
    pass MAX_BATCH_BYTES; at least one."""
    ids, total = [], 0
    for event_id, body_size in candidates[:size]:
        total += body_size
        if ids and total > MAX_BATCH_BYTES:
            break
        ids.append(event_id)
    return ids


def _delete(ids) -> tuple[Counter, float]:
    """Delete these events, their deliveries and results, but not an event with a
    delivery still on its way; return the counts and the seconds the transaction
    held (from BEGIN, where SQLite's writer lock is taken, to COMMIT: a wait for
    the lock behind ingest is not the batch's cost and must not shrink the next).

    Raw statements, their text built before the transaction: on SQLite everything
    inside holds the one writer lock, and Django's query building there costs more
    than the statements."""
    # Plain DELETEs, children first: Django's delete() would load every row into
    # Python to collect cascades, several times the CPU of the statements, on the
    # cores the inbound view needs meanwhile. These three tables are the only ones
    # pointing at events, with events' own resent_from (tests/unit/test_retention.py
    # holds that); only quoted table
    # and column names from model metadata are interpolated.
    q = connection.ops.quote_name
    event, delivery, result = (q(m._meta.db_table) for m in (Event, Delivery, DeliveryResult))
    marks = ", ".join(["%s"] * len(ids))
    for attempt in range(1, DEADLOCK_TRIES + 1):
        removed = Counter()
        try:
            with transaction.atomic():
                began = time.monotonic()
                _delete_in(ids, removed, (event, delivery, result), marks)
            return removed, time.monotonic() - began
        except OperationalError as exc:
            # The batch locks events, then their deliveries; a replay or a
            # webhook's deletion takes the same rows the other way round, and
            # PostgreSQL aborts one side. Once the other side has committed the
            # batch goes through (its look under lock sees what changed); left
            # after DEADLOCK_TRIES, for the next prune, rather than ending this one.
            if getattr(exc.__cause__, "sqlstate", None) != DEADLOCK_DETECTED:
                raise
            if attempt == DEADLOCK_TRIES:
                logger.warning(
                    "prune: %d events left for the next prune, deadlocked %d times: %s",
                    len(ids),
                    attempt,
                    str(exc).splitlines()[0],
                )
    return Counter(), 0.0


_UNFINISHED = frozenset(map(str, Delivery.UNFINISHED))


def _delete_in(ids, removed: Counter, tables, marks: str) -> None:
    event, delivery, result = tables
    q_resent = connection.ops.quote_name(Event._meta.get_field("resent_from").column)
    lock = ""
    with connection.cursor() as cursor:
        if connection.features.has_select_for_update:
            # Lock the events and their deliveries, then look again: a redeliver
            # or replay that committed since the SELECT keeps its event
            # (PostgreSQL; SQLite's single writer already rules it out).
            cursor.execute(f"SELECT id FROM {event} WHERE id IN ({marks}) FOR UPDATE", ids)  # noqa: S608
            lock = " FOR UPDATE"
        # Every delivery of the batch, by its event, the status looked at here: with
        # the status in the WHERE, SQLite chose the index of unfinished deliveries
        # for a batch of ten and read every unfinished one in the database each
        # time (60 000 pending deliveries: 166 events pruned a second, inbound p95
        # 4.3x idle; tests/unit/test_retention.py).
        cursor.execute(
            f"SELECT event_id, status FROM {delivery} WHERE event_id IN ({marks}){lock}",  # noqa: S608
            ids,
        )
        busy = {event_id for event_id, status in cursor.fetchall() if status in _UNFINISHED}
        if busy:
            ids = [i for i in ids if i not in busy]
            if not ids:
                return
            marks = ", ".join(["%s"] * len(ids))
        children = f"SELECT id FROM {delivery} WHERE event_id IN ({marks})"  # noqa: S608
        cursor.execute(f"DELETE FROM {result} WHERE delivery_id IN ({children})", ids)  # noqa: S608
        removed["results"] += cursor.rowcount
        cursor.execute(f"DELETE FROM {delivery} WHERE event_id IN ({marks})", ids)  # noqa: S608
        removed["deliveries"] += cursor.rowcount
        # A resend of a deleted event (Event.resent_from) keeps its own life; the
        # link goes (models.SET_NULL, done here as Django would do it in Python).
        cursor.execute(
            f"UPDATE {event} SET {q_resent} = NULL WHERE {q_resent} IN ({marks})",  # noqa: S608
            ids,
        )
        cursor.execute(f"DELETE FROM {event} WHERE id IN ({marks})", ids)  # noqa: S608
        removed["events"] += cursor.rowcount


def give_back_space(stop: threading.Event | None = None) -> int:
    """SQLite with incremental auto-vacuum: return free pages to the file system in
    short transactions paced like the prune's; the number of pages returned."""
    if connection.vendor != "sqlite" or _pragma("auto_vacuum") != 2:  # 2: INCREMENTAL
        return 0
    stop = stop or threading.Event()
    pacer = Pacer(first=FIRST_VACUUM_STEP, limit=MAX_VACUUM_STEP, least=FIRST_VACUUM_STEP)
    returned = 0
    while (free := _pragma("freelist_count")) and not stop.is_set():
        step = min(free, pacer.size)
        with transaction.atomic(), connection.cursor() as cursor:
            began = time.monotonic()  # the writer lock taken (see _delete)
            # Each step of the statement frees one page: Python's sqlite3 runs
            # one step per execute.
            for _ in range(step):
                cursor.execute("PRAGMA incremental_vacuum")
        took = time.monotonic() - began
        pacer.record(step, took)
        returned += step
        stop.wait(took * YIELD)
    return returned


class VacuumRefused(Exception):
    """The rebuild would not fit where SQLite builds it."""


def vacuum() -> None:
    """Rebuild the SQLite file once, switching it to incremental auto-vacuum.

    SQLite builds the new copy in its temporary store. The bundled library
    (webhooker/db/sqlite/library.py) keeps that store in memory (TEMP_STORE=3),
    so a file whose pages in use exceed the memory available is refused before
    the writer lock is taken, rather than the rebuild failing, or the process
    being killed, halfway.
    """
    if connection.vendor != "sqlite":
        return
    if temp_store_in_memory():
        used = (_pragma("page_count") - _pragma("freelist_count")) * _pragma("page_size")
        available = memory_available()
        if available is not None and used > available:
            raise VacuumRefused(
                f"the rebuild needs about {used / 2**20:.0f} MiB of memory (this SQLite "
                f"builds it in memory) and {available / 2**20:.0f} MiB are available"
            )
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA auto_vacuum=INCREMENTAL")
        cursor.execute("VACUUM")


def temp_store_in_memory() -> bool:
    """Whether this SQLite was built to keep its temporary store in memory always."""
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA compile_options")
        return "TEMP_STORE=3" in {row[0] for row in cursor.fetchall()}


def memory_available() -> int | None:
    """Bytes of memory available to a new allocation (Linux's MemAvailable), or None."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _pragma(name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"PRAGMA {name}")
        return cursor.fetchone()[0]

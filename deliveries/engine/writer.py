"""The result writer: one thread commits attempts' results, many per transaction.

A worker that has made an attempt hands the result over, with its reference, and
goes on to the next task; the writer commits whatever has gathered in one short
transaction (one fsync, one turn at SQLite's write lock instead of one per
attempt), then lets each delivery go or schedules its retry. A result is still
committed before its delivery's last reference is released (invariant 4).
"""

from __future__ import annotations

import datetime
import enum
import functools
import json
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from django.db import DEFAULT_DB_ALIAS, connection, connections, models, transaction
from django.db.models import Exists, Q
from django.db.utils import DatabaseError
from django.utils import timezone

from deliveries.engine.attempts import AttemptResult
from deliveries.models import Delivery, DeliveryResult, Partition

logger = logging.getLogger("deliveries.engine")


class Written(enum.Enum):
    """What became of a result handed to the writer."""

    # The attempt and the delivery's new status are committed.
    COMMITTED = "committed"
    # The delivery was deleted meanwhile (its event pruned, its target removed):
    # there is nothing to write and nothing more to do.
    GONE = "gone"
    # The database failed: the result is kept and written later, and the
    # attempt itself is never sent again meanwhile.
    FAILED = "failed"
    # Fenced off: the delivery's partition was taken by another engine since the
    # task was claimed (its epoch is no longer current). Nothing was written; the
    # new owner's view of the delivery stands.
    STALE = "stale"


@dataclass(frozen=True, slots=True)
class NotBefore:
    """A target's breaker opened: none of its unfinished deliveries will be tried
    before `at`, and their next_attempt_at should say so. Written in line with the
    results, after those handed over before it, so none of them undoes it."""

    target_id: int
    at: datetime.datetime
    # (partition, epoch) when the breaker opened, as Task.fence.
    fence: tuple[int, int] | None = None


class ResultWriter:
    MAX_BATCH = 500
    # Seconds a batch gathers results after its first: a receiver that answers in
    # 50 ms lets ten workers finish an attempt every 5 ms, each alone in its batch
    # if written at once, and a batch of one costs the engine and PostgreSQL
    # several times a batch of five per result (bench/RESULTS.md). Only the write
    # waits, never the attempt; a result something waits on (`awaited`) ends the
    # gathering at once.
    LINGER = 0.01

    def __init__(
        self,
        *,
        on_written: Callable[[AttemptResult, Written], None],
        awaited: Callable[[AttemptResult | NotBefore], bool] = lambda item: False,
    ):
        self.on_written = on_written
        # Whether something waits for this item's write (turns.Turns.awaited): it ends
        # the gathering of its batch at once.
        self.awaited = awaited
        self._queue = queue.SimpleQueue()
        # Set when an awaited item is submitted, or a batch is full (the queue and
        # the writer's first item): the gathering batch is written now.
        # The writer waits on this, not on the queue, while it gathers, so that the
        # results of a busy engine wake it once per batch, not once per result.
        self._urgent = threading.Event()
        self.running = False

    def submit(self, item: AttemptResult | NotBefore) -> None:
        self._queue.put(item)
        if self.awaited(item) or self._queue.qsize() + 1 >= self.MAX_BATCH:
            self._urgent.set()

    def pending(self) -> int:
        return self._queue.qsize()

    def run(self, stop_event, stamp=lambda name: None) -> None:
        """Write until `stop_event` is set and nothing is left to write; `stamp` is
        told of every turn (runner.Watchdog)."""
        self.running = True
        try:
            while True:
                stamp("writer")
                try:
                    first = self._queue.get(timeout=0.2)
                except queue.Empty:
                    if stop_event.is_set():
                        return
                    continue
                if not self.awaited(first):
                    self._urgent.wait(self.LINGER)
                # Cleared before the queue is read: an awaited item submitted from
                # here on is either in this batch or sets it again for the next.
                self._urgent.clear()
                batch = [first]
                while len(batch) < self.MAX_BATCH:
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                connection.close_if_unusable_or_obsolete()
                self.write(batch)
        finally:
            self.running = False

    def _tell(self, result: AttemptResult, written: Written) -> None:
        """`on_written`, which must not end the writer's thread: a failure after the
        commit (the target's control state, its alert) costs that step, logged."""
        try:
            self.on_written(result, written)
        except Exception:
            logger.exception("delivery %s: after its result was written", result.task.delivery_id)
            connection.close()

    def write(self, batch: list[AttemptResult | NotBefore]) -> None:
        """Commit a batch, then tell `on_written` what became of each result."""
        results = [item for item in batch if isinstance(item, AttemptResult)]
        dates = [item for item in batch if isinstance(item, NotBefore)]
        try:
            if dates:
                with transaction.atomic():
                    existing, written = write_results(results)
                    for item in dates:
                        rows = Delivery.objects.unfinished().filter(target_id=item.target_id)
                        if item.fence is not None:
                            number, epoch = item.fence
                            rows = rows.filter(
                                Exists(Partition.objects.filter(number=number, epoch=epoch))
                            )
                        rows.filter(
                            Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lt=item.at)
                        ).update(next_attempt_at=item.at)
            else:
                # Atomic by itself: on PostgreSQL one statement, no BEGIN or
                # COMMIT round trips around it.
                existing, written = write_results(results)
        except DatabaseError:
            logger.warning("writing %d results failed; will retry", len(batch), exc_info=True)
            connection.close()
            for result in results:
                self._tell(result, Written.FAILED)
            return
        for result in results:
            delivery_id = result.task.delivery_id
            if delivery_id in written:
                self._tell(result, Written.COMMITTED)
            elif delivery_id in existing:
                logger.warning(
                    "delivery %s: result of attempt %s dropped: its partition changed hands "
                    "since it was claimed ((partition, epoch) %s is stale)",
                    delivery_id,
                    result.number,
                    result.task.fence,
                )
                self._tell(result, Written.STALE)
            else:
                self._tell(result, Written.GONE)


# The columns of a delivery's status written for each attempt. Only these:
# columns other processes may change (the admin) are left alone.
STATUS_COLUMNS = (
    "status",
    "attempts",
    "next_attempt_at",
    "reason",
    "failure",
    "updated_at",
    "id",
)


def write_results(batch: list[AttemptResult]) -> tuple[set[int], set[int]]:
    """Write the statuses and the attempt results of a batch atomically; return the
    ids of the deliveries that still existed (a deleted one gets no result) and of
    those written (existing, and not fenced off: see below).

    PostgreSQL: one prepared statement (_postgresql_statement), which writes a
    result only while its task's epoch is its partition's current one. SQLite, whose
    statements cost no round trip and which has one engine (nothing to fence): an
    existence SELECT, an UPDATE per delivery and an INSERT per result, in one
    transaction (_write_sqlite).
    """
    now = timezone.now()
    statuses = [
        (
            result.status,
            result.attempts,
            now + datetime.timedelta(seconds=result.delay) if result.delay is not None else None,
            result.reason,
            result.failure,
            now,
            result.task.delivery_id,
        )
        for result in batch
    ]
    results = [
        {
            "delivery_id": result.task.delivery_id,
            "target_id": result.task.target_id,
            "attempt": result.number,
            "success": outcome.success,
            "status_code": outcome.status_code,
            "response_body": _storable(outcome.response_body[: DeliveryResult.RESPONSE_BODY_LIMIT]),
            "request_url": _storable(outcome.request_url),
            "request_headers": [list(line) for line in outcome.request_headers],
            "response_headers": _storable(outcome.response_headers),
            "error": _storable(outcome.error[:2000]),
            "failure": outcome.failure,
            "duration_ms": result.duration_ms,
            "created_at": now,
        }
        for result in batch
        # No outcome: filtered, no attempt was made.
        if (outcome := result.outcome) is not None
    ]
    if not statuses:
        return set(), set()
    if connection.vendor == "postgresql":
        fences = [result.task.fence for result in batch]
        ids = [row[-1] for row in statuses]
        with connection.prepared_cursor() as cursor:
            cursor.execute(
                _postgresql_statement(),
                [
                    sorted({fence[0] for fence in fences if fence is not None}),
                    _json(
                        [
                            {**dict(zip(STATUS_COLUMNS, row, strict=True)), **_fence_columns(fence)}
                            for row, fence in zip(statuses, fences, strict=True)
                        ]
                    ),
                    ids,
                    _json(results),
                    ids,
                ],
            )
            rows = cursor.fetchall()
        return {id_ for id_, _ in rows}, {id_ for id_, written in rows if written}
    with transaction.atomic():
        existing = _write_sqlite(statuses, results)
    return existing, existing


def _fence_columns(fence) -> dict:
    partition, epoch = fence or (None, None)
    return {"fence_partition": partition, "fence_epoch": epoch}


@functools.cache
def _postgresql_statement() -> str:
    """Statuses and results of a batch in one statement, each table's rows as one
    JSON parameter read by jsonb_to_recordset: the UPDATE says which deliveries
    exist and the INSERT reads that, in data-modifying CTEs. One round trip,
    atomic in autocommit, where a transaction of an UPDATE and an INSERT took four
    (BEGIN, UPDATE, INSERT, COMMIT); one parameter per table, where arrays per
    column or a row per INSERT cost psycopg and Django a dumper or a preparation
    per value. With batches of one or two results under load, that was a third of
    an engine's CPU (bench/RESULTS.md)."""
    quote = connection.ops.quote_name
    delivery = {f.attname: f for f in Delivery._meta.concrete_fields}
    statuses = [delivery[name] for name in STATUS_COLUMNS]
    results = [f for f in DeliveryResult._meta.concrete_fields if not f.primary_key]

    # The JSON keys, and so the records' columns, are attnames.
    def record(fields):
        return ", ".join(f"{quote(f.attname)} {f.db_type(connection)}" for f in fields)

    def columns(fields, prefix=""):
        return ", ".join(prefix + quote(f.attname if prefix else f.column) for f in fields)

    into = DeliveryResult._meta.get_field("delivery").attname
    deliveries = quote(Delivery._meta.db_table)
    fence = "fence_partition integer, fence_epoch bigint"
    return (
        # The fence: the partitions' current epochs, each row held FOR SHARE until
        # this statement commits. A take (partition_manager.TAKE) updates the row, so it
        # waits for this write, and the new owner's recovery, which reads after its
        # take, sees the write; a write behind a take reads the new epoch (READ
        # COMMITTED re-reads a locked row's latest version) and changes nothing.
        f"WITH f AS (SELECT number, epoch FROM {quote(Partition._meta.db_table)} "
        "WHERE number = ANY(%s::integer[]) FOR SHARE), "
        f"s AS (UPDATE {deliveries} AS d SET "
        + ", ".join(f"{quote(f.column)} = v.{quote(f.attname)}" for f in statuses[:-1])
        + f" FROM jsonb_to_recordset(%s::jsonb) AS v({record(statuses)}, {fence})"
        # Also by an array of the ids: the planner cannot see how many rows the
        # JSON holds (it assumes 100), and with a small table it scanned all of it
        # for a hash join; `= ANY` of an array goes through the primary key.
        + " WHERE d.id = ANY(%s::bigint[]) AND d.id = v.id AND (v.fence_epoch IS NULL OR "
        + "EXISTS (SELECT 1 FROM f WHERE f.number = v.fence_partition "
        + "AND f.epoch = v.fence_epoch)) RETURNING d.id), "
        + f"r AS (INSERT INTO {quote(DeliveryResult._meta.db_table)} ({columns(results)}) "
        + f"SELECT {columns(results, 'v.')} "
        + f"FROM jsonb_to_recordset(%s::jsonb) AS v({record(results)}) "
        + f"WHERE v.{quote(into)} IN (SELECT id FROM s) "
        # A result written again after a write whose COMMIT's answer was lost (it
        # committed) is not a second result of that attempt.
        + f"AND NOT EXISTS (SELECT 1 FROM {quote(DeliveryResult._meta.db_table)} AS x "
        + f"WHERE x.{quote(into)} = v.{quote(into)} AND x.attempt = v.attempt)) "
        # Which deliveries exist, and which of them were written.
        + f"SELECT d.id, d.id IN (SELECT id FROM s) FROM {deliveries} AS d "
        + "WHERE d.id = ANY(%s::bigint[])"
    )


def _json(rows: list[dict]) -> str:
    # Datetimes as ISO 8601, which timestamptz reads.
    return json.dumps(rows, default=datetime.datetime.isoformat)


def _storable(text: str) -> str:
    """A receiver's answer may hold a NUL, which PostgreSQL text and jsonb cannot:
    kept visibly, as U+FFFD, so the result is written rather than failing its batch."""
    return text.replace("\x00", "\ufffd")


def _write_sqlite(statuses: list[tuple], results: list[dict]) -> set[int]:
    """SQLite: write rows of STATUS_COLUMNS and their results (_sqlite_statements);
    return the ids that exist. The caller's transaction makes it atomic."""
    db = connections[DEFAULT_DB_ALIAS]
    # Datetimes as SQLite stores them. A batch's rows share one `now`: each
    # distinct value is adapted once.
    adapt = functools.cache(db.ops.adapt_datetimefield_value)
    statuses = [
        (status, attempts, adapt(due), reason, failure, adapt(at), id_)
        for status, attempts, due, reason, failure, at, id_ in statuses
    ]
    prepared = _preparers(db, adapt)
    statements = _sqlite_statements()
    with db.cursor() as cursor:
        cursor.execute(statements["existing"], [json.dumps([row[-1] for row in statuses])])
        existing = {id_ for (id_,) in cursor.fetchall()}
        cursor.executemany(statements["status"], [row for row in statuses if row[-1] in existing])
        cursor.executemany(
            statements["result"],
            [
                [row[name] if prepare is None else prepare(row[name]) for name, prepare in prepared]
                for row in results
                if row["delivery_id"] in existing
            ],
        )
    return existing


def _result_fields():
    return [f for f in DeliveryResult._meta.concrete_fields if not f.primary_key]


def _preparers(db, adapt) -> list[tuple[str, Callable | None]]:
    """(attname, what makes its value one SQLite takes, or None) per result
    column: datetimes by `adapt`, JSON by its Django field. write_results builds
    every other value as its column's type already (ints, bools, text), so those go
    as they are: a Field's preparation of each value, through the connection's
    thread-local lookups, cost more than SQLite's whole INSERT."""
    preparers = []
    for field in _result_fields():
        if isinstance(field, models.DateTimeField):
            prepare = adapt
        elif isinstance(field, models.JSONField):
            prepare = functools.partial(field.get_db_prep_save, connection=db)
        else:
            prepare = None
        preparers.append((field.attname, prepare))
    return preparers


@functools.cache
def _sqlite_statements() -> dict[str, str]:
    """The SQLite writer's statements, built once (its batches are often of one
    result: the ORM building them cost more than SQLite running them)."""
    quote = connection.ops.quote_name
    deliveries = quote(Delivery._meta.db_table)
    statuses = [quote(Delivery._meta.get_field(name).column) for name in STATUS_COLUMNS]
    results = _result_fields()
    return {
        "existing": f"SELECT id FROM {deliveries} WHERE id IN (SELECT value FROM json_each(%s))",
        "status": (
            f"UPDATE {deliveries} SET "
            + ", ".join(f"{name} = %s" for name in statuses[:-1])
            + f" WHERE {statuses[-1]} = %s"
        ),
        "result": (
            f"INSERT INTO {quote(DeliveryResult._meta.db_table)} "
            f"({', '.join(quote(f.column) for f in results)}) "
            f"VALUES ({', '.join(['%s'] * len(results))})"
        ),
    }

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
import logging
import queue
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connection, transaction
from django.db.models import Q
from django.db.utils import DatabaseError
from django.utils import timezone

from deliveries.engine.attempts import AttemptResult
from deliveries.models import Delivery, DeliveryResult

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


@dataclass(frozen=True, slots=True)
class NotBefore:
    """A target's breaker opened: none of its unfinished deliveries will be tried
    before `at`, and their next_attempt_at should say so. Written in line with the
    results, after those handed over before it, so none of them undoes it."""

    target_id: int
    at: datetime.datetime


class ResultWriter:
    MAX_BATCH = 500

    def __init__(self, *, on_written: Callable[[AttemptResult, Written], None]):
        self.on_written = on_written
        self._queue = queue.SimpleQueue()
        self.running = False

    def submit(self, item: AttemptResult | NotBefore) -> None:
        self._queue.put(item)

    def pending(self) -> int:
        return self._queue.qsize()

    def run(self, stop_event) -> None:
        """Write until `stop_event` is set and nothing is left to write."""
        self.running = True
        try:
            while True:
                try:
                    first = self._queue.get(timeout=0.2)
                except queue.Empty:
                    if stop_event.is_set():
                        return
                    continue
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

    def write(self, batch: list[AttemptResult | NotBefore]) -> None:
        """Commit a batch, then tell `on_written` what became of each result."""
        results = [item for item in batch if isinstance(item, AttemptResult)]
        dates = [item for item in batch if isinstance(item, NotBefore)]
        try:
            with transaction.atomic():
                existing = write_results(results)
                for item in dates:
                    Delivery.objects.unfinished().filter(target_id=item.target_id).filter(
                        Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lt=item.at)
                    ).update(next_attempt_at=item.at)
        except DatabaseError:
            logger.warning("writing %d results failed; will retry", len(batch), exc_info=True)
            connection.close()
            for result in results:
                self.on_written(result, Written.FAILED)
            return
        for result in results:
            gone = result.task.delivery_id not in existing
            self.on_written(result, Written.GONE if gone else Written.COMMITTED)


def write_results(batch: list[AttemptResult]) -> set[int]:
    """One transaction for the whole batch; return the ids that still existed.

    Statuses are written with an UPDATE per delivery, so columns other processes
    may change (the admin) are left alone.
    """
    now = timezone.now()
    ops = connection.ops
    updated_at = ops.adapt_datetimefield_value(now)
    rows = [
        (
            result.status,
            result.attempts,
            ops.adapt_datetimefield_value(
                now + datetime.timedelta(seconds=result.delay) if result.delay is not None else None
            ),
            updated_at,
            result.task.delivery_id,
        )
        for result in batch
    ]
    with transaction.atomic():
        existing = _update_statuses(rows)
        _insert_results(
            DeliveryResult(
                delivery_id=result.task.delivery_id,
                target_id=result.task.target_id,
                attempt=result.number,
                success=outcome.success,
                status_code=outcome.status_code,
                response_body=outcome.response_body[: DeliveryResult.RESPONSE_BODY_LIMIT],
                request_url=outcome.request_url,
                request_headers=[list(line) for line in outcome.request_headers],
                response_headers=outcome.response_headers,
                error=outcome.error[:2000],
                duration_ms=result.duration_ms,
                created_at=now,
            )
            for result in batch
            # No outcome: filtered, no attempt was made.
            if (outcome := result.outcome) is not None and result.task.delivery_id in existing
        )
    return existing


def _update_statuses(rows: list[tuple]) -> set[int]:
    """Write (status, attempts, next_attempt_at, updated_at, id) rows; return the ids
    that exist. PostgreSQL: one prepared statement over arrays, which also says which
    rows it found, in place of an existence SELECT and an UPDATE per row (the
    writer measured over half of an engine's CPU under four engines at full load;
    bench/RESULTS.md). SQLite, whose statements cost no round trip: those two."""
    if not rows:
        return set()
    table = connection.ops.quote_name(Delivery._meta.db_table)
    if connection.vendor == "postgresql":
        with connection.prepared_cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} AS d SET status = v.status, attempts = v.attempts, "
                "next_attempt_at = v.next_attempt_at, updated_at = v.updated_at "
                "FROM unnest(%s::varchar[], %s::integer[], %s::timestamptz[], "
                "%s::timestamptz[], %s::bigint[]) "
                "AS v(status, attempts, next_attempt_at, updated_at, id) "
                "WHERE d.id = v.id RETURNING d.id",
                [list(column) for column in zip(*rows, strict=True)],
            )
            return {row[0] for row in cursor.fetchall()}
    with connection.cursor() as cursor:
        ids = [row[-1] for row in rows]
        existing = set(Delivery.objects.filter(id__in=ids).values_list("id", flat=True))
        cursor.executemany(
            f"UPDATE {table} SET status = %s, attempts = %s, next_attempt_at = %s, "
            "updated_at = %s WHERE id = %s",
            [row for row in rows if row[-1] in existing],
        )
        return existing


def _insert_results(records) -> None:
    """bulk_create, but on PostgreSQL with server-side binding and one prepared
    statement (webhooker/postgresql): Django would quote every value, response
    bodies and header lists included, into the SQL text in Python, which measured a
    quarter of an engine's CPU."""
    records = list(records)
    if not records:
        return
    if connection.vendor != "postgresql":
        DeliveryResult.objects.bulk_create(records)
        return
    fields = [f for f in DeliveryResult._meta.concrete_fields if not f.primary_key]
    quote = connection.ops.quote_name
    sql = (
        f"INSERT INTO {quote(DeliveryResult._meta.db_table)} "
        f"({', '.join(quote(f.column) for f in fields)}) "
        f"VALUES ({', '.join(['%s'] * len(fields))})"
    )
    params = [
        [f.get_db_prep_save(f.pre_save(record, add=True), connection) for f in fields]
        for record in records
    ]
    with connection.prepared_cursor() as cursor:
        cursor.executemany(sql, params)

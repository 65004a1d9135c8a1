"""The result writer: one thread commits attempts' results, many per transaction.

A worker that has made an attempt hands the result over, with its reference, and
goes on to the next task; the writer commits whatever has gathered in one short
transaction (one fsync, one turn at SQLite's write lock instead of one per
attempt), then lets each delivery go or schedules its retry. A result is still
committed before its delivery's last reference is released (invariant 4).
"""

import datetime
import logging
import queue

from django.db import connection, transaction
from django.db.utils import DatabaseError
from django.utils import timezone

from deliveries.models import Delivery, DeliveryResult

logger = logging.getLogger("deliveries.engine")


class ResultWriter:
    MAX_BATCH = 500

    def __init__(self, *, on_written):
        # on_written(item, written): written is True, False (the delivery is gone)
        # or None (the database failed; try again later).
        self.on_written = on_written
        self._queue = queue.SimpleQueue()
        self.running = False

    def submit(self, item) -> None:
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

    def write(self, batch) -> None:
        """Commit a batch of (task, outcome, status, delay, duration_ms)."""
        try:
            written = write_results(batch)
        except DatabaseError:
            logger.warning("writing %d results failed; will retry", len(batch), exc_info=True)
            connection.close()
            for item in batch:
                self.on_written(item, None)
            return
        for item in batch:
            self.on_written(item, item[0].delivery_id in written)


def write_results(batch) -> set[int]:
    """One transaction for the whole batch; return the ids that still existed.

    Statuses are written with an UPDATE per delivery, so columns other processes
    may change (the admin) are left alone.
    """
    now = timezone.now()
    ops = connection.ops
    table = connection.ops.quote_name(Delivery._meta.db_table)
    with transaction.atomic():
        ids = [item[0].delivery_id for item in batch]
        existing = set(Delivery.objects.filter(id__in=ids).values_list("id", flat=True))
        rows, results = [], []
        for task, outcome, status, delay, duration_ms in batch:
            if task.delivery_id not in existing:
                continue
            next_at = now + datetime.timedelta(seconds=delay) if delay is not None else None
            rows.append(
                (
                    status,
                    task.attempts + 1,
                    ops.adapt_datetimefield_value(next_at),
                    ops.adapt_datetimefield_value(now),
                    task.delivery_id,
                )
            )
            results.append(
                DeliveryResult(
                    delivery_id=task.delivery_id,
                    attempt=task.attempts + 1,
                    success=outcome.success,
                    status_code=outcome.status_code,
                    response_body=outcome.response_body[: DeliveryResult.RESPONSE_BODY_LIMIT],
                    error=outcome.error[:2000],
                    duration_ms=duration_ms,
                    created_at=now,
                )
            )
        if rows:
            with connection.cursor() as cursor:
                cursor.executemany(
                    f"UPDATE {table} SET status = %s, attempts = %s, next_attempt_at = %s, "
                    "updated_at = %s WHERE id = %s",
                    rows,
                )
            DeliveryResult.objects.bulk_create(results)
    return existing

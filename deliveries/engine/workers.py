"""What a worker does with one task: the only code that calls a target."""

import datetime
import logging
import time

from django.db import connection, transaction
from django.db.utils import DatabaseError
from django.utils import timezone

from deliveries.engine.backoff import retry_delay
from deliveries.models import Delivery, DeliveryResult
from deliveries.targets import TARGET_TYPES, Outcome

logger = logging.getLogger("deliveries.engine")


def call_target(task) -> Outcome:
    """Run the target's deliver(); any exception becomes a failed outcome."""
    if not task.target_active:
        return Outcome(
            success=False,
            error="target is inactive; redeliver after activating it",
            permanent=True,
        )
    target = TARGET_TYPES.get(task.target_type)
    if target is None:
        return Outcome(
            success=False, error=f"unknown target type {task.target_type!r}", permanent=True
        )
    try:
        return target.deliver(task)
    except DatabaseError:
        raise  # the engine's own trouble (reading a body): not the target's failure
    except Exception as exc:  # a bug or a broken config must not kill the worker
        logger.exception("target %s raised on delivery %s", task.target_id, task.delivery_id)
        return Outcome(success=False, error=f"{type(exc).__name__}: {exc}")


def decide(task, outcome: Outcome, *, retries: bool, base: float, cap: float):
    """The delivery's next status and, when retrying, the delay in seconds."""
    if outcome.success:
        return Delivery.Status.DELIVERED, None
    attempt = task.attempts + 1
    if not retries or outcome.permanent or attempt > task.max_retries:
        return Delivery.Status.FAILED, None
    return Delivery.Status.RETRYING, retry_delay(attempt, outcome.retry_after, base=base, cap=cap)


def write_result(task, outcome: Outcome, status, delay, duration_ms) -> bool:
    """Commit the attempt's result and the delivery's new status together.

    The status is written with filter().update(), so columns other processes may
    change (the admin) are left alone. False if the delivery no longer exists
    (its webhook was deleted meanwhile): there is nothing left to record.
    """
    now = timezone.now()
    next_attempt_at = now + datetime.timedelta(seconds=delay) if delay is not None else None
    # Short and free of I/O: the HTTP call happened before this transaction began.
    with transaction.atomic():
        updated = Delivery.objects.filter(id=task.delivery_id).update(
            status=status,
            attempts=task.attempts + 1,
            next_attempt_at=next_attempt_at,
            updated_at=now,
        )
        if not updated:
            return False
        DeliveryResult.objects.create(
            delivery_id=task.delivery_id,
            attempt=task.attempts + 1,
            success=outcome.success,
            status_code=outcome.status_code,
            response_body=outcome.response_body[: DeliveryResult.RESPONSE_BODY_LIMIT],
            error=outcome.error[:2000],
            duration_ms=duration_ms,
            created_at=now,
        )
    return True


def write_result_retrying(task, outcome, status, delay, duration_ms, tries=3):
    """write_result through a short database hiccup.

    True: written. False: the delivery no longer exists. None: the database is
    still failing; the caller keeps the delivery and tries the write later.
    """
    for n in range(tries):
        try:
            return write_result(task, outcome, status, delay, duration_ms)
        except DatabaseError:
            logger.warning(
                "writing the result of delivery %s failed (try %d)",
                task.delivery_id,
                n + 1,
                exc_info=True,
            )
            connection.close()
            time.sleep(0.2 * 2**n)
    return None


def log_attempt(task, outcome, status, duration_ms) -> None:
    logger.info(
        "delivery=%s target=%s type=%s attempt=%d outcome=%s status_code=%s duration_ms=%d%s",
        task.delivery_id,
        task.target_id,
        task.target_type,
        task.attempts + 1,
        status,
        outcome.status_code if outcome.status_code is not None else "-",
        duration_ms,
        f" error={outcome.error!r}" if outcome.error else "",
    )


def timed_call(task):
    start = time.monotonic()
    outcome = call_target(task)
    return outcome, int((time.monotonic() - start) * 1000)

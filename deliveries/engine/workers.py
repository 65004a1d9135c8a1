"""What a worker does with one task: the only code that calls a target."""

import logging
import time

from django.db.utils import DatabaseError

from deliveries.engine.backoff import retry_delay
from deliveries.models import Delivery
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

"""One attempt: the only code that calls a target, and what its outcome decides.

`attempt()` sends one task to its target and returns an `AttemptResult`: the
outcome, the status the delivery moves to and, when it is retried, the delay. The
result writer commits it; the engine then schedules the retry or lets the task go.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from django.db.utils import DatabaseError

from deliveries.engine.backoff import retry_delay
from deliveries.engine.task import Task
from deliveries.models import Delivery
from deliveries.targets import TARGET_TYPES, Outcome

logger = logging.getLogger("deliveries.engine")


@dataclass(slots=True)
class AttemptResult:
    """What one attempt came to, on its way to the database."""

    task: Task
    outcome: Outcome
    # The delivery's status after this attempt: delivered, retrying or failed.
    status: str
    # Seconds until the next attempt when `status` is retrying, else None.
    delay: float | None
    duration_ms: int

    @property
    def number(self) -> int:
        """This attempt's number: 1 for the first."""
        return self.task.attempts + 1


def retries(task: Task) -> bool:
    """Whether max_retries, backoff and the circuit breaker apply to the task."""
    kind = TARGET_TYPES.get(task.target_type)
    return kind is not None and kind.retries and task.max_retries > 0


def attempt(task: Task, body: bytes, *, base: float, cap: float) -> AttemptResult:
    """Send the task to its target once, time it, and decide what comes next."""
    start = time.monotonic()
    outcome = call_target(task, body)
    duration_ms = int((time.monotonic() - start) * 1000)
    status, delay = decide(task, outcome, retries=retries(task), base=base, cap=cap)
    result = AttemptResult(task, outcome, status, delay, duration_ms)
    log_attempt(result)
    return result


def call_target(task: Task, body: bytes) -> Outcome:
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
        return target.deliver(task, body)
    except DatabaseError:
        raise  # the engine's own trouble, not the target's failure
    except Exception as exc:  # a bug or a broken config must not kill the worker
        logger.exception("target %s raised on delivery %s", task.target_id, task.delivery_id)
        return Outcome(success=False, error=f"{type(exc).__name__}: {exc}")


def decide(task: Task, outcome: Outcome, *, retries: bool, base: float, cap: float):
    """The delivery's next status and, when retrying, the delay in seconds."""
    if outcome.success:
        return Delivery.Status.DELIVERED, None
    attempt = task.attempts + 1
    if not retries or outcome.permanent or attempt > task.max_retries:
        return Delivery.Status.FAILED, None
    return Delivery.Status.RETRYING, retry_delay(attempt, outcome.retry_after, base=base, cap=cap)


def log_attempt(result: AttemptResult) -> None:
    task, outcome = result.task, result.outcome
    logger.info(
        "delivery=%s target=%s type=%s attempt=%d outcome=%s status_code=%s duration_ms=%d%s",
        task.delivery_id,
        task.target_id,
        task.target_type,
        result.number,
        result.status,
        outcome.status_code if outcome.status_code is not None else "-",
        result.duration_ms,
        f" error={outcome.error!r}" if outcome.error else "",
    )

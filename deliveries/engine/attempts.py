"""One attempt: the only code that calls a target, and what its outcome decides.

`attempt()` sends one task to its target and returns an `AttemptResult`: the
outcome, the status the delivery moves to and, when it is retried, the delay. The
result writer commits it; the engine then schedules the retry or lets the task go.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from deliveries.engine.backoff import retry_delay, scheduled_delay
from deliveries.engine.task import Task
from deliveries.models import Delivery
from deliveries.targets import TARGET_TYPES, Outcome
from webhooker import encryption

logger = logging.getLogger("deliveries.engine")
FILTERS_DID_NOT_MATCH = "the target's filters did not match"


@dataclass(slots=True)
class AttemptResult:
    """What one attempt came to, on its way to the database."""

    task: Task
    # None when no attempt was made (the target's filters did not match).
    outcome: Outcome | None
    # The delivery's status after this attempt: delivered, retrying, failed or
    # filtered.
    status: str
    # Seconds until the next attempt when `status` is retrying, else None.
    delay: float | None
    duration_ms: int
    # Why the delivery ended with no attempt (filtered): in words, else "".
    reason: str = ""

    @property
    def number(self) -> int:
        """This attempt's number: 1 for the first."""
        return self.task.attempts + 1

    @property
    def failure(self) -> str:
        """The class of the failure that ended the delivery (FAILURES), else ""."""
        if self.status != Delivery.Status.FAILED or self.outcome is None:
            return ""
        return self.outcome.failure or "internal"

    @property
    def attempts(self) -> int:
        """The delivery's attempt count once this result is written."""
        return self.task.attempts + (self.outcome is not None)


def attempt(task: Task, body: bytes, *, base: float, cap: float, sent=None) -> AttemptResult:
    """Send the task to its target (`task.target`) once, time it, and decide what
    comes next. `sent`: the task as its transform shaped it, when it has one."""
    start = time.monotonic()
    return conclude(task, call_target(sent or task, body), start, base=base, cap=cap)


def request(task: Task, body: bytes):
    """The HTTP request that makes this attempt (transport.Request), to be sent on
    the client's loop, or None: the target delivers by itself (call_target), or
    building the request failed (call_target then says how)."""
    kind = TARGET_TYPES.get(task.target.type)
    if kind is None:
        return None
    try:
        return kind.request(task, body)
    except Exception:
        return None


def conclude(task: Task, outcome: Outcome, start: float, *, base: float, cap: float):
    """The result of an attempt that began at `start` (time.monotonic) and came to
    `outcome`."""
    duration_ms = int((time.monotonic() - start) * 1000)
    status, delay = decide(task, outcome, retries=task.target.retries, base=base, cap=cap)
    result = AttemptResult(task, outcome, status, delay, duration_ms)
    span, task.span = task.span, None
    if span is not None:
        span.end(outcome, status)
    log_attempt(result)
    return result


def filtered(task: Task, reason: str = FILTERS_DID_NOT_MATCH) -> AttemptResult:
    """The target's filters did not match, or its transform dropped the event: the
    delivery ends with no attempt."""
    return AttemptResult(task, None, Delivery.Status.FILTERED, None, 0, reason)


def transform_failed(task: Task, error: str, start: float) -> AttemptResult:
    """The target's transform failed on this event: the delivery fails at once (the
    same input gives the same error), its attempt saying why."""
    outcome = Outcome(
        success=False, error=f"transform failed: {error}", permanent=True, failure="transform"
    )
    return conclude(task, outcome, start, base=0, cap=0)


def unreadable(task: Task, what: str, *, base: float, cap: float) -> AttemptResult:
    """The target's stored secrets cannot be decrypted (encryption.Unreadable): an
    attempt that sends nothing and fails in words, retried as usual (the key may be
    put back in time), never counted by the breaker (it is not the receiver's)."""
    outcome = Outcome(success=False, error=f"{what} {encryption.PROBLEM}", failure="config")
    return conclude(task, outcome, time.monotonic(), base=base, cap=cap)


def call_target(task: Task, body: bytes) -> Outcome:
    """Run the target's deliver(); any exception becomes a failed outcome."""
    kind = TARGET_TYPES.get(task.target.type)
    if kind is None:
        return Outcome(
            success=False,
            error=f"unknown target type {task.target.type!r}",
            permanent=True,
            failure="config",
        )
    try:
        return kind.deliver(task, body)
    except Exception as exc:  # a bug or a broken config must not kill the worker
        logger.exception("target %s raised on delivery %s", task.target_id, task.delivery_id)
        return Outcome(success=False, error=f"{type(exc).__name__}: {exc}", failure="internal")


def decide(task: Task, outcome: Outcome, *, retries: bool, base: float, cap: float):
    """The delivery's next status and, when retrying, the delay in seconds."""
    if outcome.success:
        return Delivery.Status.DELIVERED, None
    attempt = task.attempts + 1
    schedule = task.target.retry_schedule
    limit = len(schedule) if schedule else task.target.max_retries
    if not retries or outcome.permanent or attempt > limit:
        return Delivery.Status.FAILED, None
    if schedule:
        return Delivery.Status.RETRYING, scheduled_delay(
            schedule, attempt, outcome.retry_after, cap=cap
        )
    return Delivery.Status.RETRYING, retry_delay(attempt, outcome.retry_after, base=base, cap=cap)


def log_attempt(result: AttemptResult) -> None:
    task, outcome = result.task, result.outcome
    logger.info(
        "delivery=%s target=%s type=%s attempt=%d outcome=%s status_code=%s duration_ms=%d%s",
        task.delivery_id,
        task.target_id,
        task.target.type,
        result.number,
        result.status,
        outcome.status_code if outcome.status_code is not None else "-",
        result.duration_ms,
        f" error={outcome.error!r}" if outcome.error else "",
        # Fields of their own under LOG_FORMAT=json (deliveries/logs.py).
        extra={"delivery": task.delivery_id, "event": str(task.event_code)},
    )

"""How long to wait before retry number n (docs/architecture.md, Targets)."""

import random

JITTER = 0.10


def backoff_delay(attempt: int, *, base: float, cap: float, rand=random.random) -> float:
    """min(cap, base * 2^(attempt-1)) with ±10 % jitter, never above the cap.

    `attempt` is the number of the attempt that just failed (1 for the first).
    Jitter spreads the retries of a burst that failed together, so a receiver
    coming back up is not hit by all of them in the same second.
    """
    delay = min(cap, base * 2 ** min(attempt - 1, 62))
    return min(cap, delay * (1 + JITTER * (2 * rand() - 1)))


# A target's own retry schedule (Target.retry_schedule): at most this many retries,
# each at most a week after the attempt before.
MAX_SCHEDULE = 50
MAX_SCHEDULED_DELAY = 7 * 86_400


def clean_schedule(schedule) -> list:
    """The schedule as stored, or ValidationError naming what is wrong with it."""
    from django.core.exceptions import ValidationError

    if schedule in (None, ""):
        return []
    if not isinstance(schedule, list):
        raise ValidationError("A retry schedule is a list of delays in seconds, e.g. [5, 60, 600].")
    if len(schedule) > MAX_SCHEDULE:
        raise ValidationError(f"At most {MAX_SCHEDULE} retries.")
    for n, delay in enumerate(schedule, 1):
        if (
            isinstance(delay, bool)
            or not isinstance(delay, int | float)
            or not 0 < delay <= MAX_SCHEDULED_DELAY
        ):
            raise ValidationError(
                f"Retry {n}: a delay is a number of seconds above 0 and at most "
                f"{MAX_SCHEDULED_DELAY} (a week), not {delay!r}."
            )
    return schedule


def scheduled_delay(schedule: list, attempt: int, retry_after, *, cap: float) -> float:
    """The schedule's delay after failed attempt `attempt` (1 for the first), or the
    receiver's Retry-After if longer (up to the cap). No jitter: the owner chose
    these times."""
    delay = float(schedule[attempt - 1])
    if retry_after is not None:
        delay = max(delay, min(cap, retry_after))
    return delay


def retry_delay(attempt, retry_after, *, base, cap, rand=random.random) -> float:
    """The backoff, or the receiver's Retry-After if longer, never above the cap."""
    delay = backoff_delay(attempt, base=base, cap=cap, rand=rand)
    if retry_after is not None:
        delay = max(delay, min(cap, retry_after))
    return delay

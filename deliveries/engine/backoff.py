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


def retry_delay(attempt, retry_after, *, base, cap, rand=random.random) -> float:
    """The backoff, or the receiver's Retry-After if longer, never above the cap."""
    delay = backoff_delay(attempt, base=base, cap=cap, rand=rand)
    if retry_after is not None:
        delay = max(delay, min(cap, retry_after))
    return delay

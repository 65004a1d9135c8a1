"""The engine's lease on its partitions: how long it may go on attempting without
hearing from PostgreSQL (DESIGN §13, docs/architecture.md "Leases and epochs").

A lock holder cannot know it still holds its lock: the lock connection may be cut
off, or the whole process frozen, while another engine takes over. So an engine
attempts only while its lease is valid: less than `seconds` since the *start* of
the last round trip on its lock connection that came back. Nothing has to notice
a silent connection for the lease to run out: it runs out by itself.

The clock is CLOCK_BOOTTIME, which keeps counting while the process is stopped
(SIGSTOP) and while the machine is suspended, unlike CLOCK_MONOTONIC: an engine
waking from any pause finds its lease expired, and checks again before it sends.
"""

import math
import threading
import time


def boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class Lease:
    """`valid()` is read by every worker before each attempt; `confirm()` and `end()`
    are called by the partitions thread alone."""

    def __init__(self, seconds: float | None, *, clock=boottime):
        # None: never runs out (SQLite: the flock is exact, no other engine exists).
        self.seconds = seconds
        self.clock = clock
        self._lock = threading.Lock()
        self._until = -math.inf

    @classmethod
    def forever(cls) -> "Lease":
        return cls(None)

    def confirm(self, started: float) -> None:
        """A round trip that started at clock time `started` came back."""
        if self.seconds is None:
            return
        with self._lock:
            self._until = max(self._until, started + self.seconds)

    def end(self) -> None:
        """The lock connection is gone: no attempt from now on."""
        with self._lock:
            self._until = -math.inf

    def valid(self) -> bool:
        return self.seconds is None or self.clock() < self._until

    def remaining(self) -> float:
        if self.seconds is None:
            return math.inf
        return max(0.0, self._until - self.clock())

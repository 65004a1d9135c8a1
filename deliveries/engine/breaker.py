"""Per-target circuit breaker for targets that retry (max_retries > 0).

closed ──5 consecutive failures──▶ open ──cooldown over──▶ half-open (one probe)
   ▲                                 ▲                          │
   └────────── probe succeeds ───────┼──────── probe fails ─────┘

While open (or while the probe is out), attempts are not made: the worker defers
the task to the time `allow()` returns, keeping ownership and not counting an
attempt. A dead receiver thus costs one request per cooldown, not one per delivery.
"""

import threading
import time


class CircuitBreaker:
    FAILURE_THRESHOLD = 5
    COOLDOWN = 30.0

    CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"

    def __init__(self, *, clock=time.monotonic, threshold=None, cooldown=None):
        self._clock = clock
        self.threshold = threshold or self.FAILURE_THRESHOLD
        self.cooldown = self.COOLDOWN if cooldown is None else cooldown
        self._lock = threading.Lock()
        self.state = self.CLOSED
        self.failures = 0
        self.opened_until = 0.0
        # Clock time the breaker first opened, kept through half-open probes that
        # fail; None while closed.
        self.open_since: float | None = None

    def allow(self) -> float | None:
        """None if an attempt may go now, else the clock time to try again."""
        return self.admit()[0]

    def admit(self) -> tuple[float | None, bool]:
        """As allow(), and whether this call took the half-open probe (which its
        caller must record() or abandon())."""
        with self._lock:
            if self.state == self.CLOSED:
                return None, False
            now = self._clock()
            if self.state == self.OPEN:
                if now < self.opened_until:
                    return self.opened_until, False
                self.state = self.HALF_OPEN
                return None, True
            # The probe is out: the others come back a cooldown later, by when its
            # result is known, rather than circling through the channel meanwhile.
            return now + self.cooldown, False

    def record(self, success: bool) -> str | None:
        """Count an attempt's outcome; return CLOSED or OPEN when the state changed
        to it (the engine then releases, or re-dates, the tasks that wait)."""
        with self._lock:
            if success:
                was_open = self.state != self.CLOSED
                self.state = self.CLOSED
                self.failures = 0
                self.open_since = None
                return self.CLOSED if was_open else None
            self.failures += 1
            if self.state == self.HALF_OPEN or (
                self.state == self.CLOSED and self.failures >= self.threshold
            ):
                self.state = self.OPEN
                now = self._clock()
                self.opened_until = now + self.cooldown
                if self.open_since is None:
                    self.open_since = now
                return self.OPEN
            return None

    def abandon(self) -> None:
        """The probe admit() handed out is not sent now (its rate-limit slot lies
        ahead, the lease ran out, the database failed): the next attempt probes
        instead. Only its holder calls this."""
        with self._lock:
            if self.state == self.HALF_OPEN:
                self.state = self.OPEN
                self.opened_until = self._clock()

    @property
    def is_open(self) -> bool:
        return self.state != self.CLOSED

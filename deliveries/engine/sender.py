"""Attempts in flight: HTTP attempts run as coroutines on the HTTP client's event
loop (targets/transport.py), not on the worker that prepared them.

A worker reserves room before it takes a task (`reserve`), prepares the attempt on
its own thread (the checks, the body, the signature: everything that reads the
database or costs CPU), and hands the request over (`send`); it is free at once.
When the answer (or the deadline) comes, the loop's thread only queues the
outcome: the completer thread (`run`) takes it through the engine's bookkeeping
(breaker, result to the writer, the target's gate), never the loop. So the loop
does nothing but I/O, the database is used from threads as Django wants, and the
engine's in-flight attempts are bounded by DELIVERY_INFLIGHT, not by threads.
"""

import itertools
import logging
import queue
import threading
import time

from deliveries.targets import transport

logger = logging.getLogger("deliveries.engine")


class Sender:
    # How often the completer looks up from its queue to see whether to stop.
    WAKE = 0.5

    def __init__(self, limit: int):
        self.limit = limit
        # Set by the runner: HTTP attempts go on the loop. Unset (steps driven
        # directly, by tests), the worker waits for its attempt itself.
        self.running = False
        self._room = threading.Semaphore(limit)
        self._done = queue.SimpleQueue()
        self._cond = threading.Condition()
        # Attempts sent and their completion not yet run: key -> when it was sent,
        # oldest first (keys only grow, and a dict keeps their order).
        self._started: dict[int, float] = {}
        self._keys = itertools.count()
        self._stop = threading.Event()

    def reserve(self, timeout: float) -> bool:
        """Room for one more attempt in flight, within `timeout` seconds; the caller
        either sends with it or gives it back (`unreserve`)."""
        return self._room.acquire(timeout=timeout)

    def unreserve(self) -> None:
        self._room.release()

    def send(self, request: transport.Request, then) -> None:
        """Send `request` with the room reserved; `then(outcome)` runs on the
        completer thread once it is answered, timed out or refused."""
        key = self.track()
        try:
            transport.client.start(request, lambda outcome: self._done.put((then, outcome, key)))
        except BaseException:
            self.untrack(key)
            raise

    def track(self) -> int:
        """Count something else in flight with the room reserved (a transform on its
        way to the worker processes): drain() waits for it, oldest() sees it. The
        caller untracks it, and gives the room back or sends with it."""
        key = next(self._keys)
        with self._cond:
            self._started[key] = time.monotonic()
        return key

    def untrack(self, key: int) -> None:
        with self._cond:
            del self._started[key]
            self._cond.notify_all()

    def in_flight(self) -> int:
        with self._cond:
            return len(self._started)

    def oldest(self) -> float | None:
        """When the longest-running attempt in flight was sent (time.monotonic), or
        None. Each attempt's deadline ends it on the loop: one older than any
        deadline means the loop itself is stuck (runner.Watchdog)."""
        with self._cond:
            return next(iter(self._started.values()), None)

    def run(self) -> None:
        """The completer: each outcome through `then`, until stop() and nothing is
        left in flight."""
        while True:
            try:
                then, outcome, key = self._done.get(timeout=self.WAKE)
            except queue.Empty:
                if self._stop.is_set() and self.in_flight() == 0:
                    return
                continue
            try:
                then(outcome)
            except Exception:
                logger.exception("an attempt's completion failed")
            finally:
                self._room.release()
                self.untrack(key)

    def drain(self, timeout: float) -> bool:
        """Wait until every attempt in flight has completed (graceful stop)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._started, timeout)

    def stop(self) -> None:
        self._stop.set()

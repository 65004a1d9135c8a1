"""Per-target rate limits: attempts per second, exact within the owning engine.

Each attempt reserves the next free slot of its target (slots 1/rate apart, the
first one now). A task whose slot is in the future goes to the retry scheduler
until then, owned and holding no worker, and is attempted when its slot comes
(the generic cell rate algorithm with no burst: over any span the target sees at
most rate * span + 1 attempts).
"""

import threading


class RateLimits:
    def __init__(self):
        self._lock = threading.Lock()
        self._next: dict[int, float] = {}  # target id -> its next free slot

    def reserve(self, target_id: int, rate: float, now: float) -> float:
        """Reserve the target's next slot; return its clock time (now or later)."""
        with self._lock:
            slot = max(now, self._next.get(target_id, now))
            self._next[target_id] = slot + 1.0 / rate
            return slot

    def forget_where(self, predicate) -> None:
        with self._lock:
            self._next = {t: slot for t, slot in self._next.items() if not predicate(t)}

    def forget(self, target_id: int) -> None:
        """The target's limit changed or it stopped: start afresh."""
        with self._lock:
            self._next.pop(target_id, None)

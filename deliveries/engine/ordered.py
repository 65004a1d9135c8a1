"""Ordered targets: one delivery at a time, in event order.

An ordered target's deliveries are never claimed as they come (intake, recovery
and the overflow drain skip them and note the target here). Instead intake reads
the target's head — its oldest unfinished delivery by (event received_at, event
id, id) — and claims that alone. The head holds the lane through its retries;
only when it is released (delivered, or failed and the target paused) is the next
head read: by the writer's thread as soon as the result commits (Engine.written),
or by the next intake pass. `begin` lets one thread read a target's head at a time,
and none while its head is in flight. So a target sees its events strictly in
order, and a head that fails for good stops the line instead of being skipped.
"""

import threading


class OrderedLanes:
    def __init__(self):
        self._lock = threading.Lock()
        self._waiting: set[int] = set()  # targets whose next head is to be read
        self._heads: dict[int, int] = {}  # target id -> the head delivery in flight
        # Targets whose head is being read: by the intake thread, or by the writer's
        # thread once the previous head's result committed (Engine.written).
        self._reading: set[int] = set()

    def note(self, target_id: int) -> None:
        """The target may have unfinished deliveries: read its head when free."""
        with self._lock:
            self._waiting.add(target_id)

    def waiting(self) -> list[int]:
        with self._lock:
            return [t for t in self._waiting if t not in self._heads and t not in self._reading]

    def begin(self, target_id: int) -> bool:
        """Read the target's next head, if nobody has it in flight or is reading it
        (then True: start() or end() follows)."""
        with self._lock:
            if target_id in self._heads or target_id in self._reading:
                return False
            self._reading.add(target_id)
            return True

    def start(self, target_id: int, delivery_id: int) -> None:
        with self._lock:
            self._reading.discard(target_id)
            self._heads[target_id] = delivery_id

    def end(self, target_id: int) -> None:
        """The read claimed no head."""
        with self._lock:
            self._reading.discard(target_id)

    def done(self, target_id: int, delivery_id: int) -> bool:
        """The task let go; True if it was its target's head (the next may go)."""
        with self._lock:
            if self._heads.get(target_id) != delivery_id:
                return False
            del self._heads[target_id]
            self._waiting.add(target_id)
            return True

    def forget_where(self, predicate) -> None:
        """Drop the lanes of the targets `predicate(target_id)` accepts."""
        with self._lock:
            self._waiting = {t for t in self._waiting if not predicate(t)}
            self._heads = {t: d for t, d in self._heads.items() if not predicate(t)}

    def forget(self, target_id: int) -> None:
        """Nothing to read now: no unfinished delivery, or the target is held."""
        with self._lock:
            self._waiting.discard(target_id)
            self._reading.discard(target_id)

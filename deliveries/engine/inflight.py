"""Which deliveries this engine process owns, and how many references hold each.

A delivery's row says `pending` from the moment it is stored until its outcome is
written. That one value covers four situations: never dispatched, waiting in the
channel, being attempted right now, and genuinely stranded by a dead process. No
column tells them apart, and an age bound cannot either: with a 10 000-task channel
in front of 10 workers, a perfectly healthy delivery can wait longer than any age
worth setting before its attempt even starts, and a sweep that trusts age sends it
twice. Only the engine knows which situation a row is in, and it knows exactly; this
set is where it writes that down. Recovery, intake and the retry scheduler
re-dispatch only what the set does not hold.

In-memory state is enough because a database admits one engine at a time (see
lock.py). What a dead process owned is in no successor's set, and the successor's
recovery run at start is what picks it up.

References are counted, not just recorded, because ownership outlives the holder
that took it: a failed attempt schedules its retry (a second reference) while the
worker still holds the first, so the delivery stays owned across the gap between the
worker letting go and the retry coming due. A plain set would have a moment in which
the row reads `retrying` and nobody owns it, and a recovery tick landing there would
send it again.

A freshly built set is ready to use, with no separate initialisation step: an engine
that forgot one would not refuse to re-dispatch anything, and the symptom would be
duplicate deliveries rather than an error anybody notices.
"""

import threading
from collections import Counter


class InflightSet:
    def __init__(self):
        self._lock = threading.Lock()
        self._refs = Counter()

    def retain(self, delivery_id: int) -> None:
        """Add a reference to a delivery the caller already owns. Cannot fail."""
        with self._lock:
            self._refs[delivery_id] += 1

    def retain_idle(self, delivery_id: int) -> bool:
        """Take the first reference; False if the engine already owns the delivery.

        This is what makes two claimants (intake and recovery, say) mutually
        exclusive rather than merely atomic: only one of them gets True.
        """
        with self._lock:
            if self._refs[delivery_id] > 0:
                return False
            self._refs[delivery_id] = 1
            return True

    def release(self, delivery_id: int) -> None:
        """Drop one reference; after the last, the delivery may be claimed again."""
        with self._lock:
            remaining = self._refs[delivery_id] - 1
            if remaining > 0:
                self._refs[delivery_id] = remaining
            else:
                del self._refs[delivery_id]

    def owns(self, delivery_id: int) -> bool:
        with self._lock:
            return self._refs.get(delivery_id, 0) > 0

    def held(self) -> int:
        """How many deliveries are owned.

        It exists so tests can assert that ownership is released rather than
        leaked: a reference never dropped hides its delivery from every sweep for
        the life of the process, the one way this mechanism fails silently.
        """
        with self._lock:
            return len(self._refs)

"""Per-target limits: how many of a target's deliveries the engine holds in memory
(`Target.max_queue_size`) and how many workers it may occupy at once
(DELIVERY_TARGET_CONCURRENCY, invariant 7 in docs/architecture.md).

A worker that picks up a task whose target already has its share of attempts
running parks the task here, still owned, and moves on to other targets. A worker
that finishes one of that target's attempts takes the parked task next, inheriting
the slot; an attempt that completes in flight (sender.py) frees its slot and puts
the parked task back on the channel. A slow or dead target therefore holds at most
its share of attempts, and its excess waits.
"""

import threading
from collections import Counter, defaultdict, deque


class TargetGate:
    def __init__(self, *, concurrency: int):
        self.concurrency = concurrency
        self._lock = threading.Lock()
        self._held = Counter()
        self._running = Counter()
        self._parked: dict[int, deque] = defaultdict(deque)

    def admit(self, target_id: int, cap: int) -> bool:
        """Count one more held task for the target, unless it is at its cap."""
        with self._lock:
            if self._held[target_id] >= cap:
                return False
            self._held[target_id] += 1
            return True

    def discharge(self, target_id: int) -> int:
        """The engine let go of one of the target's tasks; return how many remain."""
        with self._lock:
            remaining = self._held[target_id] - 1
            if remaining > 0:
                self._held[target_id] = remaining
            else:
                del self._held[target_id]
            return max(remaining, 0)

    def held(self, target_id: int) -> int:
        with self._lock:
            return self._held.get(target_id, 0)

    def held_targets(self) -> list[int]:
        """The targets of which the engine holds any task."""
        with self._lock:
            return list(self._held)

    def enter(self, task) -> bool:
        """Take a worker slot for the task's target, or park the task and say False."""
        with self._lock:
            if self._running[task.target_id] < self.concurrency:
                self._running[task.target_id] += 1
                return True
            self._parked[task.target_id].append(task)
            return False

    def leave(self, target_id: int):
        """Give the slot to the target's next parked task (returned), or free it."""
        with self._lock:
            task = self._unpark(target_id)
            if task is None:
                self._free(target_id)
            return task

    def vacate(self, target_id: int):
        """Free the slot, and unpark the target's next task (returned) to enter
        again: no task holds a slot outside the worker that attempts it."""
        with self._lock:
            self._free(target_id)
            return self._unpark(target_id)

    def _free(self, target_id: int) -> None:
        self._running[target_id] -= 1
        if self._running[target_id] <= 0:
            del self._running[target_id]

    def _unpark(self, target_id: int):
        parked = self._parked.get(target_id)
        if not parked:
            return None
        task = parked.popleft()
        if not parked:
            del self._parked[target_id]
        return task

    def drain_parked(self, target_id: int | None = None, *, where=None) -> list:
        """Take the parked tasks out: of one target, of the targets `where(target_id)`
        accepts, or of all."""
        with self._lock:
            if target_id is not None:
                return list(self._parked.pop(target_id, ()))
            keys = [t for t in self._parked if where is None or where(t)]
            return [task for t in keys for task in self._parked.pop(t)]

"""Retries that are not due yet: one thread and one heap, not a timer per retry.

Every scheduled task holds a reference in the inflight set, so the delivery stays
owned between a failed attempt and the next one. At its due time the task goes back
on the channel with that reference. `take()` lifts tasks out early: a successful
breaker probe releases the tasks that waited for it, a "retry now" hurries one,
and a paused or deleted target's tasks are dropped.
"""

import heapq
import itertools
import threading
import time

# An entry is [due, seq, task]; a taken entry keeps its place in the heap with
# task None and is skipped when it surfaces (removing from a heap's middle costs
# a rebuild).
_DUE, _SEQ, _TASK = 0, 1, 2


class RetryScheduler:
    def __init__(self, *, channel, inflight, clock=time.monotonic):
        self._channel = channel
        self._inflight = inflight
        self._clock = clock
        self._heap: list = []
        self._entries: dict[int, list] = {}  # delivery id -> its live entry
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False

    def schedule(self, task, due: float) -> bool:
        """Hold `task` until clock time `due`; False (and no reference) once stopped."""
        with self._cond:
            if self._stopped:
                return False
            self._inflight.retain(task.delivery_id)
            entry = [due, next(self._seq), task]
            self._entries[task.delivery_id] = entry
            heapq.heappush(self._heap, entry)
            self._cond.notify()
            return True

    def pending(self) -> int:
        with self._cond:
            return len(self._entries)

    def scheduled(self) -> list:
        """(due, task) for every waiting task, soonest first."""
        with self._cond:
            return [(e[_DUE], e[_TASK]) for e in sorted(self._entries.values())]

    def take(self, predicate) -> list:
        """Lift out every waiting task `predicate(task)` accepts, with its reference."""
        with self._cond:
            taken = [e for e in self._entries.values() if predicate(e[_TASK])]
            return [self._lift(entry) for entry in taken]

    def take_ids(self, delivery_ids) -> list:
        """Lift out the waiting tasks of these deliveries, with their references."""
        with self._cond:
            entries = [self._entries.get(d) for d in delivery_ids]
            return [self._lift(entry) for entry in entries if entry is not None]

    def _lift(self, entry):
        task = entry[_TASK]
        del self._entries[task.delivery_id]
        entry[_TASK] = None
        return task

    def release_due(self) -> int:
        """Move every due task to the channel; return how many moved."""
        with self._cond:
            return self._release(self._clock())

    def run(self) -> None:
        with self._cond:
            while not self._stopped:
                now = self._clock()
                self._release(now)
                timeout = self._heap[0][_DUE] - now if self._heap else None
                self._cond.wait(timeout)

    def _release(self, now) -> int:
        moved = 0
        while self._heap and self._heap[0][_DUE] <= now:
            _, _, task = heapq.heappop(self._heap)
            if task is None:
                continue  # taken early
            del self._entries[task.delivery_id]
            self._channel.put(task)
            moved += 1
        return moved

    def stop(self) -> list:
        """Stop and hand back every task still waiting (each with its reference)."""
        with self._cond:
            self._stopped = True
            tasks = [entry[_TASK] for entry in self._entries.values()]
            self._entries.clear()
            self._heap.clear()
            self._cond.notify_all()
            return tasks

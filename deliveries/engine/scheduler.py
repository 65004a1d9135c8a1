"""Retries that are not due yet: one thread and one heap, not a timer per retry.

Every scheduled task holds a reference in the inflight set, so the delivery stays
owned between a failed attempt and the next one. At its due time the task goes back
on the channel with that reference.
"""

import heapq
import itertools
import threading
import time


class RetryScheduler:
    def __init__(self, *, channel, inflight, clock=time.monotonic):
        self._channel = channel
        self._inflight = inflight
        self._clock = clock
        self._heap: list = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False

    def schedule(self, task, due: float) -> bool:
        """Hold `task` until clock time `due`; False (and no reference) once stopped."""
        with self._cond:
            if self._stopped:
                return False
            self._inflight.retain(task.delivery_id)
            heapq.heappush(self._heap, (due, next(self._seq), task))
            self._cond.notify()
            return True

    def pending(self) -> int:
        with self._cond:
            return len(self._heap)

    def scheduled(self) -> list:
        """(due, task) for every waiting task, soonest first."""
        with self._cond:
            return [(due, task) for due, _, task in sorted(self._heap)]

    def release_due(self) -> int:
        """Move every due task to the channel; return how many moved."""
        moved = 0
        with self._cond:
            now = self._clock()
            while self._heap and self._heap[0][0] <= now:
                _, _, task = heapq.heappop(self._heap)
                self._channel.put(task)
                moved += 1
        return moved

    def run(self) -> None:
        with self._cond:
            while not self._stopped:
                now = self._clock()
                while self._heap and self._heap[0][0] <= now:
                    _, _, task = heapq.heappop(self._heap)
                    self._channel.put(task)
                timeout = self._heap[0][0] - now if self._heap else None
                self._cond.wait(timeout)

    def stop(self) -> list:
        """Stop and hand back every task still waiting (each with its reference)."""
        with self._cond:
            self._stopped = True
            tasks = [task for _, _, task in self._heap]
            self._heap.clear()
            self._cond.notify_all()
            return tasks

"""The channel between claimants and workers.

Its capacity is enforced where deliveries are claimed, not where tasks are put:
intake and recovery read no more rows than `room()` says, so a full channel means
rows wait in the database (back-pressure) and nothing is ever dropped. The retry
scheduler puts tasks it already holds in memory without asking, so it can never
block behind the claimants or deadlock with the workers.
"""

import queue


class Channel:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._queue = queue.SimpleQueue()

    def room(self) -> int:
        return max(0, self.capacity - self._queue.qsize())

    def depth(self) -> int:
        return self._queue.qsize()

    def put(self, task) -> None:
        self._queue.put(task)

    def get(self, timeout: float):
        """The next task, or None after `timeout` seconds."""
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def drain(self) -> list:
        tasks = []
        while True:
            try:
                tasks.append(self._queue.get_nowait())
            except queue.Empty:
                return tasks

    def take(self, predicate) -> list:
        """Lift out the waiting tasks `predicate(task)` accepts; the rest stay, in
        their order (tasks put meanwhile may come before them)."""
        taken, kept = [], []
        for task in self.drain():
            (taken if predicate(task) else kept).append(task)
        for task in kept:
            self._queue.put(task)
        return taken

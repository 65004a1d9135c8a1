"""Group commit on SQLite: concurrent writers in one process share one transaction.

SQLite has one writer at a time and an fsync per COMMIT; a web worker's threads
storing events one transaction each would queue for both. The inbound path
(deliveries.ingest) runs each event's statements through `group_commit.run`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from django.db import OperationalError, connection, transaction

T = TypeVar("T")


class _Job:
    """One call waiting in a group commit."""

    __slots__ = ("done", "error", "lead", "result", "store")

    def __init__(self, store: Callable[[], T]):
        self.store = store
        self.done = threading.Event()
        self.lead = False
        self.result: T | None = None
        self.error: BaseException | None = None

    def outcome(self) -> T:
        if self.error is not None:
            raise self.error
        return self.result


class GroupCommit:
    """Concurrent inbound events in one process share one SQLite transaction: one
    writer-lock turn and one fsync for all of them.

    The first caller leads: it begins a transaction (waiting for the writer lock),
    takes every event waiting by then (up to `limit`), stores each in a savepoint
    of that transaction on its own connection (an event alone, in the transaction
    itself), commits, and wakes the others with their own outcome; then it hands
    the lead to the first caller that arrived meanwhile. Each caller still
    returns only after COMMIT of its own rows (invariant 1); an event whose
    statements fail rolls back its savepoint and fails its own request alone; a
    failed COMMIT fails every event of the group, none of which is stored.
    """

    def __init__(self, limit: int = 64):
        self.limit = limit
        # Groups taken (in a transaction begun), for the tests and the curious.
        self.groups = 0
        self._lock = threading.Lock()
        self._waiting: list[_Job] = []
        self._leading = False

    def run(self, store: Callable[[], T]) -> T:
        job = _Job(store)
        with self._lock:
            self._waiting.append(job)
            job.lead = not self._leading
            self._leading = True
        if not job.lead:
            job.done.wait()
            if not job.lead:
                return job.outcome()
        group: list[_Job] = []
        committed = False
        try:
            committed = self._commit(group)
        finally:
            with self._lock:
                if not group:
                    # BEGIN failed (or was interrupted) before the group was taken:
                    # those it would have taken share its outcome.
                    self._take(group)
                if self._waiting:
                    following = self._waiting[0]
                    following.lead = True
                    following.done.set()
                else:
                    self._leading = False
            for other in group:
                if not committed and other.error is None:
                    # The leader was interrupted mid-group: nothing is known stored.
                    other.result = None
                    other.error = RuntimeError("the group commit was interrupted")
                if other is not job:
                    other.done.set()
        return job.outcome()

    def _take(self, group: list[_Job]) -> None:
        """Move the first `limit` waiting jobs (the leader's own first) into group;
        called with self._lock held."""
        group.extend(self._waiting[: self.limit])
        del self._waiting[: self.limit]

    def _commit(self, group: list[_Job]) -> bool:
        """Begin a transaction, take the group, store it; whether it committed. If it
        did not, every job holds an error and no result.

        The group is taken once BEGIN holds the writer lock, not before: while
        another process writes, the leader waits for its turn and every event that
        arrives meanwhile joins this group, rather than the next (bench/RESULTS.md
        has how much larger the groups are for it).
        """
        committed = []
        try:
            with transaction.atomic():
                with self._lock:
                    self._take(group)
                self.groups += 1
                if len(group) == 1:
                    # Alone, an event has no neighbour for a savepoint to protect:
                    # its failure rolls back the transaction, which holds nothing
                    # else (the except below). Without one it spares the SAVEPOINT
                    # and RELEASE and SQLite's statement journal of its pages.
                    group[0].result = group[0].store()
                else:
                    self._store_each(group)
                # Runs only after COMMIT succeeded: Django rolls back without a word
                # when a job's failure left the transaction unusable (SQLite may
                # abandon the whole transaction on a full disk), or when the
                # connection was lost in it.
                transaction.on_commit(lambda: committed.append(True), robust=True)
            if not committed:
                raise OperationalError("the group's transaction was rolled back")
        except Exception as exc:  # BEGIN, COMMIT, or a silent rollback: nothing stored
            if not group:
                with self._lock:
                    self._take(group)
            for job in group:
                job.result, job.error = None, job.error or exc
            return False
        return True

    @staticmethod
    def _store_each(group: list[_Job]) -> None:
        """Store each job of the group in a savepoint of the transaction: a failing
        one rolls back its own and holds its error."""
        lost = None
        for job in group:
            if lost is not None:
                job.error = lost
                continue
            try:
                with transaction.atomic():
                    job.result = job.store()
            except Exception as exc:
                job.error = exc
                if connection.needs_rollback:
                    # Not even the job's savepoint could be rolled back: the
                    # transaction itself is gone (SQLite abandons it when the
                    # disk fills mid-statement). The rest of the group cannot
                    # be stored in it and fails with the database's error, as
                    # its leader does, rather than Django's complaint about a
                    # broken transaction.
                    lost = (
                        exc
                        if isinstance(exc, OperationalError)
                        else OperationalError(f"the group's transaction was lost: {exc}")
                    )


group_commit = GroupCommit()

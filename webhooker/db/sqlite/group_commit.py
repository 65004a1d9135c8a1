"""Group commit on SQLite: concurrent writers in one process share one transaction.

SQLite has one writer at a time and an fsync per COMMIT; a web worker's threads
storing events one transaction each would queue for both. The inbound path
(deliveries.ingest) runs each event's statements through `group_commit.run`.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TypeVar

from django.db import OperationalError, transaction

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
    takes every event waiting by then (up to `limit`), stores them in that
    transaction on its own connection, commits, and wakes the others with their
    own outcome; then it hands the lead to the first caller that arrived
    meanwhile. Each caller still returns only after COMMIT of its own rows
    (invariant 1); an event whose statements fail fails its own request alone
    (the rest of the group is stored again without it, `_commit`); a failed
    COMMIT fails every event of the group, none of which is stored.
    """

    def __init__(self, limit: int = 64):
        self.limit = limit
        # Groups taken (in a transaction begun), for the tests and the curious.
        self.groups = 0
        self._lock = threading.Lock()
        self._waiting: list[_Job] = []
        self._leading = False

    def run(self, store: Callable[[], T]) -> T:
        """`store()`'s result once the transaction it ran in has committed, or its
        error. `store` may run more than once (a neighbour's failure rolls its
        first run back): it must do nothing a rollback does not undo, as
        `transaction.on_commit` callbacks are undone."""
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
        """Begin a transaction, take the group, store it; whether every job holds
        its outcome (False: none is stored, and each holds an error).

        The group is taken once BEGIN holds the writer lock, not before: while
        another process writes, the leader waits for its turn and every event that
        arrives meanwhile joins this group, rather than the next (bench/RESULTS.md
        has how much larger the groups are for it).

        The jobs run in the transaction itself, one after another, with no
        savepoint each: inside one, SQLite journals every page a statement
        changes, which cost the inbound path more than the savepoints' own
        statements. A job that fails keeps its error, the transaction is rolled
        back whole, and the rest of the group is stored again in a new one; each
        round leaves one job out, so a group of n ends within n rounds.
        """
        left: list[_Job] | None = None
        while True:
            committed, failed = [], None
            try:
                with transaction.atomic():
                    if left is None:
                        with self._lock:
                            self._take(group)
                        self.groups += 1
                        left = list(group)
                    failed = _store_all(left)
                    if failed is not None:
                        transaction.set_rollback(True)
                    else:
                        # Runs only after COMMIT succeeded: Django rolls back
                        # without a word when a job left the transaction unusable
                        # (SQLite may abandon it on a full disk), or when the
                        # connection was lost in it.
                        transaction.on_commit(
                            functools.partial(committed.append, True), robust=True
                        )
                if failed is None and not committed:
                    raise OperationalError("the group's transaction was rolled back")
            except Exception as exc:  # BEGIN, COMMIT, or a silent rollback: nothing stored
                if not group:
                    with self._lock:
                        self._take(group)
                for job in group if left is None else left:
                    job.result, job.error = None, job.error or exc
                return False
            if failed is None:
                return True
            left.remove(failed)
            if not left:
                return True


def _store_all(jobs: list[_Job]) -> _Job | None:
    """Store each job in the caller's transaction until one fails: that one, with
    its error (the caller rolls back), or None."""
    for job in jobs:
        job.result = job.error = None
        try:
            job.result = job.store()
        except Exception as exc:
            job.result, job.error = None, exc
            return job
    return None


group_commit = GroupCommit()

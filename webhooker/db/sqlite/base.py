"""Django's SQLite backend, with writers queued on a file lock instead of retrying.

SQLite admits one writer at a time. When a second writer finds the database
locked, SQLite's busy handler sleeps and polls with growing pauses (1, 2, 5, 10 …
100 ms), so a dozen request threads plus the engine spend their time asleep while
the lock sits free. Here every write transaction (Django's BEGIN IMMEDIATE) first
takes an exclusive flock on a file beside the database, held until COMMIT or
ROLLBACK: a waiting writer is woken by the kernel the moment the lock is released,
across every process on the host. The busy timeout stays as the backstop for
writes outside a transaction.

The throughput is the same with the queue as without; the tail latency is what it
earns (bench/RESULTS.md, "Figures that were in code comments").

The wait for the lock is bounded by the database's "timeout" option, like
SQLite's own busy wait: a writer stopped while holding it (SIGSTOP, a debugger)
costs every other writer that long, then "database is locked", which the inbound
view answers with 503. For a request the bound counts from its arrival
(`request_context.request_arrived`, set by the server), not from when a thread takes it up:
requests queued behind threads that are themselves waiting would otherwise wait
the whole bound each in turn, the queue's last a few minutes.

A new file is given incremental auto-vacuum here, before anything else touches it
(retention gives freed pages back with it), and only a new file: `PRAGMA
auto_vacuum=...` on every connection, as it was, waits for the writer lock, so a
web worker's or an admin page's first connection waited behind any write - up to
the busy timeout behind a stalled one - where WAL readers wait for nothing.
"""

import fcntl
import functools
import os
import queue
import sqlite3
import threading
import time

from django.db import OperationalError
from django.db.backends.sqlite3 import base

from webhooker.request_context import request_arrived


class CursorWrapper(base.SQLiteCursorWrapper):
    """Django's SQLite cursor, converting a statement's "%s" placeholders to
    SQLite's "?" once per distinct text instead of by a regex on every execute:
    the same few statements run all day, and on the inbound path the conversion
    cost a good part of what SQLite spends running them."""

    def convert_query(self, query, *, param_names=None):
        if param_names is None:
            return _qmark(query)
        return super().convert_query(query, param_names=param_names)


@functools.lru_cache(maxsize=1024)
def _qmark(query: str) -> str:
    return base.SQLiteCursorWrapper.convert_query(None, query)


class DatabaseWrapper(base.DatabaseWrapper):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._writer_fd = None
        self._waiter = None
        self._writing = False

    def create_cursor(self, name=None):
        return self.connection.cursor(factory=CursorWrapper)

    def get_new_connection(self, conn_params):
        if not self.is_in_memory_db():
            _create_with_incremental_vacuum(self.settings_dict["NAME"])
        return super().get_new_connection(conn_params)

    def _writer_lock_fd(self):
        if self._writer_fd is None:
            path = f"{self.settings_dict['NAME']}.writer-lock"
            self._writer_fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        return self._writer_fd

    def _take_writer(self):
        fd = self._writer_lock_fd()
        if self._waiter is None or not self._waiter.busy:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
        if self._waiter is None:
            self._waiter = _Waiter(fd)
        timeout = self.settings_dict["OPTIONS"].get("timeout", 5)
        arrived = request_arrived.get()
        wait = timeout if arrived is None else timeout - (time.monotonic() - arrived)
        if wait <= 0 or not self._waiter.take(wait):
            since = "" if arrived is None else " of the request's arrival"
            raise OperationalError(
                f"database is locked (no writer turn within {timeout:g} s{since})"
            )

    def _release_writer(self):
        if self._writing:
            self._writing = False
            fcntl.flock(self._writer_fd, fcntl.LOCK_UN)

    def _start_transaction_under_autocommit(self):
        if self.is_in_memory_db():
            return super()._start_transaction_under_autocommit()
        self._take_writer()
        self._writing = True
        try:
            super()._start_transaction_under_autocommit()
        except BaseException:
            self._release_writer()
            raise

    def _commit(self):
        try:
            return super()._commit()
        finally:
            self._release_writer()

    def _rollback(self):
        try:
            return super()._rollback()
        finally:
            self._release_writer()

    def _close(self):
        try:
            return super()._close()
        finally:
            self._release_writer()
            if self._waiter is not None:
                self._waiter.stop()
                self._waiter = None
            if self._writer_fd is not None:
                os.close(self._writer_fd)
                self._writer_fd = None


def _create_with_incremental_vacuum(path) -> None:
    """Give a database file that does not exist yet (or is empty) incremental
    auto-vacuum, which SQLite accepts only before the first table, then WAL, whose
    switch writes the file's header and so keeps the setting for the connections
    that create the tables (deliveries/retention.py gives freed pages back)."""
    if os.path.exists(path) and os.path.getsize(path) > 0:
        return
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        conn.execute("PRAGMA journal_mode=WAL")
    finally:
        conn.close()


class _Waiter:
    """Waits in a blocking flock on a thread of its own, so that the connection's
    thread can stop waiting after a timeout: flock itself has none.

    It holds a duplicate of the lock file's descriptor (the same open file, so the
    same lock), which stays valid however the connection closes its own. A turn
    that comes after its caller gave up is released at once.
    """

    def __init__(self, fd):
        self._fd = os.dup(fd)
        self._requests = queue.SimpleQueue()
        # Turns asked for and not yet settled; while any is, the connection must
        # not take the lock itself: flock on the same open file would "succeed"
        # and the abandoned turn's release would then drop the caller's lock.
        self.busy = 0
        self._busy_lock = threading.Lock()
        threading.Thread(target=self._run, name="sqlite-writer-wait", daemon=True).start()

    def take(self, timeout: float) -> bool:
        turn = _Turn()
        with self._busy_lock:
            self.busy += 1
        self._requests.put(turn)
        turn.done.wait(timeout)
        with turn.lock:
            if turn.granted:
                return True
            turn.abandoned = True
            return False

    def stop(self):
        self._requests.put(None)

    def _run(self):
        try:
            while (turn := self._requests.get()) is not None:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
                with turn.lock:
                    if turn.abandoned:
                        fcntl.flock(self._fd, fcntl.LOCK_UN)
                    else:
                        turn.granted = True
                with self._busy_lock:
                    self.busy -= 1
                turn.done.set()
        finally:
            os.close(self._fd)


class _Turn:
    __slots__ = ("abandoned", "done", "granted", "lock")

    def __init__(self):
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.granted = False
        self.abandoned = False

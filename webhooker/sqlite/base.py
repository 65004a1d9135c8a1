"""Django's SQLite backend, with writers queued on a file lock instead of retrying.

SQLite admits one writer at a time. When a second writer finds the database
locked, SQLite's busy handler sleeps and polls with growing pauses (1, 2, 5, 10 …
100 ms), so a dozen gunicorn threads plus the engine spend their time asleep while
the lock sits free. Here every write transaction (Django's BEGIN IMMEDIATE) first
takes an exclusive flock on a file beside the database, held until COMMIT or
ROLLBACK: a waiting writer is woken by the kernel the moment the lock is released,
across every process on the host. The busy timeout stays as the backstop for
writes outside a transaction.
"""

import fcntl
import os

from django.db.backends.sqlite3 import base


class DatabaseWrapper(base.DatabaseWrapper):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._writer_fd = None
        self._writing = False

    def _writer_lock_fd(self):
        if self._writer_fd is None:
            path = f"{self.settings_dict['NAME']}.writer-lock"
            self._writer_fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        return self._writer_fd

    def _release_writer(self):
        if self._writing:
            self._writing = False
            fcntl.flock(self._writer_fd, fcntl.LOCK_UN)

    def _start_transaction_under_autocommit(self):
        if self.is_in_memory_db():
            return super()._start_transaction_under_autocommit()
        fcntl.flock(self._writer_lock_fd(), fcntl.LOCK_EX)
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
            if self._writer_fd is not None:
                os.close(self._writer_fd)
                self._writer_fd = None

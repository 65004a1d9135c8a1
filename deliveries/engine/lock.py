"""SQLite: one engine per data directory, the flock that makes its inflight set exact.

An exclusive flock on DATA_DIR/rundelivery.lock, released by the kernel when the
process dies, however it dies: no stale lock to clean up. On PostgreSQL engines
share the database by partitions, each owned through a session advisory lock on the
engine's lock connection (partitions.py); there the file lock does not apply, and
several engines may share a host and a DATA_DIR.
"""

import fcntl
import os

from django.db import connections


class EngineLocked(Exception):
    """Another rundelivery holds the lock; the command exits non-zero with this text."""


class EngineLock:
    def __init__(self, data_dir):
        self.path = os.path.join(str(data_dir), "rundelivery.lock")
        self._fd = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise EngineLocked(
                f"another rundelivery is running (pid {holder}, lock {self.path})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def open_raw_connection(using="default"):
    """A psycopg connection of its own (autocommit), outside Django's pool."""
    import psycopg

    params = connections[using].get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
        params.pop(key, None)
    # Keepalives notice a vanished server within seconds instead of the kernel's
    # two hours (partitions.PartitionManager sets the server's side too).
    params.setdefault("keepalives", 1)
    params.setdefault("keepalives_idle", 5)
    params.setdefault("keepalives_interval", 2)
    params.setdefault("keepalives_count", 3)
    return psycopg.connect(**params, autocommit=True)

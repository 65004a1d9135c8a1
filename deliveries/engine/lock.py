"""One engine per database (invariant 3): what makes the in-memory inflight set exact.

An exclusive flock on DATA_DIR/rundelivery.lock guards the host; on PostgreSQL a
session-level advisory lock, held on a connection of its own for the life of the
process, guards every host sharing the database. Both are released by the kernel
or the server when the process dies, however it dies: no stale lock to clean up.
"""

import fcntl
import os

from django.db import connections

# pg_advisory_lock key: a fixed 64-bit number naming "webhooker rundelivery".
ADVISORY_KEY = 0x77656268_6F6F6B31


class EngineLocked(Exception):
    """Another rundelivery holds the lock; the command exits non-zero with this text."""


class EngineLock:
    def __init__(self, data_dir, *, using="default"):
        self.path = os.path.join(str(data_dir), "rundelivery.lock")
        self.using = using
        self._fd = None
        self._pg = None

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
        if connections[self.using].vendor == "postgresql":
            try:
                self._acquire_advisory()
            except Exception:
                self.release()
                raise

    def _acquire_advisory(self) -> None:
        conn = open_raw_connection(self.using)
        got = conn.execute("SELECT pg_try_advisory_lock(%s)", (ADVISORY_KEY,)).fetchone()[0]
        if not got:
            holder = conn.execute(
                "SELECT pid, hostname FROM deliveries_enginestatus "
                "WHERE name = 'default' AND stopped_at IS NULL"
            ).fetchone()
            conn.close()
            who = f"pid {holder[0]} on {holder[1] or 'another host'}" if holder else "unknown pid"
            raise EngineLocked(f"another rundelivery holds this database's engine lock ({who})")
        self._pg = conn

    def alive(self) -> bool:
        """Whether the advisory lock's connection (and so the lock) still stands."""
        if self._pg is None:
            return True
        try:
            self._pg.execute("SELECT 1")
        except Exception:
            return False
        return True

    def release(self) -> None:
        if self._pg is not None:
            try:
                self._pg.close()
            finally:
                self._pg = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def open_raw_connection(using="default"):
    """A psycopg connection of its own (autocommit), outside Django's pool."""
    import psycopg

    params = connections[using].get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
        params.pop(key, None)
    # Keepalives notice a silently dropped connection (and so a lost lock) within
    # about a minute instead of the kernel's two hours.
    params.setdefault("keepalives", 1)
    params.setdefault("keepalives_idle", 30)
    params.setdefault("keepalives_interval", 10)
    params.setdefault("keepalives_count", 3)
    return psycopg.connect(**params, autocommit=True)

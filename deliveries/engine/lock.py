"""SQLite: one engine per data directory, the flock that makes its inflight set exact.

An exclusive flock on DATA_DIR/rundelivery.lock, released by the kernel when the
process dies, however it dies: no stale lock to clean up. On PostgreSQL engines
share the database by partitions, each owned through a session advisory lock on the
engine's lock connection (partitions.py); there the file lock does not apply, and
several engines may share a host and a DATA_DIR.
"""

import contextlib
import fcntl
import os
import socket
import threading

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


def open_raw_connection(using="default", *, deadline: float | None = None):
    """A psycopg connection of its own (autocommit), outside Django's pool.

    `deadline` (seconds) bounds every round trip on it: data the server does not
    acknowledge within it fails the connection (tcp_user_timeout), and so does a
    statement running longer on the server. The lock connection has one: a cut-off
    engine learns its connection is gone within its lease, not after the kernel's
    fifteen minutes of retransmissions.
    """
    import psycopg

    params = connections[using].get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
        params.pop(key, None)
    # Keepalives notice a vanished server within seconds instead of the kernel's
    # two hours (partition_manager.PartitionManager sets the server's side too).
    params.setdefault("keepalives", 1)
    params.setdefault("keepalives_idle", 5)
    params.setdefault("keepalives_interval", 2)
    params.setdefault("keepalives_count", 3)
    if deadline is None:
        return psycopg.connect(**params, autocommit=True)
    params["tcp_user_timeout"] = int(deadline * 1000)
    params["connect_timeout"] = max(2, int(deadline * 2))
    options = params.get("options", "")
    params["options"] = f"{options} -c statement_timeout={int(deadline * 1000)}".strip()
    return BoundedConnection(psycopg.connect(**params, autocommit=True), deadline)


class BoundedConnection:
    """A psycopg connection whose every `execute` ends within `deadline` seconds.

    The kernel's timeouts cover a peer that stops acknowledging; not a path that
    acknowledges and never answers (a proxy, a load balancer, a server process
    that is itself stopped). Past the deadline a timer shuts the socket down, so
    the call fails and the caller learns its connection is gone.
    """

    def __init__(self, conn, deadline: float):
        self.conn = conn
        self.deadline = deadline
        # Held while the socket is shut down and while the connection closes, and
        # to mark a call finished: a late timer never touches a finished call's
        # socket, nor a descriptor the connection closed and the process reused.
        self._lock = threading.Lock()

    def execute(self, *args, **kwargs):
        call = {"done": False}
        timer = threading.Timer(self.deadline, self._abort, args=(call,))
        timer.daemon = True
        timer.start()
        try:
            return self.conn.execute(*args, **kwargs)
        finally:
            with self._lock:
                call["done"] = True
            timer.cancel()

    def _abort(self, call) -> None:
        with self._lock:
            if call["done"] or self.conn.closed:
                return
            with contextlib.suppress(Exception):
                sock = socket.socket(fileno=os.dup(self.conn.pgconn.socket))
                with sock:
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with self._lock:
            self.conn.close()

    def __getattr__(self, name):
        return getattr(self.conn, name)

"""The wake hint from the web processes to the engine
(docs/architecture.md, Processes and data flow).

The committed rows are the message; the hint only shortens the engine's wait, so
every failure to send it is ignored. On PostgreSQL it is a NOTIFY, which the server
delivers at COMMIT and only then, and which reaches an engine on another host. On
SQLite it is a datagram to a Unix socket the engine binds in DATA_DIR.
"""

import contextlib
import functools
import socket
import threading

from django.conf import settings
from django.db import DatabaseError, transaction

CHANNEL = "webhooker_deliveries"
SOCKET_NAME = "rundelivery.sock"
# sun_path holds 108 bytes on Linux, including the terminating NUL.
MAX_SOCKET_PATH = 107

_local = threading.local()


def socket_path() -> str:
    return _socket_path(settings.DATA_DIR)


@functools.lru_cache(maxsize=8)
def _socket_path(data_dir) -> str:
    return str(data_dir / SOCKET_NAME)


def notify_on_commit(connection) -> None:
    """Arrange for the engine to be woken once the current transaction commits."""
    if connection.vendor == "postgresql":
        # In a transaction the NOTIFY is delivered at its COMMIT, and its failure
        # fails the transaction (which could not go on anyway). In autocommit what
        # it wakes for is committed already, and must not turn into an error
        # because the hint could not be sent.
        ignored = () if connection.in_atomic_block else DatabaseError
        with contextlib.suppress(ignored), connection.cursor() as cursor:
            cursor.execute(f"NOTIFY {CHANNEL}")
    else:
        # robust: nothing raised after COMMIT may turn a stored event into an error.
        transaction.on_commit(send_datagram, using=connection.alias, robust=True)


def send_datagram() -> None:
    path = socket_path()
    if len(path.encode()) > MAX_SOCKET_PATH:
        return
    sock = getattr(_local, "sock", None)
    if sock is None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        _local.sock = sock
    # No engine listening (ENOENT, ECONNREFUSED) or its buffer full (EAGAIN):
    # the engine's fallback poll will find the rows.
    with contextlib.suppress(OSError):
        sock.sendto(b"1", path)

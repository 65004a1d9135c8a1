"""The wake hint from the web processes to the engine
(docs/architecture.md, Processes and data flow).

The committed rows are the message; the hint only shortens the engine's wait, so
every failure to send it is ignored. On PostgreSQL it is a NOTIFY, which the server
delivers at COMMIT and only then, and which reaches an engine on another host. On
SQLite it is a datagram to a Unix socket the engine binds in DATA_DIR.
"""

import contextlib
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
    return str(settings.DATA_DIR / SOCKET_NAME)


def notify_on_commit(connection) -> None:
    """Arrange for the engine to be woken once the current transaction commits."""
    if connection.vendor == "postgresql":
        if connection.in_atomic_block:
            # Part of the transaction: delivered at its COMMIT. A failure here must
            # fail the transaction, which cannot go on anyway.
            with connection.cursor() as cursor:
                cursor.execute(f"NOTIFY {CHANNEL}")
            return
        # Autocommit: what it wakes for is committed already, and must not turn
        # into an error because the hint could not be sent.
        with contextlib.suppress(DatabaseError), connection.cursor() as cursor:
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

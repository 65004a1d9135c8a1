"""The engine's side of the wake hint (see deliveries/wake.py for the sender's)."""

import contextlib
import logging
import os
import socket
import threading

from deliveries import wake

logger = logging.getLogger("deliveries.engine")


class SocketListener:
    """Binds DATA_DIR/rundelivery.sock and sets `event` on every datagram."""

    def __init__(self, path: str, event: threading.Event):
        self.path = path
        self.event = event
        self._sock = None

    def start(self) -> bool:
        if len(self.path.encode()) > wake.MAX_SOCKET_PATH:
            logger.warning("wake socket path too long (%s); polling only", self.path)
            return False
        # The engine lock is held, so a file left here is a dead engine's.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self.path)
        os.chmod(self.path, 0o600)
        threading.Thread(target=self._run, name="wake-socket", daemon=True).start()
        # A hint sent before the bind was lost, and what it named may have been
        # stored after the engine's first intake pass: wake once, so that is at once.
        self.event.set()
        return True

    def _run(self):
        sock = self._sock
        while True:
            try:
                sock.recv(64)
            except OSError:
                return  # closed by stop()
            self.event.set()

    def stop(self):
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


class PostgresListener:
    """LISTENs on its own connection and sets `event` on every NOTIFY."""

    def __init__(self, using: str, event: threading.Event, stop: threading.Event):
        self.using = using
        self.event = event
        self.stop_event = stop
        self._conn = None

    def start(self) -> bool:
        threading.Thread(target=self._run, name="wake-listen", daemon=True).start()
        return True

    def _run(self):
        from deliveries.engine.lock import open_raw_connection

        while not self.stop_event.is_set():
            try:
                self._conn = open_raw_connection(self.using)
                self._conn.execute(f"LISTEN {wake.CHANNEL}")
                # Anything committed before LISTEN took effect is found by the
                # poll; wake once so that is at once.
                self.event.set()
                while not self.stop_event.is_set():
                    for _ in self._conn.notifies(timeout=1.0):
                        self.event.set()
            except Exception:
                logger.warning("LISTEN connection lost; reconnecting", exc_info=True)
                self.stop_event.wait(1.0)
            finally:
                if self._conn is not None:
                    with contextlib.suppress(Exception):
                        self._conn.close()

    def stop(self):
        pass  # the thread sees stop_event within a second

"""A deadline for a whole outbound attempt, not just for each socket operation.

The transport's timeout bounds every connect and every read, not the attempt: a receiver
that sends one byte every few seconds holds a worker for as long as it likes, and a
few such targets would hold them all. One watchdog thread keeps the deadline of
every running attempt in a heap; when one passes, it shuts down the socket that
attempt is using, the blocked read fails at once, and the attempt is recorded as
timed out. One thread for all workers, as with retries: never a timer per attempt.
"""

import contextlib
import heapq
import itertools
import socket
import threading
import time


class Watchdog:
    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._cond = threading.Condition()
        self._heap: list = []
        self._active: dict[int, int] = {}  # attempt token -> worker thread ident
        self._sockets: dict[int, socket.socket] = {}  # worker thread ident -> socket
        self._tokens = itertools.count()
        self._thread = None

    def bind(self, sock) -> None:
        """Record the socket the calling thread's attempt is using now."""
        if sock is not None:
            with self._cond:
                self._sockets[threading.get_ident()] = sock

    @contextlib.contextmanager
    def deadline(self, seconds: float):
        """Cut the calling thread's socket if the block runs longer than `seconds`.

        Yields a dict whose "expired" says, afterwards, whether the cut happened.
        """
        state = {"expired": False}
        token = next(self._tokens)
        with self._cond:
            self._active[token] = (threading.get_ident(), state)
            heapq.heappush(self._heap, (self._clock() + seconds, token))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="deadline", daemon=True)
                self._thread.start()
            # The watchdog sleeps until the earliest deadline: only a new earliest
            # one needs it awake. Attempts share a target's timeout, so that is
            # rare, and not waking it for every attempt spares a thread switch each.
            if self._heap[0][1] == token:
                self._cond.notify()
        try:
            yield state
        finally:
            with self._cond:
                self._active.pop(token, None)

    def _run(self) -> None:
        with self._cond:
            while True:
                now = self._clock()
                while self._heap and self._heap[0][0] <= now:
                    _, token = heapq.heappop(self._heap)
                    entry = self._active.pop(token, None)
                    if entry is None:
                        continue  # finished in time
                    ident, state = entry
                    state["expired"] = True
                    sock = self._sockets.get(ident)
                    if sock is not None:
                        with contextlib.suppress(OSError):
                            sock.shutdown(socket.SHUT_RDWR)
                timeout = self._heap[0][0] - now if self._heap else None
                self._cond.wait(timeout)


watchdog = Watchdog()

"""Transform worker processes, and the one call the rest of webhooker makes: run().

A jq program is the target owner's code: `last(range(1e15))` never ends and
`[range(1e9)]` wants gigabytes. So programs run out of the calling process, in
worker processes (worker.py) capped in address space, and each call may run at most
DELIVERY_TRANSFORM_TIMEOUT; past it the worker is killed and a new one started. A
runaway program costs its own call and the start of one process, never a thread of
the engine nor its memory.

Calls are pipelined: a caller writes its request to the worker with the fewest
calls waiting and blocks on its own answer; the worker reads every request queued
in its pipe in one wake-up, and a reader thread per worker hands each answer to its
caller in order. On a busy machine a worker waits a few milliseconds to be
scheduled whenever it is woken; one call per wake-up held an engine to a few hundred
transforms a second per worker (bench/RESULTS.md).

The reader also keeps the time: a call's limit runs from when it reaches the head
of its worker's queue (the calls before it are answered), so the calls queued
behind a runaway are sent again to a new worker, not blamed for it.

Each process that transforms (the engine; a web worker showing a preview) starts
its own workers, lazily, and after a fork anew.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import json
import logging
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from django.conf import settings

from deliveries.transforms.worker import SHOW

WORKER = Path(__file__).with_name("worker.py")
logger = logging.getLogger("deliveries.transforms")


def _tell(then, answer) -> None:
    """Hand an answer to its caller; a caller's failure must not stop the reader."""
    try:
        then(answer)
    except Exception:
        logger.exception("a transform's caller failed on its answer")


__all__ = ["SHOW", "Pool", "TransformError", "workers"]


class TransformError(Exception):
    """The program failed on this input, ran too long or too big: in words."""


class _Worker:
    """One worker process, its queue of callers, and the thread that reads its
    answers and keeps its time."""

    def __init__(self, pool: Pool):
        self.pool = pool
        self.process = _Spawner.get().start(pool.megabytes)
        self.stdin = self.process.stdin.fileno()
        self.stdout = self.process.stdout.fileno()
        # (then, when sent, request) of each call waiting, in the order of requests.
        self.waiting: collections.deque[tuple[Callable, float, bytes]] = collections.deque()
        # `lock` guards `waiting` and `dead`, held for moments only: the reader takes
        # it for each answer. `write_lock` keeps the requests in the pipe in the
        # order of `waiting`; a write may block (a full pipe, the worker busy), and
        # must never block the reader, or a worker writing a large answer and one
        # waiting for its stdin to be read would wait on each other for good.
        self.lock = threading.Lock()
        self.write_lock = threading.Lock()
        self.dead = False
        try:
            # Wakes the reader when a call arrives at an idle worker: its time starts.
            self._wake_r, self._wake_w = os.pipe()
            threading.Thread(target=self._read, name="transform-reader", daemon=True).start()
        except Exception as exc:
            self.kill()
            raise OSError(f"transform worker not started: {exc}") from None

    def send(self, request: bytes, then) -> bool:
        """Queue one call, `then(answer)` called on this worker's reader thread;
        False when this worker has ended (nothing queued)."""
        with self.write_lock:
            with self.lock:
                if self.dead:
                    return False
                idle = not self.waiting
                self.waiting.append((then, time.monotonic(), request))
            try:
                view = memoryview(request)
                while view:
                    view = view[os.write(self.stdin, view) :]
                if idle:
                    os.write(self._wake_w, b"\0")
            except OSError:
                pass  # it died or was killed: the reader answers every caller
        return True

    def _read(self) -> None:
        try:
            self._answer()
        except Exception:  # never leave a caller waiting
            self._end(("error", "the transform's worker process failed"))
        finally:
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _answer(self) -> None:
        poll = select.poll()
        poll.register(self.stdout, select.POLLIN)
        poll.register(self._wake_r, select.POLLIN)
        timeout = self.pool.timeout
        buffer = b""
        answered = time.monotonic()
        while True:
            with self.lock:
                head = self.waiting[0] if self.waiting else None
            left = None
            if head is not None:
                # Its time runs from when the calls before it were answered.
                left = max(head[1], answered) + timeout - time.monotonic()
                if left <= 0 and not poll.poll(0):  # not even an answer waiting
                    self._end(("error", f"the transform ran longer than {timeout:g} s"))
                    return
            wait = None if left is None else max(0.0, left) * 1000
            ready = {fd for fd, _ in poll.poll(wait)}
            if self.dead:  # ended by the pool (closing): its descriptors are not ours
                return
            if self._wake_r in ready:
                os.read(self._wake_r, 4096)
            if self.stdout not in ready:
                continue
            chunk = os.read(self.stdout, 1 << 20)
            if not chunk:
                self._end(self._why_ended())
                return
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                # Nothing between taking a caller and answering it can raise.
                try:
                    answer = json.loads(line)
                except (ValueError, RecursionError):  # RecursionError: nested too deep
                    answer = ("error", "the transform's output could not be read back")
                with self.lock:
                    then, _, _ = self.waiting.popleft()
                _tell(then, answer)
                # The next call's time starts now, not before this one's caller ran.
                answered = time.monotonic()
                if answer[0] == "memory":  # it exits: the calls behind ask again
                    self._end(None)
                    return

    def _why_ended(self):
        self.process.wait()
        if self.process.returncode == -signal.SIGABRT:  # libjq out of memory
            return ("memory", None)
        return ("error", "the transform's worker process ended unexpectedly")

    def _end(self, head_answer, *, again: bool = True) -> None:
        """Kill the process; the call at the head gets `head_answer` (None: it was
        answered), the calls behind it ask again, of a new worker (or, closing,
        get `head_answer` too)."""
        with self.lock:
            if self.dead:
                return
            self.dead = True
            waiting, self.waiting = list(self.waiting), collections.deque()
        self.pool.replace(self)
        self.kill()
        for n, (then, _, request) in enumerate(waiting):
            if (n == 0 or not again) and head_answer is not None:
                _tell(then, head_answer)
            elif again:  # innocent: asked again, of a new worker
                try:
                    self.pool.send(request, then)
                except TransformError as exc:  # the pool closed meanwhile
                    _tell(then, ("error", str(exc)))

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.process.wait()
        # Closed once no write is under way (a blocked one fails now the process is
        # gone): a sender holding the number of a closed descriptor would write its
        # request into whatever pipe took the number next.
        with self.write_lock:
            self.process.stdin.close()
        self.process.stdout.close()


class _Spawner:
    """Starts worker processes from one thread that lives as long as the process.

    A worker asks the kernel to kill it when its parent goes (PR_SET_PDEATHSIG),
    even mid-program; the kernel means the parent *thread*. Started from a request's
    or a worker's thread, it would die with that thread."""

    _current: _Spawner | None = None
    _pid = 0
    _lock = threading.Lock()

    def __init__(self):
        self._asks: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name="transform-spawner", daemon=True).start()

    @classmethod
    def get(cls) -> _Spawner:
        with cls._lock:
            if cls._current is None or cls._pid != os.getpid():
                cls._current, cls._pid = cls(), os.getpid()
            return cls._current

    def start(self, megabytes: int) -> subprocess.Popen:
        box = queue.SimpleQueue()
        self._asks.put((megabytes, box))
        started = box.get()
        if isinstance(started, OSError):
            raise started
        return started

    def _run(self) -> None:
        while True:
            megabytes, box = self._asks.get()
            try:
                box.put(
                    subprocess.Popen(  # noqa: S603 (fixed argv)
                        [sys.executable, "-I", str(WORKER), str(megabytes)],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        # jq's `debug` and `stderr` write there: nobody reads it.
                        stderr=subprocess.DEVNULL,
                        # Nothing of the engine's environment (jq's $ENV reads it).
                        env={},
                        close_fds=True,
                    )
                )
            except Exception as exc:  # the spawner must outlive any failure
                box.put(exc if isinstance(exc, OSError) else OSError(str(exc)))


class Pool:
    """`size` worker processes, started when first needed."""

    def __init__(self, *, size: int, timeout: float, megabytes: int):
        self.size, self.timeout, self.megabytes = size, timeout, megabytes
        self._workers: list[_Worker | None] = [None] * size
        self._lock = threading.Lock()
        self._closed = False

    def limits(self) -> dict:
        return {"size": self.size, "timeout": self.timeout, "megabytes": self.megabytes}

    def run(self, program: str, document: bytes) -> list:
        """The answer to `program` for `document` (JSON text, without `body`: the
        worker parses it from `text`): at most its first two values, or with SHOW
        before the program, [input, values]. Raises TransformError with jq's
        message, or saying which limit the call hit."""
        box = queue.SimpleQueue()
        self.submit(program, document, box.put)
        answer = box.get()
        if isinstance(answer, TransformError):
            raise answer
        return answer

    def submit(self, program: str, document: bytes, then) -> None:
        """run() without waiting: `then` is called on a reader thread with the
        values, or with the TransformError (never raised to it). A call never blocks
        the caller's thread: the engine keeps thousands of them in flight."""

        def answered(answer):
            kind, value = answer
            if kind == "memory":
                value = TransformError(
                    f"the transform needed more than {self.megabytes} MB of memory"
                )
            elif kind == "error":
                value = TransformError(value)
            then(value)

        try:
            self.send(json.dumps(program).encode() + b"\n" + document + b"\n", answered)
        except TransformError as exc:
            then(exc)

    def send(self, request: bytes, then) -> None:
        """Queue `request` on the least busy worker (one that ended just now: another)."""
        while not self._least_busy().send(request, then):
            pass

    def replace(self, worker: _Worker) -> None:
        """An ended worker's place is free for a new one."""
        with self._lock:
            for n, current in enumerate(self._workers):
                if current is worker:
                    self._workers[n] = None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers, self._workers = self._workers, [None] * self.size
        for worker in workers:
            if worker is not None:
                worker._end(("error", "webhooker is stopping"), again=False)

    def _least_busy(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise TransformError("webhooker is stopping")
            best = None
            for n, worker in enumerate(self._workers):
                if worker is None:
                    try:
                        worker = self._workers[n] = _Worker(self)
                    except OSError:
                        raise TransformError(
                            "no transform worker process could be started"
                        ) from None
                if best is None or len(worker.waiting) < len(best.waiting):
                    best = worker
            return best


_pool: Pool | None = None
_pool_pid = 0
_pool_lock = threading.Lock()


def workers() -> Pool:
    """This process's pool (a forked child starts its own), as the settings say."""
    global _pool, _pool_pid
    wanted = {
        "size": settings.DELIVERY_TRANSFORM_WORKERS,
        "timeout": settings.DELIVERY_TRANSFORM_TIMEOUT,
        "megabytes": settings.DELIVERY_TRANSFORM_MEMORY,
    }
    pool = _pool
    if pool is not None and _pool_pid == os.getpid() and pool.limits() == wanted:
        return pool
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid() or _pool.limits() != wanted:
            if _pool is not None and _pool_pid == os.getpid():
                _pool.close()
            _pool = Pool(**wanted)
            _pool_pid = os.getpid()
        return _pool


@atexit.register
def _close() -> None:
    if _pool is not None and _pool_pid == os.getpid():
        _pool.close()

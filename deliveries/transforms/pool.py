"""Transform worker processes, and the one call the rest of webhooker makes: run().

A jq program is the target owner's code: `last(range(1e15))` never ends and
`[range(1e9)]` wants gigabytes. So programs run out of the calling process, in
worker processes (worker.py) capped in address space, and the caller waits at most
DELIVERY_TRANSFORM_TIMEOUT for each call; past it the worker is killed and a new
one started. A runaway program costs its own call and the start of one process,
never a thread of the engine nor its memory.

Each process that transforms (the engine; a web worker showing a preview) starts
its own workers, lazily, and after a fork anew.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from django.conf import settings

WORKER = Path(__file__).with_name("worker.py")
# What a worker says on stderr as it dies (libjq's "cannot allocate memory").
DYING_WORDS = 4096


class TransformError(Exception):
    """The program failed on this input, ran too long or too big: in words."""


class _Worker:
    def __init__(self, megabytes: int):
        self.process = subprocess.Popen(  # noqa: S603 (fixed argv)
            [sys.executable, "-I", str(WORKER), str(megabytes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            close_fds=True,
        )

    def call(self, line: bytes, deadline: float) -> list:
        """Send one call and read its answer by `deadline` (time.monotonic)."""
        self.process.stdin.write(line)
        self.process.stdin.flush()
        out = self.process.stdout.fileno()
        chunks = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([out], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(out, 1 << 20)
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            if chunk.endswith(b"\n"):
                return json.loads(b"".join(chunks))

    def last_words(self) -> str:
        try:
            readable = select.select([self.process.stderr], [], [], 0.5)[0]
            return os.read(self.process.stderr.fileno(), DYING_WORDS).decode() if readable else ""
        except OSError:
            return ""

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            with contextlib.suppress(OSError):
                stream.close()


class Pool:
    """Up to `size` worker processes; a call takes an idle one, or waits for one."""

    def __init__(self, *, size: int, timeout: float, megabytes: int):
        self.size, self.timeout, self.megabytes = size, timeout, megabytes
        self._idle: list[_Worker] = []
        self._started = 0
        self._lock = threading.Condition()
        self._closed = False

    def run(self, program: str, value, *, timeout: float | None = None) -> list:
        """At most the first two values `program` yields for `value`; raises
        TransformError with jq's message, or saying which limit the call hit."""
        timeout = self.timeout if timeout is None else timeout
        line = _line(program, value)
        worker = self._take()
        try:
            answer = worker.call(line, time.monotonic() + timeout)
        except TimeoutError:
            self._discard(worker)
            raise TransformError(f"the transform ran longer than {timeout:g} s") from None
        except (EOFError, OSError, ValueError):
            said = worker.last_words()
            self._discard(worker)
            if "memory" in said or worker.process.returncode == -signal.SIGABRT:
                raise TransformError(self._too_big()) from None
            raise TransformError("the transform's worker process ended unexpectedly") from None
        if answer[0] == "memory":
            self._discard(worker)
            raise TransformError(self._too_big())
        self._give_back(worker)
        if answer[0] == "error":
            raise TransformError(answer[1])
        return answer[1]

    def limits(self) -> dict:
        return {"size": self.size, "timeout": self.timeout, "megabytes": self.megabytes}

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()

    def _too_big(self) -> str:
        return f"the transform needed more than {self.megabytes} MB of memory"

    def _take(self) -> _Worker:
        with self._lock:
            while not self._idle and self._started >= self.size:
                self._lock.wait()
            if self._idle:
                return self._idle.pop()
            self._started += 1
        try:
            return _Worker(self.megabytes)
        except OSError:
            with self._lock:
                self._started -= 1
                self._lock.notify()
            raise TransformError("no transform worker process could be started") from None

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(worker)
                self._lock.notify()
                return
        worker.kill()

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._started -= 1
            self._lock.notify()


def _line(program: str, value) -> bytes:
    try:
        return json.dumps([program, value], allow_nan=False).encode() + b"\n"
    except ValueError as exc:
        raise TransformError(f"the transform's input is not JSON: {exc}") from None


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

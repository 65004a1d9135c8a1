"""Starting real gunicorn and rundelivery processes against this process's database.

The end-to-end tests and the benchmarks (bench/suite.py) both start their processes
here, with the command lines `manage.py serve` uses, so both measure and check what
`make run` serves. Nothing here needs pytest.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
from django.conf import settings
from django.db import connection

from deliveries.management.commands.serve import gunicorn_command, rundelivery_command

ROOT = Path(__file__).resolve().parents[2]


def wait_until(predicate, timeout=30.0, interval=0.05, message="condition"):
    """Poll `predicate` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def children(pid) -> list[int]:
    """The pids of process `pid`'s children (gunicorn's workers, serve's processes)."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(child) for child in out.split()]


def database_url() -> str:
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_env(data_dir, **extra) -> dict:
    """This process's environment, settings module and database, in `data_dir`."""
    env = dict(os.environ)
    # Each test's processes count into their own DATA_DIR/metrics.
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env.update(
        DATA_DIR=str(data_dir),
        DATABASE_URL=database_url(),
        # bench.settings under the benchmarks.
        DJANGO_SETTINGS_MODULE=os.environ.get("DJANGO_SETTINGS_MODULE", "webhooker.settings"),
        PYTHONUNBUFFERED="1",
        WEBHOOKER_ALLOWED_TARGET_NETWORKS="127.0.0.0/8",
        # This process's keys: what the test writes, the processes read, as the
        # processes of one deployment share its DATA_DIR or the variable.
        WEBHOOKER_ENCRYPTION_KEYS=",".join(settings.ENCRYPTION_KEYS),
    )
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Process:
    """A child process whose output goes to `log_path`."""

    def __init__(self, argv, env, log_path):
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop)
        self.popen = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )

    @property
    def pid(self):
        return self.popen.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def send(self, signum):
        self.popen.send_signal(signum)

    def wait(self, timeout=60):
        return self.popen.wait(timeout)

    def stop(self, signum=signal.SIGTERM, timeout=30):
        if self.popen.poll() is None:
            self.popen.send_signal(signum)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self._report_stuck(timeout)
                self.popen.kill()
                self.popen.wait()
        self._log.close()
        return self.popen.returncode

    def _report_stuck(self, timeout):
        """A process that did not stop: the end of its log on this test's stderr,
        where a failing test's report shows it, before it is killed."""
        log = self.log()
        # From the stacks a stalled engine writes (rundelivery's STOP_REPORT_AFTER).
        start = log.rfind("Timeout (")
        tail = log[start:] if start >= 0 else "\n".join(log.splitlines()[-60:])
        print(f"{self.log_path.name}: running {timeout} s after its signal", file=sys.stderr)
        print(tail, file=sys.stderr)


def wait_answering(url, process: Process, timeout=30.0):
    """Poll `url` until it answers 200; fail at once, with its log, if `process` exits.

    A first answer can be slow on a loaded machine (workers still importing), so a
    timed-out request counts as "not yet", like a refused connection.
    """

    def ready():
        if process.popen.poll() is not None:
            raise AssertionError(f"{process.log_path.name}: exited\n{process.log()}")
        try:
            return requests.get(url, timeout=5).status_code == 200
        except requests.RequestException:
            return False

    wait_until(ready, timeout=timeout, message=f"{url} to answer")


def start_web(data_dir, *, workers=2, **env):
    """gunicorn on a free loopback port; returns (process, base URL) once it answers.

    `workers=None` keeps gunicorn.conf.py's count.
    """
    port = free_port()
    options = ["--bind", f"127.0.0.1:{port}", "--access-logfile", "/dev/null"]
    if workers is not None:
        options += ["--workers", str(workers)]
    log_path = Path(data_dir) / f"gunicorn-{port}.log"
    proc = Process(gunicorn_command(*options), process_env(data_dir, **env), log_path)
    base = f"http://127.0.0.1:{port}"
    wait_answering(base + "/admin/login/", proc)
    return proc, base


def start_engine(data_dir, *args, verbosity=2, **env):
    argv = rundelivery_command("-v", str(verbosity), *args)
    n = len(list(Path(data_dir).glob("rundelivery-*.log")))
    return Process(argv, process_env(data_dir, **env), Path(data_dir) / f"rundelivery-{n}.log")


def post_events(base, entrypoint, n):
    """Post `n` JSON events to `entrypoint` on the server at `base`, four at a time;
    return their codes (each must be answered 200)."""
    url = f"{base}/webhook/{entrypoint.code}"

    def send(i):
        return requests.post(url, json={"n": i}, timeout=30)

    with ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(send, range(n)))
    assert {r.status_code for r in responses} == {200}
    return [r.json()["event"] for r in responses]

"""Starting real gunicorn and rundelivery processes against the test database."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


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
    env = dict(os.environ)
    # Each test's processes count into their own DATA_DIR/metrics.
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env.update(
        DATA_DIR=str(data_dir),
        DATABASE_URL=database_url(),
        DJANGO_SETTINGS_MODULE="webhooker.settings",
        PYTHONUNBUFFERED="1",
        WEBHOOKER_ALLOWED_TARGET_NETWORKS="127.0.0.0/8",
    )
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Process:
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
                self.popen.kill()
                self.popen.wait()
        self._log.close()
        return self.popen.returncode


def start_web(data_dir, *, workers=2, **env):
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "gunicorn",
        "-c",
        str(ROOT / "webhooker" / "gunicorn.conf.py"),
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        str(workers),
        "--access-logfile",
        "/dev/null",
        "webhooker.wsgi",
    ]
    proc = Process(argv, process_env(data_dir, **env), Path(data_dir) / f"gunicorn-{port}.log")
    base = f"http://127.0.0.1:{port}"

    def ready():
        if proc.popen.poll() is not None:
            raise AssertionError(f"gunicorn exited:\n{proc.log()}")
        try:
            return requests.get(base + "/admin/login/", timeout=1).status_code == 200
        except requests.ConnectionError:
            return False

    wait_until(ready, timeout=30, message="gunicorn to answer")
    return proc, base


def start_engine(data_dir, *args, **env):
    argv = [sys.executable, str(ROOT / "manage.py"), "rundelivery", "-v", "2", *args]
    n = len(list(Path(data_dir).glob("rundelivery-*.log")))
    return Process(argv, process_env(data_dir, **env), Path(data_dir) / f"rundelivery-{n}.log")

import glob
import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection


def gunicorn_command(*options):
    """The web side's command line; `options` (e.g. --bind) override gunicorn.conf.py.

    The end-to-end tests and the benchmarks start gunicorn with this too, so they
    exercise the configuration `make run` serves.
    """
    config = settings.BASE_DIR / "webhooker" / "gunicorn.conf.py"
    return [
        sys.executable,
        "-m",
        "gunicorn",
        "-c",
        str(config),
        *options,
        "webhooker.asgi:application",
    ]


def rundelivery_command(*args):
    return [sys.executable, str(settings.BASE_DIR / "manage.py"), "rundelivery", *args]


class Command(BaseCommand):
    help = (
        "Run the web side (gunicorn) and the delivery engine (rundelivery) together. "
        "Ctrl-C or SIGTERM stops both. If gunicorn exits, everything stops; if an "
        "engine exits, it is started again (with backoff) and the web side keeps "
        "serving."
    )

    # Restarting an engine that exited: first wait, doubling up to the cap; an
    # engine that ran this long before exiting starts again after the first wait.
    # Seconds between two looks at the children and the signals received.
    TICK = 0.2
    RESTART_FIRST = 1.0
    RESTART_CAP = 60.0
    RESTART_RESET_AFTER = 60.0

    def add_arguments(self, parser):
        parser.add_argument(
            "--engines",
            type=int,
            default=1,
            help="rundelivery processes to run (PostgreSQL only past 1: they share the "
            "partitions, and so use more than one core) (default: %(default)r)",
        )

    def handle(self, *args, **options):
        engines = options["engines"]
        if engines < 1:
            raise CommandError("--engines must be at least 1")
        if engines > 1 and connection.vendor != "postgresql":
            raise CommandError(
                f"--engines {engines}: SQLite takes one engine per data directory; "
                "several engines need PostgreSQL (DATABASE_URL)"
            )
        # Counters start from zero with the processes that count them: files left by
        # an earlier run's processes would add their totals to this run's forever.
        metrics_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if metrics_dir:
            for stale in glob.glob(os.path.join(metrics_dir, "*.db")):
                os.unlink(stale)
        # The signals received. The handler only appends: anything that takes a lock
        # (an Event's set(), a Popen's poll()) could deadlock when the signal lands
        # while this thread holds that lock.
        signals = []
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda signum, frame: signals.append(signum))
        web = _Child("gunicorn", gunicorn_command())
        children = [web] + [_Child(f"engine-{n}", rundelivery_command()) for n in range(engines)]
        for child in children:
            child.start()
        while not signals:
            time.sleep(self.TICK)
            if web.popen.poll() is not None:
                self.stderr.write(f"gunicorn exited with code {web.popen.returncode}; stopping")
                break
            for child in children[1:]:
                self._supervise(child)
        # One SIGTERM each: gunicorn stops, an engine drains. Each further signal
        # here is passed on: a second SIGTERM makes an engine exit without waiting
        # for its running attempts (they are sent again after the restart).
        forwarded = 0
        while True:
            running = [child for child in children if child.popen.poll() is None]
            if not running:
                break
            while forwarded < max(1, len(signals)):
                for child in running:
                    child.popen.send_signal(signal.SIGTERM)
                forwarded += 1
            time.sleep(self.TICK)
        codes = {child.name: child.popen.returncode for child in children}
        failed = {name: code for name, code in codes.items() if code not in (0, -signal.SIGTERM)}
        if failed:
            self.stderr.write(f"stopped; exit codes: {failed}")
            os._exit(1)

    def _supervise(self, child) -> None:
        """Start an engine that exited again, after its backoff: the web side keeps
        taking webhooks meanwhile, and they wait in the database."""
        code = child.popen.poll()
        now = time.monotonic()
        if code is None:
            return
        if child.restart_at is None:
            if now - child.started > self.RESTART_RESET_AFTER:
                child.backoff = self.RESTART_FIRST
            child.restart_at = now + child.backoff
            self.stderr.write(
                f"{child.name} exited with code {code}; starting it again in {child.backoff:.0f}s"
            )
            child.backoff = min(child.backoff * 2, self.RESTART_CAP)
        elif now >= child.restart_at:
            child.start()
            self.stderr.write(f"{child.name} started again (pid {child.popen.pid})")


class _Child:
    def __init__(self, name, argv):
        self.name = name
        self.argv = argv
        self.popen = None
        self.started = 0.0
        self.restart_at = None
        self.backoff = Command.RESTART_FIRST

    def start(self) -> None:
        # Each child gets its own session, so a Ctrl-C in the terminal reaches only
        # this process: the children then get exactly one SIGTERM each, which for
        # rundelivery means "drain and exit" rather than a second, forcing signal.
        self.popen = subprocess.Popen(  # noqa: S603 (fixed argv)
            self.argv, cwd=settings.BASE_DIR, start_new_session=True
        )
        self.started = time.monotonic()
        self.restart_at = None

import glob
import os
import signal
import subprocess
import sys
import threading

from django.conf import settings
from django.core.management.base import BaseCommand


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
        "Ctrl-C or SIGTERM stops both; if either exits, the other is stopped too."
    )

    def handle(self, *args, **options):
        base = settings.BASE_DIR
        commands = {"gunicorn": gunicorn_command(), "rundelivery": rundelivery_command()}
        # Counters start from zero with the processes that count them: files left by
        # an earlier run's processes would add their totals to this run's forever.
        metrics_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if metrics_dir:
            for stale in glob.glob(os.path.join(metrics_dir, "*.db")):
                os.unlink(stale)
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        # Each child gets its own session, so a Ctrl-C in the terminal reaches only
        # this process: the children then get exactly one SIGTERM each, which for
        # rundelivery means "drain and exit" rather than a second, forcing signal.
        children = {
            name: subprocess.Popen(argv, cwd=base, start_new_session=True)  # noqa: S603 (fixed argv)
            for name, argv in commands.items()
        }
        for name, child in children.items():
            threading.Thread(target=_watch, args=(child, stop), name=name, daemon=True).start()
        stop.wait()
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        codes = {name: child.wait() for name, child in children.items()}
        failed = {name: code for name, code in codes.items() if code not in (0, -signal.SIGTERM)}
        if failed:
            self.stderr.write(f"stopped; exit codes: {failed}")
            os._exit(1)


def _watch(child, stop):
    child.wait()
    stop.set()

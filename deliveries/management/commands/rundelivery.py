import logging
import os
import signal
import sys

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from deliveries.engine.config import EngineConfig
from deliveries.engine.core import Engine
from deliveries.engine.lock import EngineLock, EngineLocked
from deliveries.engine.runner import Runner
from deliveries.engine.wakeup import PostgresListener, SocketListener
from deliveries.wake import socket_path

LOG_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}


def positive_int(value):
    number = int(value)
    if number < 1:
        raise ValueError(value)
    return number


class Command(BaseCommand):
    help = (
        "Run the delivery engine: take every stored delivery to its target. One per "
        "database; a second one refuses to start."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--workers",
            type=positive_int,
            default=settings.DELIVERY_WORKERS,
            help="worker threads (default: %(default)r)",
        )
        parser.add_argument(
            "--channel-size",
            type=positive_int,
            default=settings.DELIVERY_CHANNEL_SIZE,
            help="tasks held in the channel (default: %(default)r)",
        )
        parser.add_argument(
            "--once",
            action="store_true",
            help="recover, deliver what is outstanding, then exit (scheduled retries "
            "stay in the database)",
        )

    def handle(self, *args, **options):
        logging.getLogger("deliveries").setLevel(LOG_LEVELS[options["verbosity"]])
        lock = EngineLock(settings.DATA_DIR)
        try:
            lock.acquire()
        except EngineLocked as exc:
            raise CommandError(str(exc)) from None
        try:
            config = EngineConfig.from_settings(
                workers=options["workers"], channel_size=options["channel_size"]
            )
            engine = Engine(config)
            self._install_signals(engine)
            if connection.vendor == "postgresql":
                listener = PostgresListener("default", engine.wake_event, engine.stop_event)
            else:
                listener = SocketListener(socket_path(), engine.wake_event)
            code = Runner(engine, lock=lock, listener=listener).run(once=options["once"])
        finally:
            lock.release()
        if code:
            raise CommandError("stopped: the engine lock was lost", returncode=code)

    def _install_signals(self, engine):
        def on_signal(signum, frame):
            if engine.stop_event.is_set():
                sys.stderr.write("rundelivery: forced exit\n")
                os._exit(1)
            sys.stderr.write(
                "rundelivery: finishing running attempts; press Ctrl+C again to force\n"
            )
            engine.stop()

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)

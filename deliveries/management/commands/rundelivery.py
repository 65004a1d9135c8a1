import contextlib
import faulthandler
import logging
import os
import resource
import signal
import socket
import sys
import threading
import uuid

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from deliveries.engine.config import EngineConfig
from deliveries.engine.core import Engine
from deliveries.engine.handover import Handover
from deliveries.engine.lease import Lease
from deliveries.engine.lock import EngineLock, EngineLocked, open_raw_connection
from deliveries.engine.partition_manager import (
    PartitionManager,
    record_partition_count,
    warn_without_autovacuum,
)
from deliveries.engine.partitions import PartitionMismatch, Partitions, SessionUnsupported
from deliveries.engine.runner import Runner
from deliveries.engine.wakeup import PostgresListener, SocketListener
from deliveries.wake import socket_path
from webhooker.runtime import tune_garbage_collector

LOG_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}

# A graceful stop still running after this long writes every thread's stack to
# stderr, once: it is waiting on slow attempts (their deadline bounds it) or stuck,
# and the stacks say which.
STOP_REPORT_AFTER = 30.0


def positive_int(value):
    number = int(value)
    if number < 1:
        raise ValueError(value)
    return number


logger = logging.getLogger("deliveries.engine")

# Open files the engine needs beside one socket per attempt in flight: database
# connections, logs, the wake hint's socket, connections kept alive between attempts.
FILES_BESIDE_ATTEMPTS = 1024


def allow_open_files(inflight: int) -> int:
    """Raise the soft limit of open files to what `inflight` attempts need beside
    the rest, as far as the hard limit goes (1 024 is a common soft limit, below
    the default DELIVERY_INFLIGHT). Returns the attempts that fit: past the limit
    they would fail as "connection failed", counted against their receivers, so an
    engine whose hard limit is short keeps fewer in flight (at least half the
    limit), and says so."""
    need = inflight + FILES_BESIDE_ATTEMPTS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return inflight
    soft = need if hard == resource.RLIM_INFINITY else min(need, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft >= need:
        return inflight
    fits = min(inflight, max(soft - FILES_BESIDE_ATTEMPTS, soft // 2, 1))
    if fits < inflight:
        logger.warning(
            "open files are limited to %d (the hard limit): %d attempts in flight at most, "
            "not DELIVERY_INFLIGHT=%d; raise the limit (LimitNOFILE, ulimit -n) or lower "
            "DELIVERY_INFLIGHT",
            soft,
            fits,
            inflight,
        )
    return fits


class Command(BaseCommand):
    help = (
        "Run the delivery engine: take every stored delivery to its target. SQLite: "
        "one per data directory, a second one refuses to start. PostgreSQL: any "
        "number, sharing the partitions (DELIVERY_PARTITIONS)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--workers",
            type=positive_int,
            default=settings.DELIVERY_WORKERS,
            help="threads that prepare attempts (default: %(default)r)",
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
            "stay in the database; on PostgreSQL, in the partitions this engine takes: "
            "all of them unless other engines run)",
        )

    def handle(self, *args, **options):
        logging.getLogger("deliveries").setLevel(LOG_LEVELS[options["verbosity"]])
        # The engine serves no page: Django's debug mode (on in dev) would only
        # format every query it runs and keep the last 9 000 per thread (it showed
        # in a profile of the engine, bench/RESULTS.md).
        settings.DEBUG = False
        tune_garbage_collector()
        config = EngineConfig.from_settings(
            inflight=allow_open_files(settings.DELIVERY_INFLIGHT),
            workers=options["workers"],
            channel_size=options["channel_size"],
            name=f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:6]}",
        )
        if connection.vendor == "postgresql":
            self._run_partitioned(config, options)
        else:
            self._run_alone(config, options)

    def _run_alone(self, config, options):
        """SQLite: one engine per data directory, holding the one partition."""
        lock = EngineLock(settings.DATA_DIR)
        try:
            lock.acquire()
        except EngineLocked as exc:
            raise CommandError(str(exc)) from None
        try:
            engine = Engine(config)
            self._install_signals(engine)
            listener = SocketListener(socket_path(), engine.wake_event)
            Runner(engine, listener=listener).run(once=options["once"])
        finally:
            lock.release()

    def _run_partitioned(self, config, options):
        """PostgreSQL: one of any number of engines, each holding some partitions."""
        try:
            count = record_partition_count(settings.DELIVERY_PARTITIONS)
        except PartitionMismatch as exc:
            raise CommandError(str(exc)) from None
        with connection.cursor() as cursor:
            warn_without_autovacuum(cursor)
        lease = Lease(settings.DELIVERY_LEASE_SECONDS)
        engine = Engine(config, partitions=Partitions(count, held=(), lease=lease))
        manager = PartitionManager(
            Handover(engine),
            name=config.name,
            interval=settings.DELIVERY_REBALANCE_INTERVAL,
            evict_after=settings.DELIVERY_EVICT_AFTER,
            connect=lambda: open_raw_connection("default", deadline=lease.seconds),
        )
        try:
            manager.connect()
        except SessionUnsupported as exc:
            raise CommandError(str(exc)) from None
        self._install_signals(engine)
        listener = PostgresListener("default", engine.wake_event, engine.stop_event)
        try:
            Runner(engine, listener=listener, manager=manager).run(once=options["once"])
        finally:
            manager.close()

    def _install_signals(self, engine):
        """SIGINT or SIGTERM: drain and exit; a second one: exit at once.

        Each signal is a byte on a pipe, written by the interpreter's own C handler
        (signal.set_wakeup_fd) in whichever thread the kernel gave the signal to; a
        thread of its own reads the pipe and acts. The Python-level handler, which
        does nothing, only keeps the signals from ending the process: it runs in
        the main thread alone, and only once that thread runs Python code again.
        The main thread sleeps on the engine's stop, so a signal the kernel handed
        to another thread, and handled through it, was never acted on. And a
        handler that took a lock (the stop Event's set(), a buffered stream's
        write) could deadlock when the signal landed while its thread held it."""
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)  # as set_wakeup_fd requires

        def act():
            while received := os.read(read_end, 1):
                if received[0] not in (signal.SIGINT, signal.SIGTERM):
                    continue  # another signal someone gave a Python handler
                if engine.stop_event.is_set():
                    sys.stderr.write("rundelivery: forced exit\n")
                    os._exit(1)
                sys.stderr.write(
                    "rundelivery: finishing running attempts; press Ctrl+C again to force\n"
                )
                engine.stop()
                # Not where stderr is no file (the command called in process, captured).
                with contextlib.suppress(OSError, ValueError):
                    faulthandler.dump_traceback_later(STOP_REPORT_AFTER)

        threading.Thread(target=act, name="signals", daemon=True).start()
        # The pipe first: a signal between the two would find the handler that
        # does nothing and no pipe to tell.
        signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, _noticed_on_the_pipe)


def _noticed_on_the_pipe(signum, frame):
    """The signals' Python-level handler: the wakeup pipe carries them
    (Command._install_signals)."""

"""The engine's threads: each one a small loop with its own stop condition.

| thread       | loop                          | stops when                          |
|--------------|-------------------------------|-------------------------------------|
| worker-n     | Workers.run: channel → process | the engine stops                   |
| sender       | Sender.run: attempts completed | sender.stop() once none is in flight|
| intake       | IntakeLoop: woken or polling  | the engine stops                    |
| recovery     | Every(recovery_interval)      | the engine stops                    |
| heartbeat    | Every(HEARTBEAT_INTERVAL)     | the engine stops                    |
| partitions   | PartitionManager.run          | the engine stops (PostgreSQL only)  |
| alerts       | Every(ALERTS)                 | the engine stops                    |
| housekeeping | Every(daily, first after 60 s)| the engine stops                    |
| scheduler    | RetryScheduler.run            | scheduler.stop() in shutdown        |
| writer       | ResultWriter.run              | its stop event, once nothing is left|

`Runner.shutdown` stops them in the order invariant 8 needs: claimants first,
then the running attempts, then the writer with their results; on PostgreSQL each
partition is handed over as soon as nothing of it is running.

`Watchdog` tells the partitions thread whether the engine is moving: a deadlock, a
hang in every worker or a swap storm must not keep partitions locked that nothing
delivers in.
"""

import logging
import threading
import time

from django.db import connection

from deliveries import replays
from deliveries.engine import heartbeat
from deliveries.engine.core import Engine
from deliveries.models import EngineStatus
from deliveries.retention import prune_events

logger = logging.getLogger("deliveries.engine")


def guarded(step, what: str, stop_event: threading.Event):
    """Run one step; a failure is logged and retried later, never fatal."""
    try:
        return step()
    except Exception:
        logger.exception("%s failed; retrying", what)
        connection.close()
        stop_event.wait(1.0)
        return 0


class Every:
    """Run `step` every `interval` seconds, the first time after `first`; every
    `busy` seconds instead while it finds work (returns something true)."""

    def __init__(
        self,
        name,
        step,
        *,
        stop_event,
        interval: float,
        first: float | None = None,
        busy: float | None = None,
    ):
        self.name = name
        self.step = step
        self.stop_event = stop_event
        self.interval = interval
        self.first = interval if first is None else first
        self.busy = interval if busy is None else busy

    def run(self) -> None:
        wait = self.first
        while not self.stop_event.wait(wait):
            # Long-lived threads get no request signals: drop a connection that
            # broke or outlived CONN_MAX_AGE here, before it fails a query.
            connection.close_if_unusable_or_obsolete()
            found = guarded(self.step, self.name, self.stop_event)
            wait = self.busy if found else self.interval


class Watchdog:
    """Whether the engine's loops are moving: the intake loop and the writer stamp
    every turn, not every worker is stuck in one task past `attempt_bound`, and no
    attempt in flight is older than that (the HTTP client's loop, which ends each
    attempt at its deadline, would then be stuck itself)."""

    def __init__(
        self, *, stall_after: float, attempt_bound: float, workers, sender, clock=time.monotonic
    ):
        self.stall_after = stall_after
        self.attempt_bound = attempt_bound
        self.workers = workers
        self.sender = sender
        self.clock = clock
        self._stamps: dict[str, float] = {}

    def stamp(self, name: str) -> None:
        self._stamps[name] = self.clock()

    def healthy(self) -> bool:
        now = self.clock()
        # A copy: a loop stamping its first time adds a key meanwhile.
        if any(now - at > self.stall_after for at in list(self._stamps.values())):
            return False
        oldest = self.sender.oldest()
        if oldest is not None and now - oldest > self.attempt_bound:
            return False
        return not self.workers.all_stuck(now - self.attempt_bound)


class IntakeLoop:
    """Intake passes back to back while they find work, then wait for a hint or
    the poll interval."""

    name = "intake"
    # Seconds between passes while the channel is full: the workers are the
    # bottleneck, the rows wait in the database, and a pass at once would find no
    # room again (it spun, taking the workers' CPU). The workers take a few hundred
    # tasks meanwhile out of DELIVERY_CHANNEL_SIZE.
    FULL_WAIT = 0.05

    def __init__(self, engine: Engine, stamp=lambda name: None):
        self.engine = engine
        self.stamp = stamp

    def run(self) -> None:
        engine = self.engine
        stop = engine.stop_event
        while not stop.is_set():
            self.stamp(self.name)
            connection.close_if_unusable_or_obsolete()
            while (guarded(engine.intake_once, "intake", stop) or engine.intake.more) and (
                not stop.is_set()
            ):
                self.stamp(self.name)
                if engine.intake.full:
                    stop.wait(self.FULL_WAIT)
            engine.wake_event.wait(engine.config.poll_interval)
            engine.wake_event.clear()


class Workers:
    """The worker threads' loop, and how many of them are attempting right now."""

    # How often an idle worker looks up from the channel to see whether to stop.
    WAKE = 0.5

    def __init__(self, engine: Engine):
        self.engine = engine
        # worker thread id -> when its current task began. Each worker sets and
        # deletes its own key; one dict operation, or a copy of the values, is
        # atomic under the GIL, so readers take no lock.
        self._since: dict[int, float] = {}

    def busy(self) -> int:
        return len(self._since)

    def all_stuck(self, began_before: float) -> bool:
        """Every worker busy with a task it began before `began_before`."""
        since = list(self._since.values())
        return len(since) >= self.engine.config.workers and all(t < began_before for t in since)

    def run(self) -> None:
        engine = self.engine
        sender = engine.sender
        while not engine.stop_event.is_set():
            # Room for an attempt in flight first: with DELIVERY_INFLIGHT attempts
            # out, tasks wait on the channel (and rows in the database).
            if not sender.reserve(self.WAKE):
                continue
            task = engine.channel.get(self.WAKE)
            if task is None:
                sender.unreserve()
                continue
            connection.close_if_unusable_or_obsolete()
            me = threading.get_ident()
            self._since[me] = time.monotonic()
            sent = False
            try:
                sent = engine.process(task)
            finally:
                if not sent:
                    sender.unreserve()
                del self._since[me]


class Runner:
    # Graceful stop waits this long for running attempts: the longest per-target
    # timeout a config may set, plus a margin.
    DRAIN_TIMEOUT = 310.0
    # The threads that deliver nothing (heartbeat, alerts, housekeeping) are waited
    # for this long at a stop: an alert stuck on a mail server or a prune in a long
    # statement must not hold a stopping engine for the whole drain time. They are
    # daemons; what they did not finish is done by the next engine.
    AUXILIARY_JOIN = 10.0
    # Seconds between two looks for alerts to raise and send.
    ALERTS = 1.0
    # The intake loop or the writer not turning for this long means the engine is
    # stuck (partition_manager.PartitionManager then lets its partitions go).
    STALL_AFTER = 30.0
    # Retention runs a minute after start, then daily.
    PRUNE_FIRST = 60.0
    PRUNE_INTERVAL = 24 * 3600.0
    # Replay jobs (deliveries/replays.py) are looked for every second, and stepped
    # every REPLAY_BUSY seconds while one has work here.
    REPLAYS = 1.0
    REPLAY_BUSY = 0.05

    def __init__(self, engine: Engine, *, listener=None, manager=None):
        self.engine = engine
        # The wake hint's listener (wakeup.py), started and stopped with the engine.
        self.listener = listener
        # partition_manager.PartitionManager on PostgreSQL; its lock connection is closed
        # (its locks released) last, once every result is written.
        self.manager = manager
        self.workers = Workers(engine)
        self.watchdog = Watchdog(
            stall_after=self.STALL_AFTER,
            attempt_bound=self.DRAIN_TIMEOUT,
            workers=self.workers,
            sender=engine.sender,
        )
        self.writer_stop = threading.Event()
        stop = engine.stop_event
        self.intake = IntakeLoop(engine, stamp=self.watchdog.stamp)
        self.recovery = Every(
            "recovery",
            engine.recover_once,
            stop_event=stop,
            interval=engine.config.recovery_interval,
        )
        self.heartbeat = Every(
            "heartbeat", self.beat, stop_event=stop, interval=EngineStatus.HEARTBEAT_INTERVAL
        )
        self.alerts = Every("alerts", engine.alert_once, stop_event=stop, interval=self.ALERTS)
        self.housekeeping = Every(
            "housekeeping",
            self.prune,
            stop_event=stop,
            interval=self.PRUNE_INTERVAL,
            first=self.PRUNE_FIRST,
        )
        self.replays = Every(
            "replays",
            self.replay_once,
            stop_event=stop,
            interval=self.REPLAYS,
            busy=self.REPLAY_BUSY,
        )
        if manager is not None:
            manager.on_change = self.beat
            manager.healthy = self.watchdog.healthy
        self._threads: dict[str, list[threading.Thread]] = {}

    def run(self, *, once: bool = False) -> int:
        """Recover, then run every part until stop() (or, with once, until idle).
        Returns the exit code, 0."""
        engine = self.engine
        heartbeat.beat(engine.config.name, self.gauges(), starting=True)
        engine.recover_once(at_start=True)
        if self.manager is not None:
            self.manager.step()  # the first partitions, and their recovery, now
        self._spawn("scheduler", engine.scheduler.run)
        engine.writer.running = True  # before any worker can finish an attempt
        engine.sender.running = True
        self._spawn("sender", engine.sender.run)
        self._spawn(
            "writer", lambda: engine.writer.run(self.writer_stop, stamp=self.watchdog.stamp)
        )
        for n in range(engine.config.workers):
            self._spawn("workers", self.workers.run, name=f"worker-{n}")
        if once:  # no claimant but the caller's thread (_run_until_idle)
            loops = [self.heartbeat]
        else:
            loops = [
                self.intake,
                self.recovery,
                self.heartbeat,
                self.alerts,
                self.housekeeping,
                self.replays,
            ]
        for loop in loops:
            self._spawn(loop.name, loop.run)
        if self.manager is not None:
            self._spawn("partitions", lambda: self.manager.run(engine.stop_event))
        if self.listener is not None:
            self.listener.start()
        try:
            if once:
                self._run_until_idle()
            else:
                engine.stop_event.wait()
        finally:
            try:
                self.shutdown()
            finally:
                if self.listener is not None:
                    self.listener.stop()
        return 0

    def stop(self) -> None:
        self.engine.stop()

    def shutdown(self, timeout: float | None = None) -> None:
        """Graceful stop (invariant 8): claimants first, then the running attempts."""
        engine = self.engine
        engine.stop()
        timeout = self.DRAIN_TIMEOUT if timeout is None else timeout
        for name in ("intake", "recovery", "partitions"):
            self._join(name, timeout)
        for task in engine.scheduler.stop():
            engine.release(task)  # stays `retrying` with its next_attempt_at
        if self.manager is not None and not self._alive("partitions"):
            # Each partition to the others as soon as its attempts' results are
            # written (the workers and the writer go on meanwhile), not all at the
            # end: a rolling restart leaves no partition unheld for long. Not while
            # the partitions thread is still in a step (it owns the manager's
            # state): then the locks go when the connection closes, below.
            self.manager.leave(timeout)
        self._join("workers", timeout)
        # The attempts in flight come back (each one's deadline bounds the wait),
        # and their completions hand their results over.
        engine.sender.drain(timeout)
        engine.sender.stop()
        self._join("sender", timeout)
        # Every running attempt has handed its result over: write them all.
        self.writer_stop.set()
        self._join("writer", timeout)
        for task in engine.channel.drain() + engine.targets.drain_parked():
            engine.release(task)  # never attempted: still `pending` in the database
        self._join("scheduler", 1)
        for group in ("heartbeat", "alerts", "housekeeping", "replays"):
            self._join(group, min(timeout, self.AUXILIARY_JOIN))
            if self._alive(group):
                logger.warning("engine stopping without its %s thread, still busy", group)
        try:
            connection.close_if_unusable_or_obsolete()
            heartbeat.beat(engine.config.name, self.gauges(), stopped=True)
        except Exception:
            logger.warning("could not record the engine's stop", exc_info=True)
        connection.close()
        if self.manager is not None:
            self.manager.close()

    def idle(self) -> bool:
        """Nothing queued, running or being written; only scheduled retries held.
        (A result in a batch the writer is still gathering is not in its queue, but
        its delivery is still held: inflight.held() counts it.)"""
        engine = self.engine
        return (
            engine.channel.depth() == 0
            and self.workers.busy() == 0
            and engine.sender.in_flight() == 0
            and engine.writer.pending() == 0
            and engine.inflight.held() == engine.scheduler.pending()
        )

    def gauges(self) -> dict:
        """What the heartbeat row shows of the running engine."""
        engine = self.engine
        return {
            "channel_depth": engine.channel.depth(),
            "inflight": engine.inflight.held(),
            "busy_workers": self.workers.busy(),
            "attempts_in_flight": engine.sender.in_flight(),
            "workers": engine.config.workers,
            "open_breakers": len(engine.targets.not_closed()),
            "breakers": engine.targets.breaker_states(),
            "partitions": engine.partitions.listing(),
        }

    # --- the loops' steps ----------------------------------------------------------

    def beat(self) -> None:
        heartbeat.beat(self.engine.config.name, self.gauges())

    def prune(self) -> None:
        if 0 not in self.engine.partitions.held:
            return  # one engine prunes for all: the one holding partition 0
        removed = prune_events(stop=self.engine.stop_event)
        if removed:
            logger.info(
                "retention: pruned %d events, %d deliveries, %d results",
                removed["events"],
                removed["deliveries"],
                removed["results"],
            )

    def replay_once(self) -> int:
        """Step the replay jobs with work in this engine's partitions."""
        partitions = self.engine.partitions
        claimable, _ = partitions.claims
        return replays.step(claimable, partitions.count)

    def _run_until_idle(self) -> None:
        """For --once: intake from this thread until a pass finds nothing to do."""
        engine = self.engine
        while not engine.stop_event.is_set():
            queued = guarded(engine.intake_once, "intake", engine.stop_event)
            if not queued and self.idle():
                return
            engine.stop_event.wait(0.05)

    # --- threads -------------------------------------------------------------------

    def _spawn(self, group: str, target, name: str | None = None) -> None:
        thread = threading.Thread(
            target=self._thread_main, args=(target,), name=name or group, daemon=True
        )
        self._threads.setdefault(group, []).append(thread)
        thread.start()

    def _alive(self, group: str) -> bool:
        return any(thread.is_alive() for thread in self._threads.get(group, []))

    def _join(self, group: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self._threads.get(group, []):
            thread.join(max(0.0, deadline - time.monotonic()))

    @staticmethod
    def _thread_main(target) -> None:
        try:
            target()
        finally:
            connection.close()  # this thread's own connection

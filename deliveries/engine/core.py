"""The delivery engine: parts wired together, as steps and as threads.

Tests drive the steps (`recover_once`, `intake_once`, `process_one`) synchronously;
`run()` starts the threads that call the same steps forever.
"""

import logging
import threading
import time

from django.conf import settings
from django.db import connection
from django.db.models import Max, Min
from django.db.utils import DatabaseError
from django.utils import timezone

from deliveries import metrics
from deliveries.engine import heartbeat
from deliveries.engine.breaker import Breakers, CircuitBreaker
from deliveries.engine.channel import Channel
from deliveries.engine.claims import Claimer, Overflow
from deliveries.engine.gate import TargetGate
from deliveries.engine.inflight import InflightSet
from deliveries.engine.intake import Intake
from deliveries.engine.recovery import recover
from deliveries.engine.scheduler import RetryScheduler
from deliveries.engine.workers import decide, log_attempt, timed_call
from deliveries.engine.writer import ResultWriter
from deliveries.models import Delivery
from deliveries.retention import prune_events
from deliveries.targets import TARGET_TYPES

logger = logging.getLogger("deliveries.engine")


class Engine:
    HEARTBEAT_INTERVAL = 5.0
    # How often an idle worker looks up from the channel to see whether to stop.
    WORKER_WAKE = 0.5
    # A result that could not be written (database down) is tried again this much
    # later, the delivery still owned: the attempt is not sent again meanwhile.
    WRITE_RETRY = 5.0
    # Graceful stop waits this long for running attempts: the longest per-target
    # timeout a config may set, plus a margin.
    DRAIN_TIMEOUT = 310.0
    # Retention runs a minute after start, then daily.
    PRUNE_FIRST = 60.0
    PRUNE_INTERVAL = 24 * 3600.0

    def __init__(
        self,
        *,
        workers: int = 10,
        channel_size: int = 10_000,
        poll_interval: float = 1.0,
        recovery_interval: float = 60.0,
        stale_after: float = 900.0,
        recovery_batch: int = 500,
        target_concurrency: int = 4,
        backoff_base: float = 1.0,
        backoff_cap: float = 3600.0,
        name: str = "default",
        breaker_cooldown: float = CircuitBreaker.COOLDOWN,
        clock=time.monotonic,
    ):
        self.workers = workers
        self.poll_interval = poll_interval
        self.recovery_interval = recovery_interval
        self.stale_after = stale_after
        self.recovery_batch = recovery_batch
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.name = name
        self.clock = clock

        self.inflight = InflightSet()
        self.channel = Channel(channel_size)
        self.gate = TargetGate(concurrency=target_concurrency)
        self.overflow = Overflow()
        self.claimer = Claimer(inflight=self.inflight, gate=self.gate, overflow=self.overflow)
        self.scheduler = RetryScheduler(channel=self.channel, inflight=self.inflight, clock=clock)
        self.breakers = Breakers(clock=clock, cooldown=breaker_cooldown)
        self.writer = ResultWriter(on_written=self._written)
        self.intake = Intake(
            claimer=self.claimer, channel=self.channel, dispatch=self.dispatch, clock=clock
        )

        self.stop_event = threading.Event()
        self.wake_event = threading.Event()
        self._busy = 0
        self._busy_lock = threading.Lock()
        self._threads: dict[str, list[threading.Thread]] = {}

    @classmethod
    def from_settings(cls, **overrides):
        options = {
            "workers": settings.DELIVERY_WORKERS,
            "channel_size": settings.DELIVERY_CHANNEL_SIZE,
            "poll_interval": settings.DELIVERY_POLL_INTERVAL,
            "recovery_interval": settings.DELIVERY_RECOVERY_INTERVAL,
            "stale_after": settings.DELIVERY_STALE_AFTER,
            "recovery_batch": settings.DELIVERY_RECOVERY_BATCH,
            "target_concurrency": settings.DELIVERY_TARGET_CONCURRENCY,
            "backoff_base": settings.DELIVERY_BACKOFF_BASE,
            "backoff_cap": settings.DELIVERY_BACKOFF_CAP,
        }
        options.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**options)

    # --- steps -------------------------------------------------------------------

    def recover_once(self, *, at_start=False, now=None) -> int:
        """Run the recovery routine once (see recovery.py); return tasks dispatched."""
        if at_start:
            newest = Delivery.objects.aggregate(newest=Max("id"))["newest"]
            oldest = Delivery.objects.filter(status=Delivery.Status.PENDING).aggregate(
                oldest=Min("id")
            )["oldest"]
            self.intake.start_at(newest or 0, oldest)
        return recover(
            claimer=self.claimer,
            dispatch=self.dispatch,
            room=self.channel.room,
            at_start=at_start,
            stale_after=self.stale_after,
            batch=self.recovery_batch,
            now=now,
            stopping=self.stop_event.is_set,
        )

    def intake_once(self) -> int:
        """One intake pass; return tasks queued."""
        return self.intake.run_once()

    def process_one(self, timeout: float = 0.0) -> bool:
        """Take one task off the channel and process it; False if there was none."""
        task = self.channel.get(timeout)
        if task is None:
            return False
        self.process(task)
        return True

    def dispatch(self, task) -> None:
        """Send a freshly claimed task on its way: now, or at its retry time."""
        if task.status == Delivery.Status.RETRYING and task.next_attempt_at is not None:
            wait = (task.next_attempt_at - timezone.now()).total_seconds()
            self._schedule(task, self.clock() + max(0.0, wait))
        else:
            self.channel.put(task)

    def process(self, task) -> None:
        """Attempt the task, and then its target's parked tasks while any wait."""
        if not self.gate.enter(task):
            return  # parked: the target has its share of workers
        while task is not None:
            try:
                if self.stop_event.is_set():
                    self.release(task)
                else:
                    self.attempt(task)
            except Exception:
                # A bug must cost one delivery's promptness, never a worker, a
                # slot or an ownership reference: the row keeps its status and
                # recovery takes it again.
                logger.exception("delivery %s: unexpected error", task.delivery_id)
                self.release(task)
            finally:
                task = self.gate.leave(task.target_id)

    def attempt(self, task) -> None:
        if task.unwritten is not None:
            self._finish(task, *task.unwritten)
            return
        kind = TARGET_TYPES.get(task.target_type)
        retries = kind is not None and kind.retries and task.max_retries > 0
        breaker = self.breakers.get(task.target_id) if retries else None
        if breaker is not None:
            retry_at = breaker.allow()
            if retry_at is not None:
                # Deferred, not attempted: ownership kept, attempt not counted.
                self._schedule(task, retry_at)
                return
        try:
            outcome, duration_ms = timed_call(task)
        except DatabaseError:
            # Reading a large body failed: the engine's trouble, not the target's.
            logger.warning(
                "delivery %s: database unavailable; trying again shortly",
                task.delivery_id,
                exc_info=True,
            )
            connection.close()
            self._schedule(task, self.clock() + self.WRITE_RETRY)
            return
        if breaker is not None:
            breaker.record(outcome.success)
        status, delay = decide(
            task, outcome, retries=retries, base=self.backoff_base, cap=self.backoff_cap
        )
        log_attempt(task, outcome, status, duration_ms)
        metrics.attempt_made(task.target_type, status, duration_ms)
        self._finish(task, outcome, status, delay, duration_ms)

    def _finish(self, task, outcome, status, delay, duration_ms) -> None:
        """Hand the attempt's result to the writer, with the task's reference.

        With the writer's thread running (run()), the worker moves on at once;
        when steps are driven directly (tests), the result is written here.
        """
        item = (task, outcome, status, delay, duration_ms)
        if self.writer.running:
            self.writer.submit(item)
        else:
            self.writer.write([item])

    def _written(self, item, written) -> None:
        """After the commit: schedule the retry or let the delivery go."""
        task, outcome, status, delay, duration_ms = item
        if written is None:
            # Not committed: keep the delivery and write the result later, so the
            # attempt itself is never sent twice.
            task.unwritten = (outcome, status, delay, duration_ms)
            self._schedule(task, self.clock() + self.WRITE_RETRY)
            return
        task.unwritten = None
        if written and status == Delivery.Status.RETRYING:
            task.attempts += 1
            task.status = status
            self._schedule(task, self.clock() + delay)
            return
        # The result is committed (invariant 4), so the last reference may go.
        self.release(task)

    def _schedule(self, task, due: float) -> None:
        """Hand the task to the retry scheduler, which takes its own reference."""
        if self.scheduler.schedule(task, due):
            self.inflight.release(task.delivery_id)
        else:  # stopping: the row keeps its status for the next start
            self.release(task)

    def release(self, task) -> None:
        """The engine is done with the task in memory."""
        overflowed = task.target_id in self.overflow
        self.claimer.release(task)
        if overflowed:
            self.wake_event.set()  # the target has room: let intake drain it

    def busy_workers(self) -> int:
        with self._busy_lock:
            return self._busy

    def idle(self) -> bool:
        return (
            self.channel.depth() == 0
            and self.busy_workers() == 0
            and self.writer.pending() == 0
            and self.inflight.held() == self.scheduler.pending()
        )

    # --- threads -----------------------------------------------------------------

    def run(self, *, once: bool = False, listener=None, lock=None) -> int:
        """Recover, then run every part until stop() (or, with once, until idle).

        Returns the exit code: 0, or 1 if the engine lock was lost while running.
        """
        self.lock = lock
        self.exit_code = 0
        heartbeat.beat(self, starting=True)
        self.recover_once(at_start=True)
        self._spawn("scheduler", self.scheduler.run)
        self._writer_stop = threading.Event()
        self.writer.running = True  # before any worker can finish an attempt
        self._spawn("writer", lambda: self.writer.run(self._writer_stop))
        for n in range(self.workers):
            self._spawn(f"worker-{n}", self._work)
        if not once:
            self._spawn("intake", self._intake_loop)
            self._spawn("recovery", self._recovery_loop)
        self._spawn("heartbeat", self._heartbeat_loop)
        if not once:
            self._spawn("housekeeping", self._housekeeping_loop)
        if listener is not None:
            listener.start()
        try:
            if once:
                self._wait_idle()
            else:
                self.stop_event.wait()
        finally:
            try:
                self.shutdown()
            finally:
                if listener is not None:
                    listener.stop()
        return self.exit_code

    def stop(self) -> None:
        self.stop_event.set()
        self.wake_event.set()

    def shutdown(self, timeout: float | None = None) -> None:
        """Graceful stop (invariant 8): claimants first, then the running attempts."""
        self.stop()
        timeout = self.DRAIN_TIMEOUT if timeout is None else timeout
        for name in ("intake", "recovery"):
            self._join(name, timeout)
        for task in self.scheduler.stop():
            self.release(task)  # stays `retrying` with its next_attempt_at
        self._join("workers", timeout)
        # Every running attempt has handed its result over: write them all.
        if hasattr(self, "_writer_stop"):
            self._writer_stop.set()
            self._join("writer", timeout)
        for task in self.channel.drain() + self.gate.drain_parked():
            self.release(task)  # never attempted: still `pending` in the database
        self._join("scheduler", 1)
        self._join("heartbeat", timeout)
        self._join("housekeeping", timeout)
        try:
            connection.close_if_unusable_or_obsolete()
            heartbeat.beat(self, stopped=True)
        except Exception:
            logger.warning("could not record the engine's stop", exc_info=True)
        connection.close()

    def _spawn(self, name, target):
        group = "workers" if name.startswith("worker-") else name
        thread = threading.Thread(target=self._thread_main, args=(target,), name=name, daemon=True)
        self._threads.setdefault(group, []).append(thread)
        thread.start()

    def _join(self, group, timeout):
        deadline = time.monotonic() + timeout
        for thread in self._threads.get(group, []):
            thread.join(max(0.0, deadline - time.monotonic()))

    @staticmethod
    def _thread_main(target):
        try:
            target()
        finally:
            connection.close()  # this thread's own connection

    def _guarded(self, step, what):
        """Run one step; a failure is logged and retried later, never fatal."""
        try:
            return step()
        except Exception:
            logger.exception("%s failed; retrying", what)
            connection.close()
            self.stop_event.wait(1.0)
            return 0

    def _work(self):
        while not self.stop_event.is_set():
            task = self.channel.get(self.WORKER_WAKE)
            if task is None:
                continue
            # Long-lived threads get no request signals: drop a connection that
            # broke or outlived CONN_MAX_AGE here, before it fails a write.
            connection.close_if_unusable_or_obsolete()
            with self._busy_lock:
                self._busy += 1
            try:
                self.process(task)
            finally:
                with self._busy_lock:
                    self._busy -= 1

    def _intake_loop(self):
        while not self.stop_event.is_set():
            connection.close_if_unusable_or_obsolete()
            while (
                self._guarded(self.intake_once, "intake") or self.intake.more
            ) and not self.stop_event.is_set():
                pass
            self.wake_event.wait(self.poll_interval)
            self.wake_event.clear()

    def _recovery_loop(self):
        while not self.stop_event.wait(self.recovery_interval):
            connection.close_if_unusable_or_obsolete()
            self._guarded(self.recover_once, "recovery")

    def _heartbeat_loop(self):
        while not self.stop_event.wait(self.HEARTBEAT_INTERVAL):
            if self.lock is not None and not self.lock.alive():
                # Another engine may start now: two inflight sets would send
                # duplicates, so this one stops.
                logger.error("the engine lock was lost; stopping")
                self.exit_code = 1
                self.stop()
                return
            connection.close_if_unusable_or_obsolete()
            self._guarded(lambda: heartbeat.beat(self), "heartbeat")

    def _housekeeping_loop(self):
        wait = self.PRUNE_FIRST
        while not self.stop_event.wait(wait):
            wait = self.PRUNE_INTERVAL
            connection.close_if_unusable_or_obsolete()
            removed = self._guarded(prune_events, "retention")
            if removed:
                logger.info(
                    "retention: pruned %d events, %d deliveries, %d results",
                    removed["events"],
                    removed["deliveries"],
                    removed["results"],
                )

    def _wait_idle(self):
        """For --once: intake from this thread until a pass finds nothing to do."""
        while not self.stop_event.is_set():
            queued = self._guarded(self.intake_once, "intake")
            if not queued and self.idle():
                return
            self.stop_event.wait(0.05)

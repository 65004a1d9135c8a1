"""The delivery engine's parts, and the steps one delivery goes through.

claim ──▶ attempt ──▶ finish ──▶ schedule (a retry) or release

* claim: `recover_once` and `intake_once` read candidate rows and claim them
  through the inflight set (claims.Claimer), then `dispatch` puts each on the
  channel, or on the retry scheduler when its backoff is not over.
* attempt: `process` takes a task through the target's concurrency gate and
  `attempt` sends it (attempts.attempt), behind the target's circuit breaker.
* finish: the result goes to the writer; once it is committed, `written` either
  schedules the next attempt or releases the task (invariant 4).

This class owns no thread. Tests call the steps directly on their own thread;
`runner.Runner` starts the threads that call the same steps in loops.
"""

import logging
import threading
import time

from django.db import connection
from django.db.models import Max, Min
from django.db.utils import DatabaseError
from django.utils import timezone

from deliveries import metrics
from deliveries.engine import attempts
from deliveries.engine.attempts import AttemptResult
from deliveries.engine.breaker import Breakers
from deliveries.engine.channel import Channel
from deliveries.engine.claims import Claimer, Overflow, read_body
from deliveries.engine.config import EngineConfig
from deliveries.engine.gate import TargetGate
from deliveries.engine.inflight import InflightSet
from deliveries.engine.intake import Intake
from deliveries.engine.recovery import recover
from deliveries.engine.scheduler import RetryScheduler
from deliveries.engine.task import Task
from deliveries.engine.writer import ResultWriter, Written
from deliveries.models import Delivery

logger = logging.getLogger("deliveries.engine")


class Engine:
    # A result that could not be written (database down), or a body that could
    # not be read, is tried again this much later, the delivery still owned: the
    # attempt is not sent again meanwhile.
    WRITE_RETRY = 5.0

    def __init__(self, config: EngineConfig | None = None, *, clock=time.monotonic):
        self.config = config = config or EngineConfig()
        self.clock = clock
        # Set once: every loop and every step checks it.
        self.stop_event = threading.Event()
        # Set by the wake hint, and when a full target gets room: intake runs now.
        self.wake_event = threading.Event()

        self.inflight = InflightSet()
        self.channel = Channel(config.channel_size)
        self.gate = TargetGate(concurrency=config.target_concurrency)
        self.overflow = Overflow()
        self.claimer = Claimer(inflight=self.inflight, gate=self.gate, overflow=self.overflow)
        self.scheduler = RetryScheduler(channel=self.channel, inflight=self.inflight, clock=clock)
        self.breakers = Breakers(clock=clock, cooldown=config.breaker_cooldown)
        self.writer = ResultWriter(on_written=self.written)
        self.intake = Intake(
            claimer=self.claimer, channel=self.channel, dispatch=self.dispatch, clock=clock
        )

    def stop(self) -> None:
        self.stop_event.set()
        self.wake_event.set()

    # --- claim -------------------------------------------------------------------

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
            stale_after=self.config.stale_after,
            batch=self.config.recovery_batch,
            now=now,
            stopping=self.stop_event.is_set,
        )

    def intake_once(self) -> int:
        """One intake pass; return tasks queued."""
        return self.intake.run_once()

    def dispatch(self, task: Task) -> None:
        """Send a freshly claimed task on its way: now, or at its retry time."""
        if task.status == Delivery.Status.RETRYING and task.next_attempt_at is not None:
            wait = (task.next_attempt_at - timezone.now()).total_seconds()
            self.schedule(task, self.clock() + max(0.0, wait))
        else:
            self.channel.put(task)

    # --- attempt -----------------------------------------------------------------

    def process_one(self, timeout: float = 0.0) -> bool:
        """Take one task off the channel and process it; False if there was none."""
        task = self.channel.get(timeout)
        if task is None:
            return False
        self.process(task)
        return True

    def process(self, task: Task) -> None:
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

    def attempt(self, task: Task) -> None:
        """Attempt the task once, or write the result an earlier turn could not."""
        if task.unwritten is not None:
            self.finish(task.unwritten)
            return
        breaker = self.breakers.get(task.target_id) if attempts.retries(task) else None
        if breaker is not None:
            retry_at = breaker.allow()
            if retry_at is not None:
                # Deferred, not attempted: ownership kept, attempt not counted.
                self.schedule(task, retry_at)
                return
        try:
            body = read_body(task)
        except DatabaseError:
            # The engine's trouble, not the target's: no attempt is made or counted.
            logger.warning(
                "delivery %s: database unavailable; trying again shortly",
                task.delivery_id,
                exc_info=True,
            )
            connection.close()
            self.schedule(task, self.clock() + self.WRITE_RETRY)
            return
        result = attempts.attempt(
            task, body, base=self.config.backoff_base, cap=self.config.backoff_cap
        )
        if breaker is not None:
            breaker.record(result.outcome.success)
        metrics.attempt_made(task.target_type, result.status, result.duration_ms)
        self.finish(result)

    # --- finish ------------------------------------------------------------------

    def finish(self, result: AttemptResult) -> None:
        """Hand the attempt's result to the writer, with the task's reference.

        With the writer's thread running, the worker moves on at once; when steps
        are driven directly (tests, no runner), the result is written here.
        """
        if self.writer.running:
            self.writer.submit(result)
        else:
            self.writer.write([result])

    def written(self, result: AttemptResult, written: Written) -> None:
        """After the writer's transaction: schedule the retry or let the task go."""
        task = result.task
        if written is Written.FAILED:
            task.unwritten = result
            self.schedule(task, self.clock() + self.WRITE_RETRY)
            return
        task.unwritten = None
        if written is Written.COMMITTED and result.status == Delivery.Status.RETRYING:
            task.attempts += 1
            task.status = result.status
            self.schedule(task, self.clock() + result.delay)
            return
        # The result is committed, or the delivery is gone (invariant 4).
        self.release(task)

    # --- schedule / release ------------------------------------------------------

    def schedule(self, task: Task, due: float) -> None:
        """Hand the task to the retry scheduler, which takes its own reference."""
        if self.scheduler.schedule(task, due):
            self.inflight.release(task.delivery_id)
        else:  # stopping: the row keeps its status for the next start
            self.release(task)

    def release(self, task: Task) -> None:
        """The engine is done with the task in memory."""
        overflowed = task.target_id in self.overflow
        self.claimer.release(task)
        if overflowed:
            self.wake_event.set()  # the target has room: let intake drain it

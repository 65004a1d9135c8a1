"""The delivery engine's parts, and the steps one delivery goes through.

claim ──▶ attempt ──▶ finish ──▶ schedule (a retry) or release

* claim: `recover_once` and `intake_once` read candidate rows and claim them
  through the inflight set (claims.Claimer), then `dispatch` puts each on the
  channel, or on the retry scheduler when its backoff is not over.
* attempt: `process` takes a task through the target's concurrency gate and
  `attempt` sends it (attempts.attempt) once the target admits it (its circuit
  breaker and rate limit: targets.EngineTarget.admit).
* finish: the result goes to the writer; once it is committed, `written` either
  schedules the next attempt or releases the task (invariant 4).

This class owns no thread. Tests call the steps directly on their own thread;
`runner.Runner` starts the threads that call the same steps in loops.
"""

import datetime
import logging
import threading
import time

from django.db import connection
from django.db.models import Max, Min
from django.db.utils import DatabaseError
from django.utils import timezone

from deliveries import metrics, tracing, transforms
from deliveries.engine import attempts
from deliveries.engine.attempts import AttemptResult
from deliveries.engine.breaker import CircuitBreaker
from deliveries.engine.channel import Channel
from deliveries.engine.claims import Claimer, read_body
from deliveries.engine.config import EngineConfig
from deliveries.engine.control import TargetControl
from deliveries.engine.inflight import InflightSet
from deliveries.engine.intake import Intake
from deliveries.engine.partitions import Partitions
from deliveries.engine.recovery import recover
from deliveries.engine.scheduler import RetryScheduler
from deliveries.engine.sender import Sender
from deliveries.engine.targets import (
    GONE,
    HELD,
    REORDERED,
    REPOINTED,
    RESUMED,
    EngineTarget,
    Targets,
    give_back_probe,
)
from deliveries.engine.task import Task
from deliveries.engine.writer import NotBefore, ResultWriter, Written
from deliveries.filters import matches
from deliveries.models import Delivery

logger = logging.getLogger("deliveries.engine")


class Engine:
    # A result that could not be written (database down), or a body that could
    # not be read, is tried again this much later, the delivery still owned: the
    # attempt is not sent again meanwhile.
    WRITE_RETRY = 5.0
    # A task whose partition's lease ran out waits this long before it looks again.
    LEASE_WAIT = 0.25

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        clock=time.monotonic,
        partitions: Partitions | None = None,
    ):
        self.config = config = config or EngineConfig()
        self.clock = clock
        # Where this engine may claim and attempt: every target, unless it shares a
        # PostgreSQL database with other engines (partitions.py).
        self.partitions = partitions or Partitions()
        # Set once: every loop and every step checks it.
        self.stop_event = threading.Event()
        # Set by the wake hint, and when a full target gets room: intake runs now.
        self.wake_event = threading.Event()

        self.inflight = InflightSet()
        self.channel = Channel(config.channel_size)
        # Each target's row, gate, overflow, lane, breaker and rate limit (targets.py).
        self.targets = Targets(
            clock=clock,
            concurrency=config.target_concurrency,
            breaker_cooldown=config.breaker_cooldown,
        )
        self.claimer = Claimer(
            inflight=self.inflight, targets=self.targets, partitions=self.partitions
        )
        self.scheduler = RetryScheduler(channel=self.channel, inflight=self.inflight, clock=clock)
        self.control = TargetControl(
            targets=self.targets,
            disable_after=config.disable_after,
            alert_breaker_after=config.alert_breaker_after,
        )
        self.writer = ResultWriter(on_written=self.written, awaited=self.awaited)
        self.sender = Sender(config.inflight)
        self.intake = Intake(
            claimer=self.claimer,
            channel=self.channel,
            dispatch=self.dispatch,
            hurry=self.hurry,
            clock=clock,
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
        return self.recover_in(self.partitions.filter, at_start=at_start, now=now)

    def recover_in(self, narrow, *, at_start=True, now=None) -> int:
        """The recovery routine over the rows `narrow` keeps (handover.Handover.take
        runs it over partitions just taken)."""
        return recover(
            claimer=self.claimer,
            dispatch=self.dispatch,
            room=self.channel.room,
            at_start=at_start,
            stale_after=self.config.stale_after,
            batch=self.config.recovery_batch,
            now=now,
            stopping=self.stop_event.is_set,
            narrow=narrow,
        )

    def intake_once(self) -> int:
        """Bring the targets up to date, then one intake pass; return tasks queued."""
        self.refresh_targets()
        return self.intake.run_once()

    def current_targets(self) -> None:
        """Check the targets' rows now if the last check began over FRESH seconds
        ago (Targets.stale): an attempt never uses an older row than that."""
        if self.targets.stale():
            self.refresh_targets(if_stale=True)

    def refresh_targets(self, *, force: bool = False, if_stale: bool = False) -> None:
        """Act on what changed in the targets' rows (targets.Targets.refresh)."""
        for target, what in self.targets.refresh(force=force, if_stale=if_stale):
            if what in (GONE, HELD, REORDERED):
                # Deleted (its rows went with it), paused or deactivated (its rows
                # wait in the database), or its order changed (read again below).
                self._let_go(target)
            if what in (RESUMED, REORDERED):
                self._take_up(target)
            if what == REPOINTED:
                self._send_deferred(target.id)  # a fresh breaker: no reason to wait

    def _let_go(self, target: EngineTarget) -> None:
        """Drop the target's waiting tasks from memory; attempts running finish."""
        waiting = self.scheduler.take(lambda t: t.target_id == target.id)
        for task in waiting + target.forget():
            self.release(task)

    def _take_up(self, target: EngineTarget) -> None:
        """Read the target's unfinished deliveries again, from the oldest."""
        if not self.partitions.may_claim(target.id):
            return  # another engine's
        if target.row.ordered:
            self.targets.note_lane(target.id)
        else:
            self.targets.note_overflow(target.id, 0)
        self.wake_event.set()

    def hurry(self, delivery_ids) -> None:
        """Rows set back to pending while their task waits here for its retry (the
        admin's "retry now"): attempt them now. A task waiting for its breaker or a
        rate-limit slot waits on: that wait protects the receiver, not a backoff."""
        ids = set(delivery_ids)
        waiting = self.scheduler.take(
            lambda t: (
                t.delivery_id in ids
                and t.status == Delivery.Status.RETRYING
                and not (t.deferred or t.slotted)
            )
        )
        for task in waiting:
            task.status = Delivery.Status.PENDING  # as the row says now
            self.channel.put(task)

    def _send_deferred(self, target_id: int) -> None:
        """The target's breaker closed (or was reset): its deferred tasks go now."""
        for task in self.scheduler.take(lambda t: t.target_id == target_id and t.deferred):
            task.deferred = False
            self.channel.put(task)

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

    def process(self, task: Task) -> bool:
        """Attempt the task, and then its target's parked tasks while any wait.
        True when an attempt went on in flight (sender.py): its completion then
        leaves the target's gate, and the room the worker reserved is its."""
        if not self.targets.enter(task):
            return False  # parked: the target has its share of attempts running
        while task is not None:
            try:
                if self.stop_event.is_set():
                    self.release(task)
                elif self.attempt(task):
                    return True
            except Exception:
                # A bug must cost one delivery's promptness, never a worker, a
                # slot or an ownership reference: the row keeps its status and
                # recovery takes it again.
                logger.exception("delivery %s: unexpected error", task.delivery_id)
                give_back_probe(task)
                self.release(task)
            task = self.targets.leave(task.target_id)
        return False

    def attempt(self, task: Task) -> bool:
        """Attempt the task once, with its target as it is now, or write the result
        an earlier turn could not. True when the attempt is in flight on the HTTP
        client's loop (completed() takes it from there)."""
        # Back from its transform (transformed()): the shaped copy, used this turn only.
        shaped, task.shaped = task.shaped, None
        if task.unwritten is not None and self.partitions.holds(task.target_id):
            self.finish(task.unwritten)
            return False
        if not self.partitions.claimed_under(task.target_id, task.fence):
            # Its partition is being handed over, or is gone with the lock
            # connection (and perhaps taken again since, under a new epoch): the
            # row keeps its status for whoever holds it now.
            self.let_stale_go(task)
            return False
        try:
            self.current_targets()
        except DatabaseError:
            self._database_trouble(task)
            return False
        target = self.targets.get(task.target_id)
        if target is None or target.row.held:
            # Deleted (its rows went with it), or paused or inactive (its rows wait
            # in the database, and are read again when it is resumed).
            self.release(task)
            return False
        task.target = state = target.row
        if state.unreadable:
            self.finish(
                attempts.unreadable(
                    task,
                    state.unreadable,
                    base=self.config.backoff_base,
                    cap=self.config.backoff_cap,
                )
            )
            return False
        # Filters, then the transform: before the breaker and the rate limit, so an
        # event the target does not take holds neither a probe nor a slot. A task
        # back from its transform has been through both.
        sent, body = task, None
        if shaped is not None:
            sent, body = shaped
            sent.target = state
        elif state.filters or state.transform:
            try:
                body = read_body(task)
            except DatabaseError:
                self._database_trouble(task)
                return False
            if state.filters and not matches(
                state.filters, task.headers, body, event_type=task.event_type
            ):
                self.finish(attempts.filtered(task))
                return False
            if state.transform:
                return self.transform(task, body)
        if not self.partitions.may_attempt(task.target_id):
            # The lease ran out (the lock connection silent, or this process just
            # woke from a pause): nothing is sent until a round trip confirms the
            # locks stand. The task waits here, still owned, before it takes a
            # breaker's probe or a rate-limit slot; if the locks are gone, the
            # partitions thread drops it with everything else.
            self.schedule(task, self.clock() + self.LEASE_WAIT)
            return False
        come_back = target.admit(task, self.clock())
        if come_back is not None:  # its breaker, or its rate limit, says later
            self.schedule(task, come_back)
            return False
        try:
            body = read_body(task) if body is None else body
        except DatabaseError:
            give_back_probe(task)
            self._database_trouble(task)
            return False
        if not self.partitions.may_attempt(task.target_id):
            # It ran out while the body was read: checked again just before sending.
            give_back_probe(task)
            self.schedule(task, self.clock() + self.LEASE_WAIT)
            return False
        # Its span (tracing.py), from here to the result: the receiver is told it.
        task.span = sent.span = tracing.attempt(task)
        req = attempts.request(sent, body) if self.sender.running else None
        if req is not None:
            # Checked again when the loop starts it: a loop that stalled (the
            # process frozen) past the lease sends nothing that waited on it.
            req.may_send = lambda: self.partitions.may_attempt(task.target_id)
            start = time.monotonic()
            self.sender.send(req, lambda outcome: self.completed(task, outcome, start))
            return True
        result = attempts.attempt(
            task, body, base=self.config.backoff_base, cap=self.config.backoff_cap, sent=sent
        )
        self.attempted(task, result)
        return False

    def transform(self, task: Task, body: bytes) -> bool:
        """Run the target's transform: on the worker processes' own time when the
        engine runs (True: in flight, transformed() takes it from there, the room
        and the gate's slot with it), else here and now (steps driven by tests)."""
        start = time.monotonic()
        if self.sender.running:
            key = self.sender.track()
            try:
                transforms.submit(
                    task, body, lambda shaped: self.transformed(task, shaped, start, key)
                )
            except BaseException:
                self.sender.untrack(key)
                raise
            return True
        try:
            shaped = transforms.for_task(task, body)
        except transforms.TransformError as exc:
            shaped = exc
        return self._after_transform(task, shaped, start)

    def transformed(self, task: Task, shaped, start: float, key: int) -> None:
        """A transform in flight came back (on a transform reader thread): the
        attempt goes on from where it left off, or ends; then, unless it went on in
        flight, the room and the gate's slot are given back as completed() does."""
        try:
            if self.stop_event.is_set():
                self.release(task)
            elif self._after_transform(task, shaped, start):
                return  # the HTTP attempt in flight holds the room and the slot now
        except Exception:
            logger.exception("delivery %s: unexpected error", task.delivery_id)
            give_back_probe(task)
            self.release(task)
        finally:
            self.sender.untrack(key)
        self.sender.unreserve()
        following = self.targets.vacate(task.target_id)
        if following is not None:
            self.channel.put(following)

    def _after_transform(self, task: Task, shaped, start: float) -> bool:
        """The transform's answer: the delivery fails, is dropped, or the attempt goes
        on with the shaped copy (attempt(), True when it went in flight)."""
        if isinstance(shaped, transforms.TransformError):
            self.finish(attempts.transform_failed(task, str(shaped), start))
            return False
        if shaped is None:
            self.finish(attempts.filtered(task, transforms.DROPPED))
            return False
        task.shaped = shaped
        return self.attempt(task)

    def completed(self, task: Task, outcome, start: float) -> None:
        """An attempt in flight came back (on the sender's completer thread): its
        result, then its slot of the target's gate. The target's next parked task
        goes back to the workers, who take the slot for it."""
        try:
            if outcome.held_back:  # the lease ran out before the loop sent it
                give_back_probe(task)
                self.schedule(task, self.clock() + self.LEASE_WAIT)
            else:
                result = attempts.conclude(
                    task, outcome, start, base=self.config.backoff_base, cap=self.config.backoff_cap
                )
                self.attempted(task, result)
        except Exception:
            logger.exception("delivery %s: unexpected error", task.delivery_id)
            give_back_probe(task)
            self.release(task)
        following = self.targets.vacate(task.target_id)
        if following is not None:
            self.channel.put(following)

    def attempted(self, task: Task, result: AttemptResult) -> None:
        """What an attempt made tells its target's breaker; the result to the writer."""
        task.probing, breaker = False, task.breaker  # recorded just below
        if breaker is not None:
            change = breaker.record(result.outcome.success)
            if change == CircuitBreaker.CLOSED:
                self._send_deferred(task.target_id)  # the probe got through
            elif change == CircuitBreaker.OPEN:
                self._date_deferred(task.target_id, breaker.opened_until, task.fence)
            if result.status == Delivery.Status.RETRYING and breaker.is_open:
                # Its retry cannot go before the breaker lets it: schedule it, and
                # say it, for then; a probe that gets through sends it sooner.
                wait = breaker.opened_until - self.clock()
                if wait > result.delay:
                    result.delay = wait
                    task.deferred = True
        metrics.attempt_made(task.target.type, result.status, result.duration_ms)
        self.finish(result)

    def _database_trouble(self, task: Task) -> None:
        # The engine's trouble, not the target's: no attempt is made or counted.
        logger.warning(
            "delivery %s: database unavailable; trying again shortly",
            task.delivery_id,
            exc_info=True,
        )
        connection.close()
        self.schedule(task, self.clock() + self.WRITE_RETRY)

    def _date_deferred(self, target_id: int, until: float, fence=None) -> None:
        """The breaker opened: the target's unfinished deliveries will not be tried
        before `until`, so their next_attempt_at says so (the admin shows it).
        Under the epoch of the attempt that opened it (`fence`, a task's), as the
        attempt's own result."""
        at = timezone.now() + datetime.timedelta(seconds=max(0.0, until - self.clock()))
        self._write(NotBefore(target_id, at, fence))

    def alert_once(self) -> int:
        """Raise the alerts that are due (breakers open too long, targets that
        paused themselves, client certificates near their end) and send them;
        return how many went out."""
        self.control.breakers_open(self.targets.not_closed(), self.clock())
        self.control.certificates_expiring(self.clock())
        return self.control.send_alerts()

    def breaker_states(self) -> dict:
        """Every breaker that is not closed, as the heartbeat row publishes them."""
        now, wall = self.clock(), timezone.now()

        def at(clock_time):
            return (wall + datetime.timedelta(seconds=clock_time - now)).isoformat()

        return {
            str(target_id): {
                "state": breaker.state,
                "since": at(breaker.open_since) if breaker.open_since is not None else None,
                "until": at(breaker.opened_until),
            }
            for target_id, breaker in self.targets.not_closed().items()
        }

    # --- finish ------------------------------------------------------------------

    def finish(self, result: AttemptResult) -> None:
        """Hand the attempt's result to the writer, with the task's reference.

        With the writer's thread running, the worker moves on at once; when steps
        are driven directly (tests, no runner), the result is written here.
        """
        self._write(result)

    def _write(self, item) -> None:
        if self.writer.running:
            self.writer.submit(item)
        else:
            self.writer.write([item])

    def awaited(self, item) -> bool:
        """Whether the next claim of the item's target waits for its write: an
        ordered target's next delivery, or one of a target at its max_queue_size,
        goes only once this one is released, which follows its write."""
        task = getattr(item, "task", None)
        if task is None:
            return False
        return bool(task.target is not None and task.target.ordered) or (
            self.targets.overflowing(task.target_id)
        )

    def written(self, result: AttemptResult, written: Written) -> None:
        """After the writer's transaction: schedule the retry or let the task go."""
        task = result.task
        if written is Written.FAILED:
            task.unwritten = result
            self.schedule(task, self.clock() + self.WRITE_RETRY)
            return
        task.unwritten = None
        if written is Written.STALE:
            if self.partitions.forfeit(task.fence):
                logger.warning(
                    "partition %s was taken from this engine (epoch %s is stale): "
                    "claiming nothing more there",
                    *task.fence,
                )
            self.let_stale_go(task)
            return
        if written is Written.COMMITTED and self._control_after(result):
            # The target paused itself: make sure nothing more of it is sent.
            self.refresh_targets(force=True)
        if written is Written.COMMITTED and result.status == Delivery.Status.RETRYING:
            task.attempts += 1
            task.status = result.status
            self.schedule(task, self.clock() + result.delay)
            return
        # The result is committed, or the delivery is gone (invariant 4).
        self.release(task, next_head=written is Written.COMMITTED)

    def _control_after(self, result: AttemptResult) -> bool:
        """The target's control state after a committed result (control.py); a
        database error there costs the bookkeeping of this one result, never the
        result itself or the task's next step."""
        try:
            return self.control.after(result)
        except DatabaseError:
            logger.warning(
                "delivery %s: could not update its target's state",
                result.task.delivery_id,
                exc_info=True,
            )
            connection.close()
            return False

    # --- schedule / release ------------------------------------------------------

    def schedule(self, task: Task, due: float) -> None:
        """Hand the task to the retry scheduler, which takes its own reference."""
        if not self.partitions.holds(task.target_id):
            # The lock connection went: another engine may own the row now. Its
            # committed status (retrying, next_attempt_at) is what the next owner
            # reads; an unwritten result is dropped rather than written over it.
            self.let_stale_go(task)
        elif self.scheduler.schedule(task, due):
            self.inflight.release(task.delivery_id)
        else:  # stopping: the row keeps its status for the next start
            self.release(task)

    def let_stale_go(self, task: Task) -> None:
        """Release a task claimed under ownership this engine lost. If it has taken
        the partition again since, its at-start recovery there skipped this task
        (held here then): the row is read again now, under the current epoch."""
        self.release(task)
        if not self.partitions.may_claim(task.target_id):
            return
        try:
            found = self.recover_in(lambda rows: rows.filter(id=task.delivery_id))
        except DatabaseError:
            logger.warning("delivery %s: could not read it again", task.delivery_id, exc_info=True)
            found = 0
        if not found:
            # Not read again (the channel full, or the database failing): a pending
            # row is drained with its target's overflow, a retrying one found by the
            # recovery tick.
            self.targets.note_overflow(task.target_id, task.delivery_id)
            self.wake_event.set()

    def release(self, task: Task, *, next_head: bool = False) -> None:
        """The engine is done with the task in memory. With `next_head` (its result
        just committed), an ordered target's next head is claimed here and now."""
        overflowed = self.targets.overflowing(task.target_id)
        self.claimer.release(task)
        head = self.targets.head_done(task.target_id, task.delivery_id)
        if head and next_head and self._next_head(task.target_id):
            head = False  # no intake pass needed for it
        if overflowed or head:
            self.wake_event.set()  # the target has room, or its next head may go

    def _next_head(self, target_id: int) -> bool:
        """An ordered target's head is done: its next one goes now, not after the
        next intake pass. False if it could not be read here (intake reads it)."""
        if self.stop_event.is_set() or self.channel.room() == 0:
            return False
        try:
            self.intake.head(target_id)
        except DatabaseError:
            logger.warning("target %s: could not read its next head", target_id, exc_info=True)
            connection.close()
            return False
        return True

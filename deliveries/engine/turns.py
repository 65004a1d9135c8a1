"""A task's turn: from the worker that takes it to its result committed.

check ──▶ shape ──▶ admit ──▶ send ──▶ conclude ──▶ written

* check: a result an earlier turn could not write is written instead; the task's
  partition must still be held under its epoch (else it is let go as stale); the
  target as it is now (deleted or held: released, its rows wait in the database;
  secrets no key opens: failed, as the target's configuration's fault).
* shape: the target's filters (no match: filtered) and its transform (dropped:
  filtered; an error: failed), before the breaker and the rate limit, so an event
  the target does not take holds neither a probe nor a slot.
* admit: the lease confirmed, then the target's one decision
  (targets.EngineTarget.admit): now, or the time its breaker or rate limit says.
* send: on the HTTP client's loop (sender.py) when the engine runs, else here on
  the caller's thread (steps driven by tests).
* conclude: the outcome tells the target's breaker; the result goes to the writer.
* written: after the writer's transaction, the next attempt is scheduled or the
  task released (invariant 4): the engine's own steps (core.py).
"""

import datetime
import logging
import time

from django.db import connection
from django.db.utils import DatabaseError
from django.utils import timezone

from deliveries import bodies, metrics, tracing, transforms
from deliveries.engine import attempts
from deliveries.engine.attempts import AttemptResult
from deliveries.engine.breaker import CircuitBreaker
from deliveries.engine.claims import read_body
from deliveries.engine.targets import give_back_probe
from deliveries.engine.task import Task
from deliveries.engine.writer import NotBefore, Written
from deliveries.filters import matches
from deliveries.models import Delivery

logger = logging.getLogger("deliveries.engine")


class Turns:
    # A result that could not be written (database down), or a body that could
    # not be read, is tried again this much later, the delivery still owned: the
    # attempt is not sent again meanwhile.
    WRITE_RETRY = 5.0
    # A task whose partition's lease ran out waits this long before it looks again.
    LEASE_WAIT = 0.25
    # A task whose body file cannot be read (bodies.Unreadable) looks again this much later.
    BODY_RETRY = 60.0

    def __init__(self, engine):
        # The engine's ownership steps (schedule, release, let_stale_go) and its
        # writer; its parts a turn uses, by name.
        self.engine = engine
        self.partitions = engine.partitions
        self.targets = engine.targets
        self.config = engine.config
        self.clock = engine.clock
        self.sender = engine.sender
        self.channel = engine.channel
        self.control = engine.control
        self.stop_event = engine.stop_event

    def attempt(self, task: Task) -> bool:
        """Attempt the task once, with its target as it is now, or write the result
        an earlier turn could not. True when the attempt is in flight on the HTTP
        client's loop (completed() takes it from there)."""
        # Back from its transform (transformed()): the shaped copy, used this turn only.
        shaped, task.shaped = task.shaped, None
        if task.unwritten is not None:
            # Its attempt was sent: the result is written under the epoch it was
            # claimed in, which the writer checks, whether or not this engine
            # holds the partition now (handover.Handover.drop_all).
            self.finish(task.unwritten)
            return False
        if not self.partitions.claimed_under(task.target_id, task.fence):
            # Its partition is being handed over, or is gone with the lock
            # connection (and perhaps taken again since, under a new epoch): the
            # row keeps its status for whoever holds it now.
            self.engine.let_stale_go(task)
            return False
        try:
            self.engine.current_targets()
        except DatabaseError:
            self._database_trouble(task)
            return False
        target = self.targets.get(task.target_id)
        if target is None or target.row.held:
            # Deleted (its rows went with it), or paused or inactive (its rows wait
            # in the database, and are read again when it is resumed).
            self.engine.release(task)
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
            except bodies.Unreadable as exc:
                self._body_trouble(task, exc)
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
            self.engine.schedule(task, self.clock() + self.LEASE_WAIT)
            return False
        come_back = target.admit(task, self.clock())
        if come_back is not None:  # its breaker, or its rate limit, says later
            self.engine.schedule(task, come_back)
            return False
        try:
            body = read_body(task) if body is None else body
        except DatabaseError:
            give_back_probe(task)
            self._database_trouble(task)
            return False
        except bodies.Unreadable as exc:
            give_back_probe(task)
            self._body_trouble(task, exc)
            return False
        if not self.partitions.may_attempt(task.target_id):
            # It ran out while the body was read: checked again just before sending.
            give_back_probe(task)
            self.engine.schedule(task, self.clock() + self.LEASE_WAIT)
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
                self.engine.release(task)
            elif self._after_transform(task, shaped, start):
                return  # the HTTP attempt in flight holds the room and the slot now
        except Exception:
            logger.exception("delivery %s: unexpected error", task.delivery_id)
            give_back_probe(task)
            self.engine.release(task)
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
                self.engine.schedule(task, self.clock() + self.LEASE_WAIT)
            else:
                result = attempts.conclude(
                    task, outcome, start, base=self.config.backoff_base, cap=self.config.backoff_cap
                )
                self.attempted(task, result)
        except Exception:
            logger.exception("delivery %s: unexpected error", task.delivery_id)
            give_back_probe(task)
            self.engine.release(task)
        following = self.targets.vacate(task.target_id)
        if following is not None:
            self.channel.put(following)

    def attempted(self, task: Task, result: AttemptResult) -> None:
        """What an attempt made tells its target's breaker; the result to the writer."""
        task.probing, breaker = False, task.breaker  # recorded just below
        if breaker is not None:
            change = breaker.record(result.outcome.success)
            if change == CircuitBreaker.CLOSED:
                self.engine.send_deferred(task.target_id)  # the probe got through
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
        self.engine.schedule(task, self.clock() + self.WRITE_RETRY)

    def _body_trouble(self, task: Task, exc: bodies.Unreadable) -> None:
        # Nobody's attempt: the delivery waits, owned, for its file to come back
        # (an ordered target's lane with it) rather than circling through recovery.
        logger.warning(
            "delivery %s: %s; trying again in %d s", task.delivery_id, exc, self.BODY_RETRY
        )
        self.engine.schedule(task, self.clock() + self.BODY_RETRY)

    def _date_deferred(self, target_id: int, until: float, fence=None) -> None:
        """The breaker opened: the target's unfinished deliveries will not be tried
        before `until`, so their next_attempt_at says so (the admin shows it).
        Under the epoch of the attempt that opened it (`fence`, a task's), as the
        attempt's own result."""
        at = timezone.now() + datetime.timedelta(seconds=max(0.0, until - self.clock()))
        self._write(NotBefore(target_id, at, fence))

    def finish(self, result: AttemptResult) -> None:
        """Hand the attempt's result to the writer, with the task's reference.

        With the writer's thread running, the worker moves on at once; when steps
        are driven directly (tests, no runner), the result is written here.
        """
        self._write(result)

    def _write(self, item) -> None:
        if self.engine.writer.running:
            self.engine.writer.submit(item)
        else:
            self.engine.writer.write([item])

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
            self.engine.schedule(task, self.clock() + self.WRITE_RETRY)
            return
        task.unwritten = None
        if written is Written.STALE:
            fence = self.partitions.retaken(task.fence)
            if fence is not None:
                # Lost and taken back by this engine alone: the attempt was sent,
                # and nobody else claimed the row meanwhile; its result is written
                # under the new epoch rather than the event sent again.
                task.fence, task.unwritten = fence, result
                self._write(result)
                return
            if self.partitions.forfeit(task.fence):
                logger.warning(
                    "partition %s was taken from this engine (epoch %s is stale): "
                    "claiming nothing more there",
                    *task.fence,
                )
            self.engine.let_stale_go(task)
            return
        if written is Written.COMMITTED and self._control_after(result):
            # The target paused itself: make sure nothing more of it is sent.
            self.engine.refresh_targets(force=True)
        if written is Written.COMMITTED and result.status == Delivery.Status.RETRYING:
            task.attempts += 1
            task.status = result.status
            self.engine.schedule(task, self.clock() + result.delay)
            return
        # The result is committed, or the delivery is gone (invariant 4).
        self.engine.release(task, next_head=written is Written.COMMITTED)

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

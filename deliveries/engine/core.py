"""The delivery engine's parts, and the steps one delivery goes through.

claim ──▶ attempt ──▶ finish ──▶ schedule (a retry) or release

* claim: `recover_once` and `intake_once` read candidate rows and claim them
  through the inflight set (claims.Claimer), then `dispatch` puts each on the
  channel, or on the retry scheduler when its backoff is not over.
* attempt: `process` takes a task through the target's concurrency gate, and its
  turn (turns.Turns.attempt) sends it once the target admits it (its circuit
  breaker and rate limit: targets.EngineTarget.admit).
* finish: the result goes to the writer; once it is committed, the turn ends
  (turns.Turns.written): `schedule` the next attempt, or `release` the task
  (invariant 4).

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

from deliveries.engine.channel import Channel
from deliveries.engine.claims import Claimer
from deliveries.engine.config import EngineConfig
from deliveries.engine.control import TargetControl
from deliveries.engine.handover import let_go
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
from deliveries.engine.turns import Turns
from deliveries.engine.writer import ResultWriter
from deliveries.models import Delivery

logger = logging.getLogger("deliveries.engine")


class Engine:
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
        self.sender = Sender(config.inflight)
        # A task's turn, from a worker taking it to its result committed (turns.py).
        self.turns = Turns(self)
        self.writer = ResultWriter(on_written=self.turns.written, awaited=self.turns.awaited)
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
                self.send_deferred(target.id)  # a fresh breaker: no reason to wait

    def _let_go(self, target: EngineTarget) -> None:
        """Drop the target's waiting tasks from memory; attempts running finish."""
        waiting = self.scheduler.take(lambda t: t.target_id == target.id and t.unwritten is None)
        let_go(self, waiting + target.forget())

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

    def send_deferred(self, target_id: int) -> None:
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
                elif self.turns.attempt(task):
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

    def alert_once(self) -> int:
        """Raise the alerts that are due (breakers open too long, targets that
        paused themselves, client certificates near their end) and send them;
        return how many went out."""
        self.control.breakers_open(self.targets.not_closed(), self.clock())
        self.control.certificates_expiring(self.clock())
        return self.control.send_alerts()

    # --- schedule / release ------------------------------------------------------

    def schedule(self, task: Task, due: float) -> None:
        """Hand the task to the retry scheduler, which takes its own reference."""
        if task.unwritten is None and not self.partitions.holds(task.target_id):
            # The lock connection went: another engine may own the row now. Its
            # committed status (retrying, next_attempt_at) is what the next owner
            # reads. A result not written yet stays: the writer writes it only
            # under its own epoch (handover.Handover.drop_all).
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

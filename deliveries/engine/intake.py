"""Intake: new pending deliveries from the database into the channel.

The inbound view runs in other processes, so the database is the hand-off: intake
reads rows committed since its last pass, woken early by the view's hint and
otherwise polling every DELIVERY_POLL_INTERVAL. Each pass reads no more rows than
the channel has room for.

Three sources, one claim path (claims.Claimer):

* The cursor: rows with an id above the highest seen, in id order. On PostgreSQL
  ids come from a sequence taken at INSERT, so a transaction can commit a lower id
  after a higher one was read. An id skipped by the cursor is remembered as a gap
  and looked up again on every pass for GAP_TTL seconds: a late commit is taken
  within one poll interval, and a gap that never fills (a rolled-back transaction)
  is forgotten.
* Requeued rows: pending rows that were attempted before, i.e. set back to pending
  by a redeliver. Their ids are old, so the cursor cannot see them; a rotating scan
  over a partial index that holds only such rows finds them.
* Overflow: rows skipped because their target already had `max_queue_size` of its
  deliveries in memory. They wait in the database, and once the target has room
  again they are read back from where the skip happened, per target.
"""

import time

from deliveries.engine.claims import CANDIDATE_FIELDS
from deliveries.models import Delivery


class Intake:
    GAP_TTL = 60.0
    MAX_GAPS = 10_000
    # At start the cursor is put this far below the newest id, so rows committed
    # out of order just before the start are read by the first passes.
    START_MARGIN = 1_000

    def __init__(self, *, claimer, channel, dispatch, hurry, clock=time.monotonic):
        self.claimer = claimer
        self.channel = channel
        # Pending rows go to the channel, retrying ones (overflow drains can meet
        # them) to the scheduler at their time: never earlier than their backoff.
        self.dispatch = dispatch
        # Requeued rows the engine already holds for a later retry go now.
        self.hurry = hurry
        self.clock = clock
        self.cursor = 0
        # The highest id the cursor has seen: a gap is a missing id between two
        # seen rows (or above the start margin), never below the first.
        self.last_seen: int | None = None
        self.gap_floor = 0
        self.gaps: dict[int, float] = {}
        self.requeue_pos = 0
        # Set by a pass that read a full page somewhere: more rows may be waiting.
        self.more = False

    def start_at(self, newest_id: int, oldest_pending_id: int | None) -> None:
        """Place the cursor before what the start must still read."""
        low = newest_id - self.START_MARGIN
        if oldest_pending_id is not None:
            low = min(low, oldest_pending_id - 1)
        self.cursor = max(0, low)
        self.gap_floor = max(0, newest_id - self.START_MARGIN)
        self.last_seen = None

    def run_once(self) -> int:
        """One pass over all sources; return how many tasks were dispatched.

        Positions (cursor, gaps, rotations, overflow) move only once the claim of
        what they read has succeeded: a database error mid-pass leaves them where
        they were, and the next pass reads the same rows again.
        """
        dispatched = 0
        self.more = False
        room = self.channel.room()
        for source in (self._from_gaps, self._from_cursor, self._requeued, self._overflowed):
            if room <= 0:
                self.more = True
                break
            rows, commit = source(room)
            tasks = self.claimer.claim(rows)
            commit(tasks)
            for task in tasks:
                self.dispatch(task)
            dispatched += len(tasks)
            room -= len(tasks)
        if room > 0:
            dispatched += self._heads(room)
        return dispatched

    def _heads(self, room) -> int:
        """The next delivery of each ordered target with none in flight."""
        dispatched = 0
        lanes, targets = self.claimer.lanes, self.claimer.targets
        for target_id in lanes.waiting():
            if dispatched >= room:
                self.more = True
                break
            state = targets.get(target_id)
            if (
                state is None
                or state.held
                or not state.ordered
                or not self.claimer.partitions.may_claim(target_id)
            ):
                lanes.forget(target_id)  # taken up again when resumed or made ordered
                continue
            head = list(
                Delivery.objects.unfinished()
                .filter(target_id=target_id)
                .order_by("event__received_at", "event_id", "id")
                .values_list(*CANDIDATE_FIELDS)[:1]
            )
            if not head:
                lanes.forget(target_id)  # noted again when a delivery comes
                continue
            for task in self.claimer.claim(head, head=True):
                lanes.start(target_id, task.delivery_id)
                self.dispatch(task)
                dispatched += 1
        return dispatched

    def _from_gaps(self, room):
        if not self.gaps:
            return [], _nothing
        cutoff = self.clock() - self.GAP_TTL
        for delivery_id in [d for d, seen in self.gaps.items() if seen < cutoff]:
            del self.gaps[delivery_id]
        ids = sorted(self.gaps)[:room]
        if not ids:
            return [], _nothing
        rows = list(Delivery.objects.filter(id__in=ids).values_list(*CANDIDATE_FIELDS))

        def commit(tasks):
            for row in rows:  # filled: committed at last, whatever its status now
                self.gaps.pop(row[0], None)

        return rows, commit

    def _from_cursor(self, room):
        # Every status, not just pending, and every partition: seeing each id is
        # what makes a missing one a gap rather than a finished row or another
        # engine's. The claim drops rows of partitions this engine does not hold;
        # a partition filter here would read the same heap pages anyway (the pk
        # index holds no target).
        rows = list(
            Delivery.objects.filter(id__gt=self.cursor)
            .order_by("id")
            .values_list(*CANDIDATE_FIELDS)[:room]
        )
        if not rows:
            return rows, _nothing

        def commit(tasks):
            now = self.clock()
            for row in rows:
                low = max(self.last_seen or 0, self.gap_floor) + 1
                if self.last_seen is not None and row[0] > low:
                    self._note_gaps(range(low, row[0]), now)
                self.last_seen = max(row[0], self.last_seen or 0)
            self.cursor = rows[-1][0]
            self.more |= len(rows) == room

        return rows, commit

    def _note_gaps(self, ids, now):
        for delivery_id in ids:
            if len(self.gaps) >= self.MAX_GAPS:
                return
            self.gaps[delivery_id] = now

    def _requeued(self, room):
        rows = list(
            self.claimer.partitions.filter(Delivery.objects.requeued())
            .filter(id__gt=self.requeue_pos)
            .order_by("id")
            .values_list(*CANDIDATE_FIELDS)[:room]
        )

        def commit(tasks):
            # Rotate: rows still owned are passed over, and the scan starts again
            # at the beginning once it reaches the end.
            self.requeue_pos = rows[-1][0] if len(rows) == room else 0
            # A row still owned may be waiting here for a retry someone asked to
            # hurry ("retry now" set it back to pending).
            claimed = {task.delivery_id for task in tasks}
            owned = [row[0] for row in rows if row[0] not in claimed]
            if owned:
                self.hurry(owned)

        return rows, commit

    def _overflowed(self, room):
        rows, advances = [], []
        gate = self.claimer.gate
        for target_id, from_id in self.claimer.overflow.items():
            if room <= 0:
                break
            batch = list(
                Delivery.objects.unfinished()
                .filter(target_id=target_id, id__gte=from_id)
                .order_by("id")
                .values_list(*CANDIDATE_FIELDS)[:room]
            )
            if not batch:
                advances.append((target_id, from_id, None))
                continue
            free = batch[0][3] - gate.held(target_id)
            if free <= 0:
                continue
            exhausted = len(batch) < room and len(batch) <= free
            batch = batch[:free]
            advances.append((target_id, from_id, None if exhausted else batch[-1][0]))
            rows.extend(batch)
            room -= len(batch)

        def commit(tasks):
            for advance in advances:
                self.claimer.overflow.advance(*advance)

        return rows, commit


def _nothing(tasks):
    pass

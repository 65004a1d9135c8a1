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
  within one poll interval, and a gap that never fills (a rolled-back transaction,
  a deleted row) is forgotten. Gaps are kept and looked up as runs of consecutive
  ids (`Gaps`): deleting a few thousand recent deliveries makes one run, not a
  few thousand ids to name in every pass's query. Past GAP_RUNS_PER_PASS runs, the
  newest are looked up on every pass and the older ones in turn.
* Requeued rows: pending rows that were attempted before, i.e. set back to pending
  by a redeliver. Their ids are old, so the cursor cannot see them; a rotating scan
  over a partial index that holds only such rows finds them.
* Overflow: rows skipped because their target already had `max_queue_size` of its
  deliveries in memory. They wait in the database, and once the target has room
  again they are read back from where the skip happened, per target.
"""

import bisect
import functools
import operator
import time

from django.db.models import Q

from deliveries.engine import statements
from deliveries.engine.claims import CANDIDATE_FIELDS
from deliveries.models import Delivery


class Gaps:
    """Ids the cursor passed while no row had them, as runs of consecutive ids
    (`[low, high, noted_at]`), in id order, which is also the order they were noted in.

    At most `limit` runs are kept (the oldest dropped: the recovery tick still
    finds a row committed there, a minute late at worst). Each lookup names at most
    `per_lookup` runs (`next_runs`).
    """

    def __init__(self, *, limit: int, per_lookup: int):
        self.limit = limit
        self.per_lookup = per_lookup
        self._runs: list[list] = []
        self._next = 0  # where the next lookup starts, when not every run fits in one

    def note(self, low: int, high: int, now: float) -> None:
        self._runs.append([low, high, now])
        if len(self._runs) > self.limit:
            self._drop(len(self._runs) - self.limit)

    def expire(self, cutoff: float) -> None:
        """Forget the runs noted before `cutoff`."""
        old = 0
        while old < len(self._runs) and self._runs[old][2] < cutoff:
            old += 1
        self._drop(old)

    def _drop(self, count: int) -> None:
        del self._runs[:count]
        self._next = max(0, self._next - count)

    def next_runs(self) -> tuple[list[tuple[int, int]], int]:
        """The runs (low, high) to look up now, and how far the rotation moves on
        once their rows are claimed (`looked_up`). Every run while they fit in one
        lookup; past that, the newest half of `per_lookup` on every pass (a late
        commit is most likely in the gaps the cursor passed last) and the older
        runs in turn, from where the last lookup ended."""
        if len(self._runs) <= self.per_lookup:
            return [(low, high) for low, high, _ in self._runs], 0
        newest = self.per_lookup // 2
        older = len(self._runs) - newest
        if self._next >= older:
            self._next = 0
        window = self._runs[self._next : min(older, self._next + self.per_lookup - newest)]
        runs = window + self._runs[older:]
        return [(low, high) for low, high, _ in runs], len(window)

    def looked_up(self, count: int) -> None:
        self._next += count

    def discard(self, delivery_id: int) -> None:
        """The id was filled: stop looking for it."""
        at = self._run_holding(delivery_id)
        if at is None:
            return
        low, high, noted = self._runs[at]
        pieces = [[low, delivery_id - 1, noted], [delivery_id + 1, high, noted]]
        pieces = [piece for piece in pieces if piece[0] <= piece[1]]
        self._runs[at : at + 1] = pieces
        if at < self._next:
            self._next += len(pieces) - 1

    def _run_holding(self, delivery_id: int) -> int | None:
        """The index of the run that holds `delivery_id`, if one does."""
        at = bisect.bisect_right(self._runs, delivery_id, key=operator.itemgetter(0)) - 1
        return at if at >= 0 and delivery_id <= self._runs[at][1] else None

    def __contains__(self, delivery_id: int) -> bool:
        return self._run_holding(delivery_id) is not None

    def __iter__(self):
        for low, high, _ in self._runs:
            yield from range(low, high + 1)

    def __len__(self) -> int:
        """How many ids are missing."""
        return sum(high - low + 1 for low, high, _ in self._runs)

    def __bool__(self) -> bool:
        return bool(self._runs)


class Intake:
    GAP_TTL = 60.0
    # Runs of missing ids kept, and named in one pass's query.
    MAX_GAP_RUNS = 1_000
    GAP_RUNS_PER_PASS = 50
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
        self.gaps = Gaps(limit=self.MAX_GAP_RUNS, per_lookup=self.GAP_RUNS_PER_PASS)
        self.requeue_pos = 0
        # Set by a pass that read a full page somewhere: more rows may be waiting.
        self.more = False
        # Set by a pass that filled the channel: the next waits for the workers.
        self.full = False

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
            heads = self._heads(room)
            dispatched += heads
            room -= heads
        self.full = room <= 0
        return dispatched

    def _heads(self, room) -> int:
        """The next delivery of each ordered target with none in flight."""
        dispatched = 0
        for target_id in self.claimer.targets.waiting_lanes():
            if dispatched >= room:
                self.more = True
                break
            dispatched += self.head(target_id)
        return dispatched

    def head(self, target_id: int) -> int:
        """Claim and dispatch the ordered target's next delivery; return 1 if there
        was one. Also called as soon as the previous head's result commits
        (turns.Turns.written), so a lane waits for no intake pass."""
        targets = self.claimer.targets
        target = targets.get(target_id)
        if (
            target is None
            or target.row.held
            or not target.row.ordered
            or not self.claimer.partitions.may_claim(target_id)
        ):
            targets.rest_lane(target_id)  # taken up again when resumed or made ordered
            return 0
        if not targets.begin_head(target_id):
            return 0  # its head is in flight, or another thread is reading it
        try:
            claims = self.claimer.partitions.claims  # before the row: see Claimer.claim
            head = statements.run("head", [target_id])
            if not head:
                targets.rest_lane(target_id)  # noted again when a delivery comes
                return 0
            task = self.claimer.claim_head(head[0], claims)
            if task is None:
                return 0
            targets.start_head(target_id, task.delivery_id)
            self.dispatch(task)
            return 1
        finally:
            targets.end_head(target_id)  # a no-op once start_head() made it the head

    def _from_gaps(self, room):
        self.gaps.expire(self.clock() - self.GAP_TTL)
        runs, rotation = self.gaps.next_runs()
        if not runs:
            return [], _nothing
        lookup = functools.reduce(
            operator.or_,
            (Q(id=low) if low == high else Q(id__range=(low, high)) for low, high in runs),
        )
        rows = list(
            Delivery.objects.filter(lookup).order_by("id").values_list(*CANDIDATE_FIELDS)[:room]
        )

        def commit(tasks):
            if len(rows) < room:  # a full page may have left rows in these runs unread
                self.gaps.looked_up(rotation)
            for row in rows:  # filled: committed at last, whatever its status now
                self.gaps.discard(row[0])

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
                    self.gaps.note(low, row[0] - 1, now)
                self.last_seen = max(row[0], self.last_seen or 0)
            self.cursor = rows[-1][0]
            self.more |= len(rows) == room

        return rows, commit

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
        targets = self.claimer.targets
        for target_id, from_id in targets.overflowed():
            if room <= 0:
                break
            batch = statements.run("overflow", [target_id, from_id, room])
            if not batch:
                advances.append((target_id, from_id, None))
                continue
            free = batch[0][3] - targets.held(target_id)
            if free <= 0:
                continue
            exhausted = len(batch) < room and len(batch) <= free
            batch = batch[:free]
            advances.append((target_id, from_id, None if exhausted else batch[-1][0]))
            rows.extend(batch)
            room -= len(batch)

        def commit(tasks):
            for advance in advances:
                targets.advance_overflow(*advance)

        return rows, commit


def _nothing(tasks):
    pass

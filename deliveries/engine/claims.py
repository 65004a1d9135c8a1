"""Turning candidate rows into owned tasks: the one way anything is claimed.

Intake, recovery and the overflow drain all read candidate rows (ids, status,
target), claim each through `InflightSet.retain_idle`, and only then load the rows
whose tasks they build, re-checking the status in that load. The order matters: a
row read before the claim may have been delivered, and its reference released, by
another claimant in between. Because an attempt's result is committed before its
last reference goes (invariant 4), a read that starts after a successful claim sees
that result, and the claim is dropped instead of sending the delivery twice.
An ordered lane's head is read whole and then claimed (`Claimer.claim_head`): it
has no other claimant to race with.
"""

from django.db import connection

from deliveries.engine import statements
from deliveries.engine.task import Task
from deliveries.models import Delivery, Event

# What a claimant reads about each candidate before claiming it.
CANDIDATE_FIELDS = ("id", "status", "target_id", "target__max_queue_size")
LOAD_CHUNK = 500


class Claimer:
    def __init__(self, *, inflight, targets, partitions):
        self.inflight = inflight
        self.targets = targets  # targets.Targets: rows, gates, overflow, lanes
        self.partitions = partitions  # partitions.Partitions

    def claim(self, rows, limit: int | None = None) -> list[Task]:
        """Claim what nobody owns and fits its target's cap (at most `limit` rows);
        return the loaded tasks.

        Rows of a held target (paused, inactive) are left in the database: they are
        read again when it is resumed. Rows of an ordered target are left for its
        lane (targets.py), which claims its head itself (claim_head). Rows of
        partitions this engine may not claim in are another engine's (or nobody's
        until one takes them).
        """
        # Where to claim and under which epochs, read together and before the rows
        # are loaded: a partition lost (and taken again) after this gives its tasks
        # a stale epoch, so their results are refused, never a fresh epoch over
        # rows read under the old one.
        count = self.partitions.count
        claimable, epochs = self.partitions.claims
        rows = [row for row in rows if row[2] % count in claimable]
        self.targets.load({row[2] for row in rows})
        claimed = {}
        for delivery_id, status, target_id, cap in rows:
            if limit is not None and len(claimed) >= limit:
                break
            if status not in Delivery.UNFINISHED:
                continue
            target = self.targets.get(target_id)
            if target is None or target.row.held:
                continue
            if target.row.ordered:
                self.targets.note_lane(target_id)
                continue
            if self._own(target, delivery_id, cap):
                claimed[delivery_id] = target_id
        if not claimed:
            return []
        try:
            tasks = load_tasks(list(claimed))
        except BaseException:
            for delivery_id, target_id in claimed.items():
                self.targets.discharge(target_id)
                self.inflight.release(delivery_id)
            raise
        for task in tasks:
            del claimed[task.delivery_id]
            self._fence(task, epochs)
        for delivery_id, target_id in claimed.items():  # finished meanwhile
            self.targets.discharge(target_id)
            self.inflight.release(delivery_id)
        return tasks

    def claim_head(self, row, claims) -> Task | None:
        """Claim an ordered target's head, read whole (statements "head": the task's
        columns, then its target's max_queue_size); None if it may not go now.
        `claims` is `partitions.claims` as read before the row was (see claim()).

        claim() loads a row only once it owns it, because another claimant may
        have finished the row in between. A head has no other claimant: claim()
        leaves an ordered target's rows to its lane, one thread at a time reads a
        lane's head (Targets.begin_head), and that read began after the previous
        head's result was committed. So the row read is the row claimed, and the
        lane saves a round trip on every delivery."""
        claimable, epochs = claims
        task = Task(**statements.loaded(row[:-1], connection.vendor))
        target = self.targets.get(task.target_id)
        if (
            task.target_id % self.partitions.count not in claimable
            or target is None
            or target.row.held
            # Held already (its retry scheduled), or the target at its cap.
            or not self._own(target, task.delivery_id, row[-1])
        ):
            return None
        self._fence(task, epochs)
        return task

    def _own(self, target, delivery_id: int, cap) -> bool:
        """Take the delivery's first reference and a place in its target's cap;
        a delivery that finds the target full is noted as its overflow."""
        if not self.inflight.retain_idle(delivery_id):
            return False
        if not target.hold(cap):
            self.inflight.release(delivery_id)
            self.targets.note_overflow(target.id, delivery_id)
            return False
        return True

    def _fence(self, task: Task, epochs) -> None:
        """The (partition, epoch) the task's result must be written under."""
        partition = task.target_id % self.partitions.count
        if partition in epochs:
            task.fence = (partition, epochs[partition])

    def release(self, task) -> None:
        self.targets.discharge(task.target_id)
        self.inflight.release(task.delivery_id)


def load_tasks(ids) -> list[Task]:
    ids = list(ids)
    tasks = []
    for start in range(0, len(ids), LOAD_CHUNK):
        chunk = ids[start : start + LOAD_CHUNK]
        params = [statements.ids_parameter(chunk), *Delivery.UNFINISHED]
        rows = statements.run("load", params)
        tasks += [Task(**statements.loaded(row, connection.vendor)) for row in rows]
    return tasks


def read_body(task: Task) -> bytes:
    """The task's body: carried inline when small, else read now.

    Target types never touch the database; the engine hands them the bytes.
    """
    if task.body is not None:
        return task.body
    event = Event.objects.filter(id=task.event_id).only("body", "body_file").first()
    return event.read_body() if event is not None else b""

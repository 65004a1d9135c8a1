"""Many engines, one PostgreSQL: partitioned ownership.

Every delivery belongs to partition `target_id % count` (DELIVERY_PARTITIONS): all
of a target's deliveries in one partition, so per-target state (breaker, gate,
ordered lane, rate limit, target cache) lives in exactly one engine. The partition
is computed, never stored: a column would bake the count into every insert path and
into the rows, and the claim queries need no index of their own for it (see
`in_partitions`).

An engine owns a partition while it holds the session advisory lock
`(LOCK_NAMESPACE, p)` on its lock connection. `Partitions` is the engine's
in-memory view of that (which partitions it may claim in, which it may attempt in);
`partition_manager.PartitionManager` keeps it true: it takes free partitions up to
a fair share, hands its excess over by draining it, and drops everything at once
when the lock connection goes.

On SQLite there is one engine per data directory (the flock) and one partition it
always holds: `Partitions()`.
"""

import logging
import math
import threading

from django.db.models import F

from deliveries.engine.lease import Lease

logger = logging.getLogger("deliveries.engine")

# pg_try_advisory_lock(LOCK_NAMESPACE, p) owns partition p; (MEMBER_NAMESPACE, n) is
# held by every engine's lock connection for its life, so the engines can count each
# other from pg_locks.
LOCK_NAMESPACE = 0x7768  # "wh"
MEMBER_NAMESPACE = 0x7769


def lock_holders(cursor) -> dict[int, list[int]]:
    """{partition: backend pids holding its lock}, read through a DB-API `cursor`
    (the healthy state: one pid for every partition). This database's locks only:
    advisory locks are per database, pg_locks shows the whole server's."""
    cursor.execute(
        "SELECT objid, pid FROM pg_locks WHERE locktype = 'advisory' AND classid = %s "
        "AND objsubid = 2 AND granted AND database = "
        "(SELECT oid FROM pg_database WHERE datname = current_database())",
        [LOCK_NAMESPACE],
    )
    found = {}
    for partition, pid in cursor.fetchall():
        found.setdefault(partition, []).append(pid)
    return found


class SessionUnsupported(Exception):
    """The lock connection does not keep a session across transactions (a
    transaction-mode pooler such as PgBouncer sits in front of it): session advisory
    locks would be taken and lost at random, so the engine refuses to start."""


class PartitionMismatch(Exception):
    """This engine's DELIVERY_PARTITIONS differs from the count recorded in the
    database; the command exits non-zero with this text."""


def fair_share(count: int, live: int) -> int:
    """How many partitions one of `live` engines aims to hold: ceil(count / live)."""
    return math.ceil(count / max(1, live))


def plan(count: int, claimable: set, live: int) -> tuple[int, list]:
    """What the next rebalance does: (how many to take, which to hand over).

    The excess handed over is the highest-numbered partitions: any choice works,
    a fixed one keeps two engines from trading the same partitions back and forth.
    """
    share = fair_share(count, live)
    if len(claimable) > share:
        return 0, sorted(claimable)[share:]
    return share - len(claimable), []


def in_partitions(queryset, partitions, count: int, field: str = "target_id"):
    """`queryset` limited to rows whose target is in `partitions`.

    A residual predicate on the index the query already uses (the pk for the cursor,
    the partial unfinished index for recovery): the filter costs a modulo per row
    read, not an index of its own.
    """
    if count <= 1 or len(partitions) >= count:
        return queryset
    if not partitions:
        return queryset.none()
    return queryset.alias(partition=F(field) % count).filter(partition__in=sorted(partitions))


# Epochs remembered per partition for retaken(): a result kept across more of this
# engine's own takes than this is let go (its event sent again, at least once).
TOOK_KEPT = 16


class Partitions:
    """Which partitions this engine may claim in and attempt in, under which epoch.

    `held`: the partitions whose lock it has; attempts are made only in these, and
    only while the `lease` is valid. `claimable`: held and not being handed over;
    new work is claimed only in these. `epochs`: each held partition's fencing
    token, carried by every task claimed there and checked by its result's write
    (empty on SQLite: one engine, nothing to fence). The sets are replaced whole
    (frozensets), so readers on any thread need no lock; handover.Handover is the
    one writer, but for forfeit() (a result's write refused by its fence).
    """

    def __init__(self, count: int = 1, *, held=None, lease: Lease | None = None):
        self.count = count
        self.lease = lease or Lease.forever()
        self._lock = threading.Lock()
        initial = frozenset(range(count) if held is None else held)
        self.held = initial
        self._set(initial, {})
        # The epochs this engine's takes raised each partition to (took()).
        self._took: dict[int, set[int]] = {}

    def _set(self, claimable, epochs) -> None:
        # `claims` pairs the two, replaced in one assignment: a claimant reads
        # where it may claim and under which epochs at one instant (claims.py).
        self.claimable = frozenset(claimable)
        self.epochs = epochs
        self.claims = (self.claimable, epochs)

    def of(self, target_id: int) -> int:
        return target_id % self.count

    def may_claim(self, target_id: int) -> bool:
        return target_id % self.count in self.claimable

    def claimed_under(self, target_id: int, fence) -> bool:
        """Claimable now, and under the epoch of `fence` (a task's): not lost and
        taken again since the task was claimed."""
        claimable, epochs = self.claims
        p = target_id % self.count
        return p in claimable and (fence is None or epochs.get(p) == fence[1])

    def holds(self, target_id: int) -> bool:
        return target_id % self.count in self.held

    def may_attempt(self, target_id: int) -> bool:
        """Held, and the lease still valid: checked just before every send."""
        return target_id % self.count in self.held and self.lease.valid()

    def epoch_of(self, target_id: int) -> int | None:
        return self.epochs.get(target_id % self.count)

    def draining(self) -> frozenset:
        return self.held - self.claimable

    def filter(self, queryset, field: str = "target_id"):
        """`queryset` limited to the claimable partitions (see in_partitions)."""
        return in_partitions(queryset, self.claimable, self.count, field)

    def take(self, partitions, epochs: dict | None = None) -> None:
        with self._lock:
            self.held = self.held | set(partitions)
            self._set(self.claimable | set(partitions), {**self.epochs, **(epochs or {})})
        for partition, epoch in (epochs or {}).items():
            self.took(partition, epoch)

    def took(self, partition: int, epoch: int) -> None:
        """This engine's take raised the partition's epoch to `epoch`: recorded as
        the take commits (partition_manager.py), before the partition is put to
        use (take())."""
        with self._lock:
            epochs = self._took.setdefault(partition, set())
            epochs.add(epoch)
            while len(epochs) > TOOK_KEPT:
                epochs.discard(min(epochs))

    def retaken(self, fence) -> tuple[int, int] | None:
        """The fence to write a refused result under: the latest epoch of its
        partition such that every take after `fence`'s was this engine's. Every
        take raises the epoch by one, so nobody else held the partition in
        between, and nobody else can have claimed the row; the writer's fence
        still refuses the write if another engine takes it meanwhile. None when
        another engine's take came first (or no take of this engine followed)."""
        if fence is None:
            return None
        partition, epoch = fence
        with self._lock:
            took = self._took.get(partition, ())
            latest = epoch
            while latest + 1 in took:
                latest += 1
        return (partition, latest) if latest > epoch else None

    def forfeit(self, fence) -> bool:
        """A write under `fence` (partition, epoch) was refused: the partition's
        epoch moved on, so another engine took it while this one still believes in
        that epoch. Nothing more is claimed there (it drains, and the manager lets
        it go); True if that was news. A refusal under an epoch already replaced
        (taken back since) changes nothing."""
        if fence is None:
            return False
        partition, epoch = fence
        with self._lock:
            if partition not in self.claimable or self.epochs.get(partition) != epoch:
                return False
            self._set(self.claimable - {partition}, self.epochs)
            return True

    def start_drain(self, partitions) -> None:
        with self._lock:
            self._set(self.claimable - set(partitions), self.epochs)

    def let_go(self, partitions) -> None:
        with self._lock:
            self._set(self.claimable - set(partitions), self.epochs)
            self.held = self.held - set(partitions)
            self._set(self.claimable, {p: e for p, e in self.epochs.items() if p in self.held})

    def drop_all(self) -> frozenset:
        """Nothing is held any more (the lock connection is gone); return what was."""
        with self._lock:
            was = self.held
            self._set((), self.epochs)
            self.held = frozenset()
            self._set((), {})
            return was

    def listing(self) -> list | None:
        """What the heartbeat row shows: the held partitions; None for the one
        partition of SQLite (the whole database)."""
        return sorted(self.held) if self.count > 1 else None

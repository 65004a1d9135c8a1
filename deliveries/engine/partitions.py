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
`PartitionManager` keeps it true: it takes free partitions up to a fair share,
hands its excess over by draining it, and drops everything at once when the lock
connection goes.

On SQLite there is one engine per data directory (the flock) and one partition it
always holds: `Partitions()`.
"""

import logging
import math
import random
import threading
import time

from django.db.models import F

logger = logging.getLogger("deliveries.engine")

# pg_try_advisory_lock(LOCK_NAMESPACE, p) owns partition p; (MEMBER_NAMESPACE, n) is
# held by every engine's lock connection for its life, so the engines can count each
# other from pg_locks.
LOCK_NAMESPACE = 0x7768  # "wh"
MEMBER_NAMESPACE = 0x7769


def lock_holders(cursor) -> dict[int, list[int]]:
    """{partition: backend pids holding its lock}, read through a DB-API `cursor`
    (the healthy state: one pid for every partition)."""
    cursor.execute(
        "SELECT objid, pid FROM pg_locks WHERE locktype = 'advisory' AND classid = %s "
        "AND objsubid = 2 AND granted",
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


class Partitions:
    """Which partitions this engine may claim in and attempt in.

    `held`: the partitions whose lock it has; attempts are made only in these.
    `claimable`: held and not being handed over; new work is claimed only in these.
    Both are replaced whole (frozensets), so readers on any thread need no lock.
    """

    def __init__(self, count: int = 1, *, held=None):
        self.count = count
        self._lock = threading.Lock()
        initial = frozenset(range(count) if held is None else held)
        self.held = initial
        self.claimable = initial

    def of(self, target_id: int) -> int:
        return target_id % self.count

    def may_claim(self, target_id: int) -> bool:
        return target_id % self.count in self.claimable

    def may_attempt(self, target_id: int) -> bool:
        return target_id % self.count in self.held

    def draining(self) -> frozenset:
        return self.held - self.claimable

    def filter(self, queryset, field: str = "target_id"):
        """`queryset` limited to the claimable partitions (see in_partitions)."""
        return in_partitions(queryset, self.claimable, self.count, field)

    def take(self, partitions) -> None:
        with self._lock:
            self.held = self.held | set(partitions)
            self.claimable = self.claimable | set(partitions)

    def start_drain(self, partitions) -> None:
        with self._lock:
            self.claimable = self.claimable - set(partitions)

    def let_go(self, partitions) -> None:
        with self._lock:
            self.claimable = self.claimable - set(partitions)
            self.held = self.held - set(partitions)

    def drop_all(self) -> frozenset:
        """Nothing is held any more (the lock connection is gone); return what was."""
        with self._lock:
            was = self.held
            self.claimable = frozenset()
            self.held = frozenset()
            return was

    def listing(self) -> list | None:
        """What the heartbeat row shows: the held partitions; None for the one
        partition of SQLite (the whole database)."""
        return sorted(self.held) if self.count > 1 else None


class PartitionManager:
    """Keeps the engine's partitions true to its locks; `step()` is its loop's body.

    Every TICK: check the lock connection (lost: drop everything at once, reconnect
    with backoff), let go of drained partitions; every `interval`: rebalance (take
    free partitions up to the fair share, start draining the excess).
    """

    # Seconds between two looks at the lock connection: how soon a lost connection
    # stops every attempt, and how soon a drained partition is handed over.
    TICK = 0.5
    # Reconnecting after a lost lock connection: first wait, doubling up to the cap.
    BACKOFF_FIRST = 0.5
    BACKOFF_CAP = 30.0
    KEEPALIVES = (
        ("tcp_keepalives_idle", 5),
        ("tcp_keepalives_interval", 2),
        ("tcp_keepalives_count", 3),
    )

    def __init__(self, engine, *, interval: float, connect, clock=time.monotonic):
        self.engine = engine
        # pg_stat_activity shows the lock connection as this: an operator (or a
        # test) can tell which engine holds which partitions.
        self.application_name = f"webhooker engine {engine.config.name}"[:63]
        self.partitions = engine.partitions
        self.interval = interval
        # Returns a new autocommit psycopg connection (lock.open_raw_connection).
        self._connect = connect
        self.clock = clock
        self.conn = None
        # The member lock's key, and the lock connection's backend pid (logged).
        self.member = random.randint(1, 2**31 - 1)
        self.backend_pid = None
        self._backoff = self.BACKOFF_FIRST
        self._retry_at = 0.0
        self._rebalance_at = 0.0
        self._lost_at = None  # when the lock connection was lost; None while it stands
        self._unrecovered: set[int] = set()  # locked, their recovery not yet run
        # Called after the partitions held changed (the runner writes the heartbeat,
        # so the dashboard and the healthcheck see it now, not a beat later).
        self.on_change = None

    # --- the connection -------------------------------------------------------------

    def connect(self) -> None:
        """Open the lock connection, check it keeps a session, join the members.

        Raises SessionUnsupported behind a transaction-mode pooler, or the
        connection's error.
        """
        conn = self._connect()
        try:
            # The server's keepalives: a vanished engine host's locks are released
            # within about 5 + 2 * 3 s, not the kernel's two hours.
            for name, value in self.KEEPALIVES:
                conn.execute(f"SET {name} = {int(value)}")
            conn.execute(
                "SELECT set_config('application_name', %s, false)", (self.application_name,)
            )
            check_session(conn, self.member)
        except BaseException:
            conn.close()
            raise
        self.conn = conn
        self.backend_pid = conn.info.backend_pid
        self._backoff = self.BACKOFF_FIRST
        self._rebalance_at = 0.0
        self._lost_at = None

    def alive(self) -> bool:
        if self.conn is None:
            return False
        try:
            self.conn.execute("SELECT 1")
        except Exception:
            return False
        return True

    def close(self) -> None:
        """Close the lock connection: the server releases every lock on it."""
        if self.conn is not None:
            try:
                self.conn.close()
            finally:
                self.conn = None

    # --- the loop -------------------------------------------------------------------

    def step(self) -> None:
        before = self.partitions.held
        try:
            self._step()
        finally:
            if self.partitions.held != before and self.on_change is not None:
                try:
                    self.on_change()
                except Exception:
                    logger.warning("could not record the partitions held", exc_info=True)

    def _step(self) -> None:
        now = self.clock()
        if self.conn is None:
            if now < self._retry_at:
                return
            lost_at = self._lost_at
            try:
                self.connect()
            except SessionUnsupported:
                raise
            except Exception as exc:
                self._retry_at = now + self._backoff
                logger.warning("lock connection: %s; trying again in %.1fs", exc, self._backoff)
                self._backoff = min(self._backoff * 2, self.BACKOFF_CAP)
                return
            if lost_at is not None:
                logger.warning(
                    "lock connection open again after %.1fs (backend pid %s); taking partitions",
                    now - lost_at,
                    self.backend_pid,
                )
            else:
                logger.info("lock connection open (backend pid %s)", self.backend_pid)
        if not self.alive():
            self.lost()
            return
        self.hand_over_drained()
        if now >= self._rebalance_at:
            self._rebalance_at = now + self.interval
            self.rebalance()
        self.recover_taken()

    def recover_taken(self) -> None:
        """Run the take (at-start recovery) of partitions locked but not yet
        recovered; a database error leaves them for the next step."""
        if self._unrecovered:
            taken = sorted(self._unrecovered)
            self.engine.take_partitions(taken)
            self._unrecovered.difference_update(taken)

    def lost(self) -> None:
        """The lock connection is gone, and every lock with it: another engine may
        hold any of these partitions now."""
        dropped = self.engine.drop_partitions()
        logger.error(
            "lock connection lost: stopped attempting in %d partitions; reconnecting",
            len(dropped),
        )
        self.close()
        self._unrecovered.clear()
        self._lost_at = self.clock()
        self._retry_at = self._lost_at + self._backoff
        self._backoff = min(self._backoff * 2, self.BACKOFF_CAP)

    def rebalance(self) -> None:
        holders, members = self.locks()
        take, hand_over = plan(self.partitions.count, set(self.partitions.claimable), members)
        if hand_over:
            logger.info("handing over partitions %s", hand_over)
            self.engine.start_drain(hand_over)
            self.hand_over_drained()
        if take:
            free = [p for p in range(self.partitions.count) if p not in holders]
            random.shuffle(free)  # engines starting together try different ones first
            taken = []
            try:
                for p in free:
                    if len(taken) >= take:
                        break
                    if self._try_lock(p):
                        taken.append(p)
            finally:
                # Locked is owned, even if the loop broke off: recovered next.
                self._unrecovered.update(taken)
            if taken:
                logger.info("took partitions %s", sorted(taken))

    def hand_over_drained(self) -> list:
        """Unlock every draining partition the engine holds nothing of any more."""
        done = []
        draining = self.partitions.draining()
        for p in self.engine.drain_partitions(draining) if draining else ():
            self.conn.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_NAMESPACE, p))
            self.partitions.let_go([p])
            done.append(p)
        if done:
            logger.info("handed over partitions %s", done)
        return done

    def locks(self) -> tuple[dict, int]:
        """{partition: holder backend pid} and how many engines are members."""
        rows = self.conn.execute(
            "SELECT classid, objid, pid FROM pg_locks WHERE locktype = 'advisory' "
            "AND objsubid = 2 AND granted AND classid IN (%s, %s) AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())",
            (LOCK_NAMESPACE, MEMBER_NAMESPACE),
        ).fetchall()
        holders = {objid: pid for classid, objid, pid in rows if classid == LOCK_NAMESPACE}
        members = sum(1 for classid, _, _ in rows if classid == MEMBER_NAMESPACE)
        return holders, max(1, members)

    def _try_lock(self, p: int) -> bool:
        return self.conn.execute(
            "SELECT pg_try_advisory_lock(%s, %s)", (LOCK_NAMESPACE, p)
        ).fetchone()[0]


def check_session(conn, member: int) -> None:
    """Take the member lock, and make sure the connection keeps its session: the
    same backend across two transactions, and the lock visible there afterwards."""
    first = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    conn.execute("SELECT pg_advisory_lock(%s, %s)", (MEMBER_NAMESPACE, member))
    second = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    kept = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s "
        "AND classid = %s AND objid = %s AND objsubid = 2 AND granted",
        (second, MEMBER_NAMESPACE, member),
    ).fetchone()[0]
    if first != second or not kept:
        raise SessionUnsupported(
            "the engine's lock connection does not keep its session across "
            "transactions (a transaction-mode pooler such as PgBouncer?): session "
            "advisory locks cannot work through it; point the engine at PostgreSQL "
            "directly or at a session-mode pool"
        )


def autovacuum_off(cursor) -> bool:
    """Whether the PostgreSQL server runs with autovacuum off."""
    cursor.execute("SHOW autovacuum")
    return cursor.fetchone()[0] != "on"


def warn_without_autovacuum(cursor) -> bool:
    """Log a warning, once at start, when the server runs with autovacuum off;
    return whether it does. Every delivery's status change and every prune leaves
    dead rows: without vacuuming they are never reclaimed, the tables and their
    indexes only grow, and the engine's claims and the admin's lists slow down
    with them."""
    off = autovacuum_off(cursor)
    if off:
        logger.warning(
            "PostgreSQL runs with autovacuum off: the dead rows every delivery and "
            "every prune leave are never reclaimed, and the engine's queries slow "
            "down as they pile up. Turn autovacuum on, or run VACUUM ANALYZE on a "
            "schedule (README: Retention)."
        )
    return off


def record_partition_count(count: int) -> int:
    """Record `count` as the database's partition count at the first engine start;
    raise PartitionMismatch if another count is recorded."""
    from deliveries.models import EngineCluster

    cluster, _ = EngineCluster.objects.get_or_create(pk=1, defaults={"partitions": count})
    if cluster.partitions != count:
        raise PartitionMismatch(
            f"this database's engines use {cluster.partitions} partitions (recorded at "
            f"the first engine start), but DELIVERY_PARTITIONS is {count}: set "
            f"DELIVERY_PARTITIONS={cluster.partitions}"
        )
    return count

"""The lock manager of partitioned ownership (partitions.py): the engine's lock
connection to PostgreSQL, its lease and the partitions' epochs (docs/architecture.md,
"Fenced ownership: leases and epochs").
"""

import contextlib
import logging
import math
import random
import threading
import time

import psycopg
from django.db import connection
from django.db.utils import DatabaseError

from deliveries.engine.lease import boottime
from deliveries.engine.partitions import (
    LOCK_NAMESPACE,
    MEMBER_NAMESPACE,
    PartitionMismatch,
    SessionUnsupported,
    plan,
)

logger = logging.getLogger("deliveries.engine")

# What the lock connection says at every take, in one statement: the partition's
# next epoch (its row made at the first take), its new holder, and how long the
# previous holder's lease may still run if it did not hand the partition over
# cleanly (killed, cut off, evicted): the taker attempts nothing there before.
TAKE = """
WITH previous AS (
    SELECT holder FROM deliveries_partition WHERE number = %(p)s
), taken AS (
    INSERT INTO deliveries_partition (number, epoch, holder, changed_at)
    VALUES (%(p)s, 1, %(me)s, clock_timestamp())
    ON CONFLICT (number) DO UPDATE
    SET epoch = deliveries_partition.epoch + 1, holder = EXCLUDED.holder,
        changed_at = EXCLUDED.changed_at
    RETURNING epoch
)
SELECT taken.epoch, COALESCE((
    SELECT GREATEST(0, EXTRACT(EPOCH FROM e.lease_until - clock_timestamp()))
    FROM deliveries_enginestatus e JOIN previous ON e.name = previous.holder
    WHERE previous.holder <> %(me)s
), 0)::float FROM taken
"""

# A clean hand-over: the partition's row says nobody holds it, so the next holder
# need not wait out this engine's lease. Under the epoch it was taken with: a
# partition this engine lost meanwhile is left as its new holder wrote it.
RELEASE = """
UPDATE deliveries_partition SET holder = '', changed_at = clock_timestamp()
WHERE number = %s AND epoch = %s
"""

# Every renewal of the lease: a round trip that proves the session (and so its
# locks) stands, and the server-clock times other engines read.
RENEW = """
UPDATE deliveries_enginestatus SET lease_renewed_at = clock_timestamp(),
    lease_until = clock_timestamp() + make_interval(secs => %s), lock_pid = pg_backend_pid()
WHERE name = %s
RETURNING lease_renewed_at
"""

LEAVE = """
UPDATE deliveries_enginestatus SET lease_renewed_at = NULL, lease_until = clock_timestamp()
WHERE name = %s
"""

# Engines whose lease was last renewed longer than DELIVERY_EVICT_AFTER ago while
# their lock session stands (frozen, stuck, cut off on a connection the server has
# not closed yet): their sessions are ended, which releases their locks. Only the
# session that renewed it (its pid, its application name, opened before that
# renewal), never another process's that reused the pid.
EVICT = """
SELECT e.name, pg_terminate_backend(a.pid) FROM deliveries_enginestatus e
JOIN pg_stat_activity a ON a.pid = e.lock_pid
    AND a.application_name = left('webhooker engine ' || e.name, 63)
    AND a.backend_start < e.lease_renewed_at
WHERE e.stopped_at IS NULL AND e.name <> %s
AND e.lease_renewed_at < clock_timestamp() - make_interval(secs => %s)
AND a.pid <> pg_backend_pid()
"""

# Engines that were renewing their leases when this one lost its lock connection
# (a database restart ends every engine's): counted for the fair share for a while
# after it reconnects, so the first one back takes only its share.
REJOINING = """
SELECT count(*) FROM deliveries_enginestatus
WHERE stopped_at IS NULL AND lease_renewed_at >= %s - make_interval(secs => %s)
"""

# The NOTIFY channel on which a leaving engine says: partitions are free, take now.
HANDOVER_CHANNEL = "webhooker_partitions"


class PartitionManager:
    """Keeps the engine's partitions true to its locks; `step()` is its loop's body.

    Every TICK: renew the lease with a round trip on the lock connection (failing:
    drop everything at once, reconnect with backoff), evict engines whose lease went
    stale, let go of drained partitions, take free ones up to the fair share; every
    `interval`: hand the excess over. Between ticks it waits on the lock connection
    for a hand-over NOTIFY, so a partition another engine let go is taken at once.
    """

    # Seconds between two renewals; the lease is several of these.
    TICK = 0.5
    # Reconnecting after a lost lock connection: first wait, doubling up to the cap
    # (short: after a database restart the engines reconnect within about the cap
    # of each other, inside REJOIN_WINDOW).
    BACKOFF_FIRST = 0.5
    BACKOFF_CAP = 2.0
    # Seconds after reconnecting during which the engines renewing when this one
    # lost its connection count as live (REJOINING).
    REJOIN_WINDOW = 5.0
    KEEPALIVES = (
        ("tcp_keepalives_idle", 5),
        ("tcp_keepalives_interval", 2),
        ("tcp_keepalives_count", 3),
    )

    def __init__(
        self,
        handover,
        *,
        name: str,
        interval: float,
        connect,
        evict_after: float,
        healthy=lambda: True,
        clock=boottime,
    ):
        # handover.Handover: what taking and letting go does to the engine's work.
        self.handover = handover
        self.partitions = handover.partitions
        self.lease = self.partitions.lease
        self.name = name
        # pg_stat_activity shows the lock connection as this: an operator (or a
        # test, or another engine evicting this one) can tell which engine it is.
        self.application_name = f"webhooker engine {name}"[:63]
        self.interval = interval
        self.evict_after = evict_after
        # Whether the engine's own loops are moving (runner.Watchdog): a stuck
        # engine stops renewing, so its lease runs out and the others evict it.
        self.healthy = healthy
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
        # When the lock connection last opened, the server time of the last renewal,
        # and of the last renewal before the connection was lost (see locks()).
        self._connected_at = -math.inf
        self._renewed_at = None
        self._lost_renewal = None
        # Locked, epoch taken, not yet in use: {partition: (epoch, usable from)}.
        self._taken: dict[int, tuple[int, float]] = {}
        # A release met a writer's fence this step (see _release).
        self._fenced_this_step = False
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
            # within about 5 + 2 * 3 s, not the kernel's two hours. Leases are far
            # shorter, so the host stops attempting well before that.
            for name, value in self.KEEPALIVES:
                conn.execute(f"SET {name} = {int(value)}")
            # A writer's fence holds a partition's row while its batch commits: a
            # take or a release waits for it at most half the lease, then gives up
            # on that partition alone (a statement past the lease fails the
            # connection, and every partition with it).
            if self.lease.seconds:
                conn.execute(f"SET lock_timeout = {int(self.lease.seconds * 500)}")
            # synchronous_commit stays on: an epoch taken here must survive a
            # server crash, or a new holder could draw the number a stale one holds.
            conn.execute(
                "SELECT set_config('application_name', %s, false)", (self.application_name,)
            )
            # This engine's earlier lock session, if the server has not noticed yet
            # that it is gone (a cut connection): ended now, so its locks are free
            # for whoever takes them rather than held until its keepalives fail.
            # By its pid: application names are cut at 63 characters, and two
            # engines' may read the same.
            if self.backend_pid is not None:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE pid = %s AND application_name = %s "
                    "AND datname = current_database() AND pid <> pg_backend_pid()",
                    (self.backend_pid, self.application_name),
                )
            # A member key of its own per session: never waiting on the old one's.
            self.member = random.randint(1, 2**31 - 1)
            check_session(conn, self.member)
            conn.execute(f"LISTEN {HANDOVER_CHANNEL}")
        except BaseException:
            conn.close()
            raise
        self.conn = conn
        self.backend_pid = conn.info.backend_pid
        self._backoff = self.BACKOFF_FIRST
        self._rebalance_at = 0.0
        self._lost_at = None
        self._connected_at = self.clock()

    def renew(self) -> bool:
        """One round trip on the lock connection; the lease runs from its start."""
        if self.conn is None:
            return False
        started = self.clock()
        try:
            row = self.conn.execute(RENEW, (self.lease.seconds or 0, self.name)).fetchone()
        except Exception:
            return False
        self.lease.confirm(started)
        if row is not None:
            self._renewed_at = row[0]
        return True

    def wait(self, timeout: float, stop_event) -> None:
        """Until `timeout`, a hand-over NOTIFY, or the lock connection failing."""
        if self.conn is None:
            stop_event.wait(timeout)
            return
        # A failure here is the connection's: the next step's renewal says so.
        with contextlib.suppress(Exception):
            for _ in self.conn.notifies(timeout=timeout, stop_after=1):
                pass

    def close(self) -> None:
        """Close the lock connection: the server releases every lock on it."""
        self.lease.end()
        if self.conn is not None:
            try:
                self.conn.close()
            finally:
                self.conn = None

    # --- the loop -------------------------------------------------------------------

    def run(self, stop_event) -> None:
        """The partitions thread: a step every TICK, sooner on a hand-over NOTIFY."""
        while not stop_event.is_set():
            # This thread's own Django connection (a take's recovery reads through
            # it): one that broke is replaced here, before it fails a step.
            connection.close_if_unusable_or_obsolete()
            try:
                self.step()
            except SessionUnsupported:
                raise
            except DatabaseError:
                # Django's connection, not the lock connection: the locks stand, and
                # what failed (a take's recovery) is tried again next step.
                logger.warning("partitions step: database error; retrying", exc_info=True)
                connection.close()
            except psycopg.OperationalError as exc:
                # The lock connection (psycopg's own, not Django's) failed between
                # the step's renewal and a later statement on it: ended by the
                # server, cut off. As when the renewal notices it: no traceback.
                logger.warning("partitions step: %s", str(exc).splitlines()[0])
                self.lost()
            except Exception:
                logger.exception("partitions step failed; reconnecting")
                self.lost()
            self.wait(self.TICK, stop_event)

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
        self._fenced_this_step = False
        if not self.healthy():
            # Stuck: stop attempting and let every partition go at once, member lock
            # included, so the others take them now rather than after an eviction;
            # connect and take nothing until the loops move again.
            if self.conn is not None:
                logger.error("the engine's loops are stuck: letting every partition go")
                self.lost()
            return
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
        if not self.renew():
            self.lost()
            return
        self.hand_over_drained()
        self.evict()
        if now >= self._rebalance_at:
            self._rebalance_at = now + self.interval
            self.rebalance(hand_over=True)
        else:
            self.rebalance(hand_over=False)
        self.use_taken()

    def use_taken(self) -> None:
        """Put the partitions locked earlier to use once any previous holder's lease
        has run out: claimable, their at-start recovery run. A database error leaves
        them for the next step."""
        now = self.clock()
        ready = {p: epoch for p, (epoch, at) in self._taken.items() if at <= now}
        if ready:
            with self.renewing():
                self.handover.take(ready)
            for p in ready:
                del self._taken[p]

    @contextlib.contextmanager
    def renewing(self):
        """Renew the lease every TICK on a thread of its own while the body runs: a
        take's recovery over a large backlog may read for longer than the lease, and
        must not let it lapse (the others would evict this engine for it)."""
        done = threading.Event()

        def renew():
            # A stuck engine's lease must still run out: renewed only while its
            # loops move.
            while not done.wait(self.TICK) and self.healthy() and self.renew():
                pass

        helper = threading.Thread(target=renew, name="lease-renewal", daemon=True)
        helper.start()
        try:
            yield
        finally:
            done.set()
            helper.join()

    def lost(self) -> None:
        """The lock connection is gone, and every lock with it: another engine may
        hold any of these partitions now."""
        self.lease.end()  # first: no attempt from here on
        self._lost_renewal = self._renewed_at
        dropped = self.handover.drop_all()
        logger.error(
            "lock connection lost: stopped attempting in %d partitions; reconnecting",
            len(dropped),
        )
        with contextlib.suppress(Exception):
            self.close()
        self.conn = None
        self._taken.clear()
        self._lost_at = self.clock()
        self._retry_at = self._lost_at + self._backoff
        self._backoff = min(self._backoff * 2, self.BACKOFF_CAP)

    def evict(self) -> list:
        """End the lock sessions of engines whose lease is stale; return their names."""
        rows = self.conn.execute(EVICT, (self.name, self.evict_after)).fetchall()
        evicted = [name for name, ok in rows if ok]
        for name in evicted:
            logger.warning(
                "evicted engine %s: its lease was not renewed for %.0fs", name, self.evict_after
            )
        return evicted

    def rebalance(self, *, hand_over: bool) -> None:
        holders, live = self.locks()
        mine = set(self.partitions.claimable) | set(self._taken)
        take, excess = plan(self.partitions.count, mine, live)
        if excess and hand_over:
            logger.info("handing over partitions %s", excess)
            self.handover.start_drain(excess)
            self.hand_over_drained()
        if take:
            free = [p for p in range(self.partitions.count) if p not in holders]
            random.shuffle(free)  # engines starting together try different ones first
            taken = []
            for p in free:
                if len(taken) >= take:
                    break
                if self._try_lock(p):
                    try:
                        row = self.conn.execute(TAKE, {"p": p, "me": self.name}).fetchone()
                    except Exception as exc:
                        if not lock_timed_out(exc):
                            raise
                        # Its row is held by a writer's fence for longer than the
                        # lock timeout: left for a later step, the connection fine.
                        # No more takes this step: waits must not add up past the
                        # lease between two renewals.
                        self._unlock(p)
                        break
                    taken.append(p)
                    epoch, wait = row
                    self.partitions.took(p, epoch)
                    # Locked is owned: used once the previous holder's lease is over.
                    self._taken[p] = (epoch, self.clock() + wait)
            if taken:
                logger.info("took partitions %s", sorted(taken))

    def hand_over_drained(self) -> list:
        """Unlock every draining partition the engine holds nothing of any more, and
        tell the others to take them now."""
        done = []
        draining = self.partitions.draining()
        for p in self.handover.drained(draining) if draining else ():
            self.release(p)
            done.append(p)
        if done:
            self.conn.execute(f"NOTIFY {HANDOVER_CHANNEL}")
            logger.info("handed over partitions %s", done)
        return done

    def release(self, p: int) -> None:
        self._release(p, self.partitions.epochs.get(p))
        self.handover.let_go([p])

    def _release(self, p: int, epoch: int | None) -> None:
        """Say the partition is free (the next holder need not wait out this
        engine's lease), and unlock it. After one release met a writer's fence past
        the lock timeout, the rest of the step only unlock (their next holders wait
        out the lease): waits must not add up between two renewals."""
        if epoch is not None and not self._fenced_this_step:
            try:
                self.conn.execute(RELEASE, (p, epoch))
            except Exception as exc:
                if not lock_timed_out(exc):
                    raise
                self._fenced_this_step = True
        self._unlock(p)

    def _unlock(self, p: int) -> None:
        self.conn.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_NAMESPACE, p))

    def leave(self, timeout: float) -> None:
        """A graceful stop: hand every partition over as soon as it is drained (the
        workers are finishing their attempts meanwhile), then close."""
        if self.conn is None:
            return
        try:
            # First no longer counted among the engines sharing the partitions, so
            # the others' fair share grows to take what this one hands over.
            self.conn.execute(LEAVE, (self.name,))
            self.conn.execute("SELECT pg_advisory_unlock(%s, %s)", (MEMBER_NAMESPACE, self.member))
            # Locked but not in use yet: nothing of them is held, so they go at once.
            # One whose previous holder's lease may still run is only unlocked (its
            # next holder must wait that lease out); one already claimable (its
            # recovery failed and waits for a retry) is drained below instead.
            now = self.clock()
            for p, (epoch, usable_from) in sorted(self._taken.items()):
                if p in self.partitions.held:
                    continue
                self._release(p, epoch if usable_from <= now else None)
            if self._taken:
                self._taken.clear()
                self.conn.execute(f"NOTIFY {HANDOVER_CHANNEL}")
            self.handover.start_drain(self.partitions.held)
            deadline = self.clock() + timeout
            while self.partitions.held and self.clock() < deadline:
                self.hand_over_drained()
                if self.partitions.held:
                    time.sleep(0.05)
        except Exception:
            logger.warning("handing over on leaving failed", exc_info=True)

    def locks(self) -> tuple[dict, int]:
        """{partition: holder backend pid} and how many engines count as live."""
        rows = self.conn.execute(
            "SELECT classid, objid, pid FROM pg_locks WHERE locktype = 'advisory' "
            "AND objsubid = 2 AND granted AND classid IN (%s, %s) AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())",
            (LOCK_NAMESPACE, MEMBER_NAMESPACE),
        ).fetchall()
        holders = {objid: pid for classid, objid, pid in rows if classid == LOCK_NAMESPACE}
        members = sum(1 for classid, _, _ in rows if classid == MEMBER_NAMESPACE)
        rejoining = self.clock() - self._connected_at < self.REJOIN_WINDOW
        if rejoining and self._lost_renewal is not None:
            # Just reconnected, maybe the first back after a database restart: the
            # engines that were renewing when this one lost its connection are
            # reconnecting too, so their shares are left to them. Past the window,
            # an engine that holds no member lock is gone, and its partitions are
            # taken at once.
            alive_then = self.conn.execute(
                REJOINING, (self._lost_renewal, 2 * (self.lease.seconds or 0))
            ).fetchone()[0]
            members = max(members, alive_then)
        return holders, max(1, members)

    def _try_lock(self, p: int) -> bool:
        return self.conn.execute(
            "SELECT pg_try_advisory_lock(%s, %s)", (LOCK_NAMESPACE, p)
        ).fetchone()[0]


def lock_timed_out(exc: BaseException) -> bool:
    """Whether a statement failed on lock_timeout (SQLSTATE 55P03)."""
    return getattr(exc, "sqlstate", None) == "55P03"


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

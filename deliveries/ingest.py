"""Storing an inbound webhook: the service functions the inbound view calls.

This is the hottest path in webhooker: every event a sender posts goes through it
while the sender waits. It therefore speaks SQL directly, where the ORM would spend
more time building queries than the database spends running them, and it counts
round trips (measured: bench/RESULTS.md):

- The entrypoint is read once per process and kept (`find_entrypoint`), never
  trusted: the statement that stores an event also checks that the entrypoint is
  still active and configured exactly as it was read, and stores nothing if not
  (`EntrypointChanged`; the view reads it afresh and decides again). So an
  entrypoint switched off, deleted or given a new secret a moment ago is obeyed
  exactly, with no expiry to wait for.
- On PostgreSQL the event, its deliveries and the engine's wake-up are one
  statement (data-modifying CTEs), atomic on its own, prepared
  (webhooker/postgresql): one round trip in
  place of BEGIN, two INSERTs, NOTIFY and COMMIT (measured serially: 1.3 ms in place
  of 3.1 ms, and 0.36 ms of Python and 0.75 ms of server CPU in place of 0.60 and
  1.05).
- On SQLite (no data-modifying CTEs; no network either, so statements cost no
  round trips) they are statements in one transaction.

The statements write exactly the columns the models define, values prepared by
the models' own fields.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import ipaddress
import json
import threading
import uuid
from collections.abc import Callable

from django.db import OperationalError, connection, transaction
from django.utils import timezone

from deliveries import verification, wake
from deliveries.models import Delivery, Entrypoint, Event, Target


class SenderGone(Exception):
    """The sender hung up before its event was committed: nothing was stored, since
    it will send it again and a stored copy would be a duplicate no one acknowledged."""


class EntrypointChanged(Exception):
    """The entrypoint is no longer as it was read (switched off, deleted, configured
    anew): nothing was stored; read it again with find_entrypoint(fresh=True)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Stored:
    event_id: int
    code: uuid.UUID
    deliveries: int
    # A repeat of a kept event's provider id: nothing was stored, and event_id and
    # code are the first event's.
    duplicate: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Inbound:
    """What the view needs of an entrypoint: found by its code in one query."""

    id: int
    webhook_id: int
    webhook_code: uuid.UUID
    active: bool
    code: uuid.UUID | None = None
    verification: str = "none"
    verification_config: dict = dataclasses.field(default_factory=dict, repr=False)
    dedup: bool = False
    # Where provider event ids are read from ("" when nowhere).
    id_source: str = ""
    # The columns as read (verification, config as text, dedup, dedup source): the
    # store statements store only while the row still holds exactly these.
    as_read: tuple = dataclasses.field(default=(), repr=False)
    # Served from this process's memory rather than read for this request.
    remembered: bool = False


# Entrypoints remembered per process; past this many, the oldest are forgotten.
REMEMBERED_ENTRYPOINTS = 4096
_remembered: dict[uuid.UUID, Inbound] = {}
_remembered_lock = threading.Lock()


def _tables():
    q = connection.ops.quote_name
    return {
        "event": q(Event._meta.db_table),
        "delivery": q(Delivery._meta.db_table),
        "target": q(Target._meta.db_table),
        "entrypoint": q(Entrypoint._meta.db_table),
        "webhook": q(Entrypoint._meta.get_field("webhook").related_model._meta.db_table),
    }


# The columns the store statements compare with Inbound.as_read; the config as text,
# which both databases give the same way every time for the same stored value.
_AS_READ = "e.verification, CAST(e.verification_config AS text), e.dedup, e.dedup_source"
_UNCHANGED = (
    "e.id = %s AND e.active AND e.verification = %s "
    "AND CAST(e.verification_config AS text) = %s AND e.dedup = %s AND e.dedup_source = %s"
)


def find_entrypoint(code: uuid.UUID, *, fresh: bool = False) -> Inbound | None:
    """The active entrypoint with this code as this process remembers it, or as
    read now (`fresh`, and whenever it is not remembered). Inactive and unknown
    codes are read every time: only an entrypoint that stores events is kept, and
    storing checks it (see the module docstring)."""
    if not fresh:
        remembered = _remembered.get(code)
        if remembered is not None:
            return remembered
    inbound = _read_entrypoint(code)
    with _remembered_lock:
        _remembered.pop(code, None)
        if inbound is not None and inbound.active:
            while len(_remembered) >= REMEMBERED_ENTRYPOINTS:
                _remembered.pop(next(iter(_remembered)))
            _remembered[code] = dataclasses.replace(inbound, remembered=True)
    return inbound


def _read_entrypoint(code: uuid.UUID) -> Inbound | None:
    t = _tables()
    sql = (
        f"SELECT e.id, e.webhook_id, w.code, e.active, {_AS_READ} FROM {t['entrypoint']} e "
        f"JOIN {t['webhook']} w ON w.id = e.webhook_id WHERE e.code = %s"
    )
    prep = Entrypoint._meta.get_field("code").get_db_prep_value(code, connection)
    with connection.cursor() as cursor:
        cursor.execute(sql, [prep])
        row = cursor.fetchone()
    if row is None:
        return None
    webhook_code = row[2] if isinstance(row[2], uuid.UUID) else uuid.UUID(row[2])
    preset, config_text, dedup, dedup_source = row[4:8]
    return Inbound(
        id=row[0],
        webhook_id=row[1],
        webhook_code=webhook_code,
        active=bool(row[3]),
        code=code,
        verification=preset,
        verification_config={} if preset == "none" else json.loads(config_text),
        dedup=bool(dedup),
        id_source=verification.id_source(preset, dedup_source),
        as_read=(preset, config_text, dedup, dedup_source),
    )


_EVENT_COLUMNS = (
    "code, webhook_id, entrypoint_id, method, query_string, headers, body, body_size, "
    "content_type, remote_addr, received_at, provider_id, deduplicated, duplicates, event_type"
)


@functools.cache
def _statements(vendor: str) -> dict[str, str]:
    """The store statements for this database, built once."""
    t = _tables()
    # The event's row, only while the entrypoint is as read. The unique index
    # event_provider_id_uniq decides between concurrent posts of one provider id: the
    # loser's insert does nothing (after waiting for the winner's transaction on
    # PostgreSQL) and it answers with the winner's event.
    event = (
        f"INSERT INTO {t['event']} ({_EVENT_COLUMNS}) "
        "SELECT %s, %s, e.id, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s "
        f"FROM {t['entrypoint']} e WHERE {_UNCHANGED} "
    )
    # One statement reads the active targets and writes their deliveries with the
    # event: a target switched off a moment ago gets no delivery, one switched on
    # gets one, never half of each.
    deliveries = (
        f"INSERT INTO {t['delivery']} (event_id, target_id, status, attempts, "
        "next_attempt_at, created_at, updated_at) "
        f"SELECT {{event}}, t.id, %s, 0, NULL, %s, %s FROM {{source}}{t['target']} t "
        "WHERE t.webhook_id = %s AND t.active"
    )
    statements = {
        "event": event + "RETURNING id",
        "event_dedup": event + "ON CONFLICT DO NOTHING RETURNING id",
        "deliveries": deliveries.format(event="%s", source=""),
        "unchanged": f"SELECT 1 FROM {t['entrypoint']} e WHERE {_UNCHANGED}",
    }
    if vendor == "postgresql":
        # Event, deliveries and the engine's wake-up in one statement: no row back
        # when the event was not stored (entrypoint changed, or a duplicate).
        for name in ("event", "event_dedup"):
            statements[name] = (
                f"WITH ev AS ({statements[name]}), "
                f"d AS ({deliveries.format(event='ev.id', source='ev, ')} RETURNING 1), "
                "n AS (SELECT count(*) AS c FROM d) "
                f"SELECT ev.id, n.c, CASE WHEN n.c > 0 THEN pg_notify('{wake.CHANNEL}', '') "
                "END FROM ev, n"
            )
    return statements


def store_event(
    entrypoint: Inbound,
    *,
    method: str,
    headers: list[list[str]],
    body: bytes,
    content_type: str,
    remote_addr: str | None,
    provider_id: str = "",
    dedup: bool = False,
    query_string: str = "",
    gone: Callable[[], bool] | None = None,
) -> Stored:
    """Store the event and one pending delivery per active target, atomically.

    Returns only after COMMIT, so the caller's 200 promises both are durable
    (invariant 1 in docs/architecture.md). The engine is woken after the commit; a
    lost wake-up costs latency, never a delivery, because the rows themselves are the
    message.

    With `dedup` and a `provider_id`, an event of the webhook kept with the same
    provider id makes this a duplicate: nothing is stored, the first event counts
    one more receipt, and its id and code are returned with duplicate=True.

    `gone` is asked, as late as the database allows, whether the sender has hung up:
    just before COMMIT on SQLite, just before the one statement on PostgreSQL. If
    so, nothing is stored and SenderGone raised.

    Raises EntrypointChanged, storing nothing, when the entrypoint is no longer as
    `entrypoint` was read.
    """
    code = uuid.uuid4()
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    deduplicated = bool(dedup and provider_id)
    values = [
        Event._meta.get_field("code").get_db_prep_value(code, connection),
        entrypoint.webhook_id,
        method,
        query_string,
        Event._meta.get_field("headers").get_db_prep_value(headers, connection),
        body,
        len(body),
        content_type,
        ip_or_none(remote_addr),
        now,
        provider_id,
        deduplicated,
        0,
        event_type(headers, body, content_type),
        entrypoint.id,
        *entrypoint.as_read,
    ]
    statements = _statements(connection.vendor)
    insert_event = statements["event_dedup" if deduplicated else "event"]
    delivery_values = [Delivery.Status.PENDING.value, now, now, entrypoint.webhook_id]

    def insert(cursor, params) -> tuple | Stored:
        """The event's INSERT until it stores a row (returned), or the event turns
        out a kept one's duplicate (that Stored)."""
        while True:
            cursor.execute(insert_event, params)
            row = cursor.fetchone()
            if row is not None:
                return row
            first = _not_stored(cursor, statements, entrypoint, provider_id, deduplicated)
            if first is not None:
                return first

    if connection.vendor == "postgresql":
        if gone is not None and gone():
            raise SenderGone
        # Atomic on its own in autocommit, as the web side runs it; inside a
        # caller's transaction, a savepoint keeps a failure from aborting that.
        nested = transaction.atomic() if connection.in_atomic_block else contextlib.nullcontext()
        with nested, connection.prepared_cursor() as cursor:
            row = insert(cursor, values + delivery_values)
        if isinstance(row, Stored):
            return row
        return Stored(event_id=row[0], code=code, deliveries=row[1])

    def store() -> Stored:
        with connection.cursor() as cursor:
            row = insert(cursor, values)
            if isinstance(row, Stored):
                return row
            event_id = row[0]
            cursor.execute(statements["deliveries"], [event_id, *delivery_values])
            deliveries = cursor.rowcount
            if gone is not None and gone():
                raise SenderGone
            if deliveries:
                wake.notify_on_commit(connection)
        return Stored(event_id=event_id, code=code, deliveries=deliveries)

    if connection.in_atomic_block:
        # Part of the caller's transaction, on its connection.
        with transaction.atomic():
            return store()
    return group_commit.run(store)


class _Job:
    """One store_event call waiting in a group commit."""

    __slots__ = ("done", "error", "lead", "result", "store")

    def __init__(self, store: Callable[[], Stored]):
        self.store = store
        self.done = threading.Event()
        self.lead = False
        self.result: Stored | None = None
        self.error: BaseException | None = None

    def outcome(self) -> Stored:
        if self.error is not None:
            raise self.error
        return self.result


class GroupCommit:
    """Concurrent inbound events in one process share one SQLite transaction: one
    writer-lock turn and one fsync for all of them.

    The first caller leads: it begins a transaction (waiting for the writer lock),
    takes every event waiting by then (up to `limit`), stores each in a savepoint
    of that transaction on its own connection, commits, and wakes the others with
    their own outcome; then it hands the lead to the first caller that arrived
    meanwhile. Each caller still returns only after COMMIT of its own rows
    (invariant 1); an event whose statements fail rolls back its savepoint and
    fails its own request alone; a failed COMMIT fails every event of the group,
    none of which is stored.
    """

    def __init__(self, limit: int = 64):
        self.limit = limit
        # Groups taken (in a transaction begun), for the tests and the curious.
        self.groups = 0
        self._lock = threading.Lock()
        self._waiting: list[_Job] = []
        self._leading = False

    def run(self, store: Callable[[], Stored]) -> Stored:
        job = _Job(store)
        with self._lock:
            self._waiting.append(job)
            job.lead = not self._leading
            self._leading = True
        if not job.lead:
            job.done.wait()
            if not job.lead:
                return job.outcome()
        group: list[_Job] = []
        committed = False
        try:
            committed = self._commit(group)
        finally:
            with self._lock:
                if not group:
                    # BEGIN failed (or was interrupted) before the group was taken:
                    # those it would have taken share its outcome.
                    self._take(group)
                if self._waiting:
                    following = self._waiting[0]
                    following.lead = True
                    following.done.set()
                else:
                    self._leading = False
            for other in group:
                if not committed and other.error is None:
                    # The leader was interrupted mid-group: nothing is known stored.
                    other.result = None
                    other.error = RuntimeError("the group commit was interrupted")
                if other is not job:
                    other.done.set()
        return job.outcome()

    def _take(self, group: list[_Job]) -> None:
        """Move the first `limit` waiting jobs (the leader's own first) into group;
        called with self._lock held."""
        group.extend(self._waiting[: self.limit])
        del self._waiting[: self.limit]

    def _commit(self, group: list[_Job]) -> bool:
        """Begin a transaction, take the group, store it; whether it committed. If it
        did not, every job holds an error and no result.

        The group is taken once BEGIN holds the writer lock, not before: while
        another process writes, the leader waits for its turn and every event that
        arrives meanwhile joins this group, rather than the next (three web workers
        of four threads under wrk: 1.5-2.1 events a group taken before BEGIN, 3.5
        taken after it).
        """
        committed = []
        try:
            with transaction.atomic():
                with self._lock:
                    self._take(group)
                self.groups += 1
                lost = None
                for job in group:
                    if lost is not None:
                        job.error = lost
                        continue
                    try:
                        with transaction.atomic():
                            job.result = job.store()
                    except Exception as exc:
                        job.error = exc
                        if connection.needs_rollback:
                            # Not even the job's savepoint could be rolled back: the
                            # transaction itself is gone (SQLite abandons it when the
                            # disk fills mid-statement). The rest of the group cannot
                            # be stored in it and fails with the database's error, as
                            # its leader does, rather than Django's complaint about a
                            # broken transaction.
                            lost = (
                                exc
                                if isinstance(exc, OperationalError)
                                else OperationalError(f"the group's transaction was lost: {exc}")
                            )
                # Runs only after COMMIT succeeded: Django rolls back without a word
                # when a job's failure left the transaction unusable (SQLite may
                # abandon the whole transaction on a full disk), or when the
                # connection was lost in it.
                transaction.on_commit(lambda: committed.append(True), robust=True)
            if not committed:
                raise OperationalError("the group's transaction was rolled back")
        except Exception as exc:  # BEGIN, COMMIT, or a silent rollback: nothing stored
            if not group:
                with self._lock:
                    self._take(group)
            for job in group:
                job.result, job.error = None, job.error or exc
            return False
        return True


group_commit = GroupCommit()


def _not_stored(
    cursor, statements, entrypoint: Inbound, provider_id: str, deduplicated: bool
) -> Stored | None:
    """The event's INSERT stored nothing: the entrypoint changed (raises
    EntrypointChanged), or its provider id is a kept event's (that event, counted
    once more). None: store again - the kept event was deleted (retention) after the
    insert met it, so its provider id is free again, or the entrypoint changed and
    changed back."""
    cursor.execute(statements["unchanged"], [entrypoint.id, *entrypoint.as_read])
    if cursor.fetchone() is None:
        raise EntrypointChanged
    if not deduplicated:
        return None
    return _count_duplicate(cursor, _tables(), entrypoint.webhook_id, provider_id)


def _count_duplicate(cursor, t, webhook_id: int, provider_id: str) -> Stored | None:
    """Count one more receipt of the kept event with this provider id; None if
    there is none any more."""
    cursor.execute(
        f"UPDATE {t['event']} SET duplicates = duplicates + 1 "
        "WHERE webhook_id = %s AND provider_id = %s AND deduplicated RETURNING id, code",
        [webhook_id, provider_id],
    )
    row = cursor.fetchone()
    if row is None:
        return None
    code = row[1] if isinstance(row[1], uuid.UUID) else uuid.UUID(row[1])
    return Stored(event_id=row[0], code=code, deliveries=0, duplicate=True)


# Headers that name the kind of event, as senders send them (GitHub, GitLab,
# Bitbucket, Shopify, Gitea, Twilio-style); else a JSON body's "type" (Stripe,
# Standard Webhooks) or "event".
EVENT_TYPE_HEADERS = (
    "x-github-event",
    "x-gitlab-event",
    "x-event-key",
    "x-shopify-topic",
    "x-gitea-event",
    "x-event-type",
)
# Bodies parsed for their "type" only up to this size: the list column is a
# convenience, never worth parsing megabytes in the inbound request.
EVENT_TYPE_BODY_LIMIT = 64 * 1024


def event_type(headers: list[list[str]], body: bytes, content_type: str) -> str:
    """What the sender says the event is, or ""."""
    for name, value in headers:
        if name.lower() in EVENT_TYPE_HEADERS and value.strip():
            return value.strip()[:200]
    if len(body) > EVENT_TYPE_BODY_LIMIT or body.lstrip()[:1] != b"{":
        return ""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return ""
    for key in ("type", "event", "event_type"):
        value = document.get(key) if isinstance(document, dict) else None
        if isinstance(value, str) and value.strip():
            return value.strip()[:200]
    return ""


def ip_or_none(value: str | None) -> str | None:
    if not value:
        return None
    try:
        return str(ipaddress.ip_address(value.split("%", 1)[0]))
    except ValueError:
        return None

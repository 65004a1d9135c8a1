"""The claim's statements, named in one place and built once per database vendor.

A claim reads rows in two steps (claims.py): candidates, then the tasks of the
ones it owns; an ordered lane's head is read whole in one, and an overflowed
target's next candidates (intake.py) in one per target. A lane reads a head for
every delivery it sends, one at a time, and intake reads each overflowed target
on every pass, so building these through the ORM each time (joins, a `CASE`,
lookups compiled again) cost an engine more than running them. Here they are
text built once, with the ids as one parameter whatever their number: an array
on PostgreSQL (`= ANY`, through the prepared cursor, so also planned once per
connection), a JSON array read by `json_each` on SQLite. The head and the
overflow are prepared too (PREPARED says why).

The columns are the models' own (`_meta`), and `loaded` turns each database's
values into what the ORM would have given: tests/engine/test_engine_steps.py
checks a task loaded here against one loaded through the ORM, on both databases.
"""

import datetime
import functools
import json
import uuid

from django.db import connection

from deliveries.engine.task import INLINE_BODY_LIMIT
from deliveries.models import Delivery, Event, Target

# Task field -> (table alias, model field): one row per claimed delivery.
TASK_COLUMNS = {
    "delivery_id": ("d", "id"),
    "status": ("d", "status"),
    "attempts": ("d", "attempts"),
    "next_attempt_at": ("d", "next_attempt_at"),
    "event_id": ("d", "event"),
    "event_code": ("e", "code"),
    "webhook_id": ("e", "webhook"),
    "target_id": ("d", "target"),
    "method": ("e", "method"),
    "headers": ("e", "headers"),
    "content_type": ("e", "content_type"),
    "body_size": ("e", "body_size"),
    "received_at": ("e", "received_at"),
    "query_string": ("e", "query_string"),
    "body": ("e", "body"),  # only when at most INLINE_BODY_LIMIT bytes (see below)
    "event_type": ("e", "event_type"),
    "provider_id": ("e", "provider_id"),
    "entrypoint_id": ("e", "entrypoint"),
    "traceparent": ("e", "traceparent"),
}
MODELS = {"d": Delivery, "e": Event, "t": Target}


def column(alias: str, name: str) -> str:
    quote = connection.ops.quote_name
    return f"{alias}.{quote(MODELS[alias]._meta.get_field(name).column)}"


@functools.cache
def for_vendor(vendor: str) -> dict[str, str]:
    """The claim's statements for this database, built once."""
    quote = connection.ops.quote_name
    delivery, event, target = (quote(MODELS[a]._meta.db_table) for a in "det")
    if vendor == "postgresql":
        ids = "= ANY(%s::bigint[])"
    else:
        ids = "IN (SELECT value FROM json_each(%s))"
    status = column("d", "status")
    # The head names the statuses as literals: a partial index (delivery_lane_idx)
    # serves a query only when its text implies the index's condition. The load
    # takes them as parameters, so that its prepared (generic) plan cannot prefer
    # such an index, scanned whole for the ids, to the primary key.
    unfinished = f"{status} IN ({', '.join(map(literal, Delivery.UNFINISHED))})"
    joined = f"{delivery} d JOIN {event} e ON e.id = {column('d', 'event')}"
    select = []
    for field, (alias, name) in TASK_COLUMNS.items():
        if field == "body":
            # Small bodies ride along with their task (task.py); large ones are
            # read at attempt time.
            select.append(
                f"CASE WHEN {column('e', 'body_size')} <= {INLINE_BODY_LIMIT:d} "
                f"THEN {column(alias, name)} END"
            )
        else:
            select.append(column(alias, name))
    return {
        # The tasks of claimed deliveries still unfinished: parameters, the ids
        # (ids_parameter) and Delivery.UNFINISHED.
        "load": (
            f"SELECT {', '.join(select)} FROM {joined} "
            f"WHERE d.id {ids} AND {status} IN (%s, %s) ORDER BY d.id"
        ),
        # An ordered target's next delivery, its task whole and then its target's
        # max_queue_size (claims.Claimer.claim_head): one parameter, the target's id.
        # A lane goes in event order: the first entry of the target's range of
        # delivery_lane_idx. Event ids are given in the order events are stored,
        # which is their order of arrival for a sender that waits for each 200;
        # received_at would add nothing to that but a sort of the whole backlog.
        "head": (
            f"SELECT {', '.join(select)}, {column('t', 'max_queue_size')} FROM {joined} "
            f"JOIN {target} t ON t.id = {column('d', 'target')} "
            f"WHERE {column('d', 'target')} = %s AND {unfinished} "
            f"ORDER BY {column('d', 'event')} LIMIT 1"
        ),
        # A target's unfinished deliveries from an id on, oldest first, as claim
        # candidates (claims.CANDIDATE_FIELDS): intake's overflow, one target at a
        # time, each pass. Parameters: the target, the first id, how many.
        "overflow": (
            f"SELECT d.id, {status}, {column('d', 'target')}, {column('t', 'max_queue_size')} "
            f"FROM {delivery} d JOIN {target} t ON t.id = {column('d', 'target')} "
            f"WHERE {column('d', 'target')} = %s AND d.id >= %s AND {unfinished} "
            "ORDER BY d.id LIMIT %s"
        ),
    }


def ids_parameter(ids: list[int]):
    return ids if connection.vendor == "postgresql" else json.dumps(ids)


def literal(value: str) -> str:
    if not value.isidentifier():
        raise ValueError(f"not a plain word: {value!r}")
    return f"'{value}'"


# Statements PostgreSQL plans once per connection (webhooker/db/postgresql's
# prepared cursor): lookups whose best plan is the same whatever the values, by
# primary key (`load`) or the first entries of an index range (`head`, `overflow`).
PREPARED = frozenset({"load", "head", "overflow"})


def run(name: str, params: list) -> list[tuple]:
    prepared = connection.vendor == "postgresql" and name in PREPARED
    with connection.prepared_cursor() if prepared else connection.cursor() as c:
        c.execute(for_vendor(connection.vendor)[name], params)
        return c.fetchall()


def _aware(value):
    """SQLite gives a DateTimeField naive, in UTC (Django's ORM makes it aware)."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=datetime.UTC)


def _uuid(value):
    return value if isinstance(value, uuid.UUID) else uuid.UUID(value)


def _json(value):
    return json.loads(value)


def _bytes(value):
    return None if value is None else bytes(value)


# What each database's values need to become what the ORM gives. PostgreSQL's rows
# come from a prepared cursor in binary (webhooker/db/postgresql): aware datetimes,
# UUIDs, decoded JSON and bytes already. SQLite's: naive datetimes, text.
CONVERT = {
    "sqlite": {
        "next_attempt_at": _aware,
        "received_at": _aware,
        "event_code": _uuid,
        "headers": _json,
        "body": _bytes,
    },
    "postgresql": {},
}


def loaded(row: tuple, vendor: str) -> dict:
    """A `load` row of this database as Task fields."""
    fields = dict(zip(TASK_COLUMNS, row, strict=True))
    for name, convert in CONVERT[vendor].items():
        fields[name] = convert(fields[name])
    fields["headers"] = fields["headers"] or []
    return fields

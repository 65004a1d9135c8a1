"""A past outage, written in bulk: events and their deliveries as it left them."""

import contextlib
import datetime

from django.db import connection, models
from django.utils import timezone

from deliveries.models import Delivery, Event

OUTAGE_START = timezone.now().replace(microsecond=0) - datetime.timedelta(days=1)
OUTAGE_END = OUTAGE_START + datetime.timedelta(hours=6)
HOUR = datetime.timedelta(hours=1)


def history(webhook, targets, n, *, start, span, status):
    """`n` events spread over `span` from `start`, each with a delivery in `status`
    to each of `targets`, written in bulk (as a past outage left them)."""
    step = span / max(n, 1)
    events = Event.objects.bulk_create(
        Event(webhook=webhook, method="POST", body=b'{"n": %d}' % i, received_at=start + i * step)
        for i in range(n)
    )
    Delivery.objects.bulk_create(
        Delivery(event=e, target=t, status=status, attempts=1) for e in events for t in targets
    )
    return events


def copies(instance, n: int) -> None:
    """`n` more rows like the saved model `instance`, written by the database in one
    statement: each with a new primary key and a new random value for each unique
    UUID field (Event.code). For tables of many rows whose contents do not matter,
    where bulk_create's building and binding of every value costs a minute of the
    test's CPU per 100 000 rows."""
    model = type(instance)
    quote = connection.ops.quote_name
    columns, values, params = [], [], []
    for field in model._meta.concrete_fields:
        if field.primary_key:
            continue
        columns.append(quote(field.column))
        if field.unique:
            if not isinstance(field, models.UUIDField):
                raise ValueError(f"{model.__name__}.{field.name} is unique: no copies of it")
            values.append(RANDOM_UUID[connection.vendor])
        else:
            values.append("%s")
            params.append(field.get_db_prep_save(getattr(instance, field.attname), connection))
    with connection.cursor() as cursor:
        cursor.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < %s) "
            f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(columns)}) "
            f"SELECT {', '.join(values)} FROM n",
            [n, *params],
        )


# A new UUID per row, as each database stores a UUIDField.
RANDOM_UUID = {"postgresql": "gen_random_uuid()", "sqlite": "lower(hex(randomblob(16)))"}


def outage(webhook, targets, n=10_000, *, outside=500):
    """`n` failed deliveries in the six-hour outage, delivered ones around it, and
    failed ones just outside: those must never be sent."""
    history(webhook, targets, outside, start=OUTAGE_START - HOUR, span=HOUR, status="delivered")
    history(webhook, targets, outside, start=OUTAGE_END, span=HOUR, status="failed")
    return history(webhook, targets, n, start=OUTAGE_START, span=6 * HOUR, status="failed")


@contextlib.contextmanager
def analyzed(*models):
    """PostgreSQL: the models' tables analyzed, as autovacuum would have analyzed a
    real history, so that a plan is the one chosen at that scale; afterwards their
    statistics gone again. Autovacuum is off on the test server and statistics
    outlive the rows a test leaves, so another test's plan would otherwise be
    chosen from this one's data. SQLite: nothing."""
    tables = [model._meta.db_table for model in models]
    if connection.vendor != "postgresql":
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {', '.join(tables)}")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            for table in tables:
                cursor.execute("DELETE FROM pg_statistic WHERE starelid = %s::regclass", [table])
                cursor.execute(
                    "UPDATE pg_class SET reltuples = -1, relpages = 0, relallvisible = 0 "
                    "WHERE oid = %s::regclass",
                    [table],
                )

"""Every statement of the inbound path, named in one place and built once per
database vendor. They write exactly the columns the models define.

On PostgreSQL the event, its deliveries and the engine's wake-up are one statement
(data-modifying CTEs), atomic on its own: one round trip in place of BEGIN, two
INSERTs, NOTIFY and COMMIT. SQLite has no data-modifying CTEs (and no network, so
statements cost no round trips): there they are statements in one transaction.
"""

import functools

from django.db import connection

from deliveries import wake
from deliveries.models import Delivery, Entrypoint, Event, Target


def tables() -> dict[str, str]:
    """The tables' quoted names, as the models define them."""
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
AS_READ = "e.verification, CAST(e.verification_config AS text), e.dedup, e.dedup_source"
UNCHANGED = (
    "e.id = %s AND e.active AND e.verification = %s "
    "AND CAST(e.verification_config AS text) = %s AND e.dedup = %s AND e.dedup_source = %s"
)


EVENT_COLUMNS = (
    "code, webhook_id, entrypoint_id, method, query_string, headers, body, body_file, "
    "body_size, content_type, remote_addr, received_at, provider_id, deduplicated, duplicates, "
    "event_type, request_id, traceparent"
)


@functools.cache
def for_vendor(vendor: str) -> dict[str, str]:
    """The store statements for this database, built once."""
    t = tables()
    # The event's row, only while the entrypoint is as read. The unique index
    # event_provider_id_uniq decides between concurrent posts of one provider id: the
    # loser's insert does nothing (after waiting for the winner's transaction on
    # PostgreSQL) and it answers with the winner's event.
    event = (
        f"INSERT INTO {t['event']} ({EVENT_COLUMNS}) "
        "SELECT %s, %s, e.id, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s "
        f"FROM {t['entrypoint']} e WHERE {UNCHANGED} "
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
        "unchanged": f"SELECT 1 FROM {t['entrypoint']} e WHERE {UNCHANGED}",
    }
    # One more receipt of the kept event with this provider id.
    statements["count_duplicate"] = (
        f"UPDATE {t['event']} SET duplicates = duplicates + 1 "
        "WHERE webhook_id = %s AND provider_id = %s AND deduplicated RETURNING id, code"
    )
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

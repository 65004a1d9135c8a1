"""The admin's key queries read indexes, never whole tables: their plans are
asserted here (EXPLAIN names the index), not their timings. bench/admin_scale.py
measures the timings on a million deliveries.

A planner picks from statistics, and a test's few rows say nothing like a
history's. On SQLite the test loads the statistics ANALYZE gathered on
bench/admin_scale.py's data set (a million deliveries) into sqlite_stat1, so the
plan is the one chosen at that scale: "SEARCH ... USING [COVERING] INDEX name". On
PostgreSQL sequential scans are switched off, so the plan shows the index it would
use rather than a scan of a tiny table (and, for an ORDER BY an index should serve,
sorts too). PostgreSQL's plans are asserted by index name where one index
alone serves the query, else (`uses_at_scale`) by an index of the table, and always
by the absence of a sequential scan of the big tables; SQLite's by its SEARCH lines.
"""

import datetime
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from deliveries.admin import dashboard, search
from deliveries.models import Delivery, Event
from tests.support.admin import client_for, world
from tests.support.engines import store

pytestmark = pytest.mark.django_db


# sqlite_stat1 as ANALYZE wrote it on bench/admin_scale.py's data set.
AT_SCALE = [
    ("deliveries_deliveryresult", "result_target_created_idx", "2000000 20000 2"),
    ("deliveries_deliveryresult", "deliveries_deliveryresult_delivery_id_23f65beb", "2000000 2"),
    ("deliveries_delivery", "delivery_attempts_idx", "1000000 500000 1"),
    ("deliveries_delivery", "delivery_target_status_idx", "1000000 10000 2500 1"),
    ("deliveries_delivery", "delivery_updated_status_idx", "1000000 1 1 1"),
    ("deliveries_delivery", "delivery_target_unfinished_idx", "39655 397 1"),
    ("deliveries_delivery", "delivery_retry_due_idx", "19778 1"),
    ("deliveries_delivery", "delivery_unfinished_idx", "39655 19828 1"),
    ("deliveries_delivery", "delivery_target_idx", "1000000 10000 1"),
    ("deliveries_delivery", "delivery_status_idx", "1000000 250000 1"),
    ("deliveries_delivery", "sqlite_autoindex_deliveries_delivery_1", "1000000 2 1"),
    ("deliveries_event", "event_provider_id_idx", "500000 1"),
    ("deliveries_event", "event_webhook_received_idx", "500000 10000 1"),
    ("deliveries_event", "event_received_idx", "500000 1 1"),
    ("deliveries_event", "deliveries_event_webhook_id_9998113a", "500000 10000"),
    ("deliveries_event", "deliveries_event_entrypoint_id_2283edb6", "500000 10000"),
    ("deliveries_event", "sqlite_autoindex_deliveries_event_1", "500000 1"),
    ("deliveries_target", "deliveries_target_webhook_id_369c76d6", "100 2"),
    ("deliveries_webhook", "deliveries_webhook_owner_id_c94a39ca", "50 50"),
    ("deliveries_webhook", "sqlite_autoindex_deliveries_webhook_1", "50 1"),
]


@pytest.fixture(autouse=True)
def at_scale():
    if connection.vendor != "sqlite":
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # makes sqlite_stat1
        cursor.execute("DELETE FROM sqlite_stat1")
        cursor.executemany(
            "INSERT INTO sqlite_stat1 (tbl, idx, stat) VALUES (%s, %s, %s)", AT_SCALE
        )
        cursor.execute("ANALYZE sqlite_schema")  # the planner reads them again
    yield
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM sqlite_stat1")
        cursor.execute("ANALYZE sqlite_schema")


def plan(sql, params=(), *, sort=True) -> str:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute(f"SET LOCAL enable_sort = {'on' if sort else 'off'}")
            cursor.execute(f"EXPLAIN {sql}", params)
        else:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
        return "\n".join(" ".join(str(part) for part in row) for row in cursor.fetchall())


def queries_of(url, user, needle):
    """The plans of the queries a page runs whose SQL contains `needle`."""
    with CaptureQueriesContext(connection) as captured:
        assert client_for(user).get(url).status_code == 200
    found = [q["sql"] for q in captured.captured_queries if needle in q["sql"]]
    assert found, f"no query with {needle!r} on {url}"
    return [plan(sql) for sql in found]


def uses(index, text):
    assert index in text, text


def uses_at_scale(index, text, table):
    """`index` on SQLite, planned with the statistics of a million deliveries. On
    PostgreSQL, whose statistics cannot be loaded that way, an index of `table`:
    which one the planner picks for a test's few rows turned with the state of the
    server (ties between the indexes that serve the query, read forwards, backwards
    or through a bitmap), and never reading the table whole is what holds.
    bench/admin_scale.py times these queries at scale."""
    if connection.vendor == "postgresql":
        read = rf"(Index (Only )?Scan( Backward)? using \S+|Bitmap Heap Scan) on {table}\b"
        assert re.search(read, text), text
        no_full_scan(text)
    else:
        uses(index, text)


def no_full_scan(text):
    for table in ("deliveries_delivery", "deliveries_event", "deliveries_deliveryresult"):
        assert f"Seq Scan on {table}" not in text, text
        assert f"SCAN {table}\n" not in text + "\n", text


@pytest.fixture
def history(superuser):
    # A superuser's queries: no ownership join, the shape that must hold up on a
    # million rows (a scoped user's start from their few webhooks).
    hook, target, event, delivery = world(superuser, "h")
    store(hook.entrypoints.get(), n=5, headers=[["X-GitHub-Delivery", "dlv-1"]])
    return hook, target, event, delivery


def test_search_by_code_prefix_and_provider_id_reads_indexes(history):
    _, _, event, _ = history
    query = search.find(Event.objects.all(), str(event.code)[:8]).query
    sql, params = query.sql_with_params()
    text = plan(sql, params)
    uses("event_provider_id_idx", text)
    # The code's unique index (named by the table on SQLite, _key on PostgreSQL).
    assert "deliveries_event_code" in text or "sqlite_autoindex_deliveries_event" in text, text


def test_bounded_scans_read_the_newest_events_from_their_index(history):
    found, _ = search.scan(Event.objects.filter(webhook=history[0]), "dlv", "payload")
    sql, params = found.query.sql_with_params()
    text = plan(sql, params)
    no_full_scan(text)
    uses_at_scale("event_webhook_received_idx", text, "deliveries_event")


def test_dashboard_reads_the_days_range_of_one_index(history, superuser):
    with CaptureQueriesContext(connection) as captured:
        dashboard.context(superuser)
    day = [
        q["sql"]
        for q in captured.captured_queries
        if "deliveries_delivery" in q["sql"] and '"updated_at" >=' in q["sql"]
    ]
    assert len(day) >= 4  # counts by status, by hour, failed by target, failed by fault
    for sql in day:
        # delivery_updated_status_idx's range, or delivery_target_status_idx's per target.
        text = plan(sql)
        no_full_scan(text)
        if connection.vendor == "postgresql":
            # Which delivery index PostgreSQL picks for a test's few rows varies
            # (status, updated_at, target); that it reads one, never the table, does not.
            assert re.search(r"Index (Only )?Scan (using|on) delivery_", text), text
        elif '"failure"' in sql:
            # Failed by fault: a range of the day's failed deliveries in an index
            # (by day, or per target), and the row of each for its class.
            uses("SEARCH deliveries_delivery USING INDEX delivery_", text)
        else:
            uses("SEARCH deliveries_delivery USING COVERING INDEX", text)


def test_webhook_list_counts_read_each_targets_index_range(history, superuser):
    plans = queries_of(reverse("admin:deliveries_webhook_changelist"), superuser, "failed_24h")
    # The page's query (PostgreSQL leaves the unused counts out of the COUNT query's plan).
    uses_at_scale("delivery_target_status_idx", "\n".join(plans), "deliveries_delivery")
    for text in plans:
        no_full_scan(text)


def test_delivery_list_sorted_by_attempts_reads_its_index(history, superuser):
    url = reverse("admin:deliveries_delivery_changelist") + "?o=-6"
    with CaptureQueriesContext(connection) as captured:
        assert client_for(superuser).get(url).status_code == 200
    needle = 'ORDER BY "deliveries_delivery"."attempts" DESC'
    found = [q["sql"] for q in captured.captured_queries if needle in q["sql"]]
    uses("delivery_attempts_idx", plan(found[-1], sort=False))


def test_event_list_reads_the_received_index_and_no_body(history, superuser):
    with CaptureQueriesContext(connection) as captured:
        client_for(superuser).get(reverse("admin:deliveries_event_changelist"))
    listed = [q["sql"] for q in captured.captured_queries if 'FROM "deliveries_event"' in q["sql"]]
    page = [sql for sql in listed if "ORDER BY" in sql and "COUNT" not in sql]
    assert page, listed
    assert all('"body"' not in sql for sql in page)
    uses("event_received_idx", plan(page[0], sort=False))


def test_redeliver_failed_since_reads_the_target_status_index(history):
    _, target, *_ = history
    since = timezone.now() - datetime.timedelta(hours=1)
    query = Delivery.objects.filter(target=target, status="failed", updated_at__gte=since).query
    sql, params = query.sql_with_params()
    uses_at_scale("delivery_target_status_idx", plan(sql, params), "deliveries_delivery")

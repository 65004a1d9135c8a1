"""`make bench-admin`: the admin's pages on a realistic history, timed.

Builds 500 000 events, 1 000 000 deliveries and 2 000 000 attempt results over 30
days across 50 webhooks (two targets each), then times every page a user visits
and prints one `admin_ms_<page>=<ms>` line per page (the median server time of a
few requests through Django's test client: the view, its queries and the
template, no network). On PostgreSQL the names end in _pg.

    ADMIN_BENCH_SCALE=0.1    a tenth of the rows (default 1: the sizes above)
    BENCH_DATABASES=sqlite   one database only (default: sqlite, and pg when
                             BENCH_PG_ADMIN_URL's server answers)
    ADMIN_BENCH_KEEP=DIR     build into DIR once and reuse it on later runs

The build inserts with executemany on one connection (COPY-like batches), then
lets the database ANALYZE; on this machine the full SQLite build takes a few
minutes. Goal: every page <= 300 ms, the dashboard <= 150 ms.
"""

import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

EVENTS = 500_000
WEBHOOKS = 50
DAYS = 30
BATCH = 20_000
GOALS = {"dashboard": 150}
GOAL = 300


def log(message):
    print(f"# {message}", file=sys.stderr, flush=True)


# --- the driver: one worker process per database ---------------------------------


# A database of its own: `make bench` may be using webhooker_bench meanwhile.
PG_NAME = "webhooker_admin_bench"


def pg_url():
    from bench.run import PG_ADMIN

    return PG_ADMIN.rsplit("/", 1)[0] + "/" + PG_NAME


def fresh_pg_database():
    import psycopg

    from bench.run import PG_ADMIN

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {PG_NAME} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {PG_NAME}")
    return pg_url()


def main():
    from bench.run import PG_ADMIN

    wanted = os.environ.get("BENCH_DATABASES", "")
    databases = wanted.split(",") if wanted else ["sqlite", "pg"]
    missed = []
    for database in databases:
        # Without DEBUG's per-query bookkeeping, as a deployment runs; the test
        # client's host must be allowed.
        env = {**os.environ, "DEBUG": "0", "LOG_LEVEL": "warning", "ALLOWED_HOSTS": "testserver"}
        keep = os.environ.get("ADMIN_BENCH_KEEP")
        data_dir = Path(keep) / database if keep else Path(tempfile.mkdtemp(prefix="wh-admin-"))
        data_dir.mkdir(parents=True, exist_ok=True)
        env["DATA_DIR"] = str(data_dir)
        if database == "pg":
            try:
                # Kept (ADMIN_BENCH_KEEP): the database built by an earlier run.
                reuse = keep and (data_dir / "built").exists()
                env["DATABASE_URL"] = pg_url() if reuse else fresh_pg_database()
            except Exception as exc:  # no server: SQLite's figures still stand
                log(f"PostgreSQL at {PG_ADMIN} not usable ({exc}); skipped")
                continue
        else:
            env.pop("DATABASE_URL", None)
        result = subprocess.run(
            [sys.executable, __file__, "--worker"], env=env, stdout=subprocess.PIPE, text=True
        )
        if result.returncode:
            raise SystemExit(f"admin bench on {database} failed")
        suffix = "_pg" if database == "pg" else ""
        for line in result.stdout.splitlines():
            name, _, value = line.partition("=")
            print(f"{name}{suffix}={value}", flush=True)
            page = name.removeprefix("admin_ms_")
            if float(value) > GOALS.get(page, GOAL):
                missed.append(f"{name}{suffix}")
    if missed:
        log(f"over the goal: {', '.join(missed)}")


# --- the worker: build, then time ------------------------------------------------


def setup():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webhooker.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def rows_for(model, connection):
    """A column list and a function making one row from a dict of values; every
    column missing from the dict gets its default, adapted once."""
    fields = model._meta.concrete_fields
    defaults = {
        f.attname: f.get_db_prep_save(f.get_default(), connection)
        for f in fields
        if not f.primary_key
    }
    columns = [f.column for f in fields]

    def prep(row: dict):
        return [
            f.get_db_prep_save(row[f.attname], connection)
            if f.attname in row
            else defaults.get(f.attname)
            for f in fields
        ]

    return columns, prep


def insert(connection, model, columns, rows):
    table = connection.ops.quote_name(model._meta.db_table)
    names = ", ".join(connection.ops.quote_name(c) for c in columns)
    marks = ", ".join(["%s"] * len(columns))
    with connection.cursor() as cursor:
        cursor.executemany(f"INSERT INTO {table} ({names}) VALUES ({marks})", rows)


WORDS = ["invoice", "payment", "customer", "order", "refund", "charge", "subscription", "shipment"]


def build(scale: float):
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction
    from django.utils import timezone

    from deliveries.models import Delivery, DeliveryResult, Event, Target, Webhook

    if Event.objects.exists():
        log("reusing the data set already built")
        return
    started = time.monotonic()
    rng = random.Random(13)
    users = get_user_model()
    admin = users.objects.filter(username="bench").first() or users.objects.create_superuser(
        "bench", password="bench-pw-123!"
    )
    targets = []
    for n in range(WEBHOOKS):
        hook = Webhook.objects.create(name=f"hook-{n:02d}", owner=admin)
        hook.ensure_entrypoint()
        for name in ("api", "archive"):
            targets.append(
                Target.objects.create(
                    webhook=hook,
                    name=name,
                    type="http",
                    config={"url": f"https://example.com/{n}/{name}"},
                )
            )
    entrypoints = {t.webhook_id: t.webhook.entrypoints.get().pk for t in targets}
    by_hook = {}
    for target in targets:
        by_hook.setdefault(target.webhook_id, []).append(target.pk)
    hooks = list(by_hook)
    events = int(EVENTS * scale)
    now = timezone.now()
    span = DAYS * 86400
    event_cols, event_row = rows_for(Event, connection)
    delivery_cols, delivery_row = rows_for(Delivery, connection)
    result_cols, result_row = rows_for(DeliveryResult, connection)
    statuses = ["delivered"] * 90 + ["failed"] * 6 + ["retrying"] * 2 + ["pending"] * 2
    delivery_id = result_id = 0
    for start in range(0, events, BATCH):
        event_rows, delivery_rows, result_rows = [], [], []
        for event_id in range(start + 1, min(events, start + BATCH) + 1):
            hook = hooks[event_id % len(hooks)]
            # Oldest first: ids grow with time, as they do when events arrive.
            received = now - datetime.timedelta(seconds=span * (1 - event_id / events))
            kind = f"{rng.choice(WORDS)}.{rng.choice(['created', 'paid', 'failed'])}"
            body = json.dumps(
                {
                    "id": f"evt_{event_id:010d}",
                    "type": kind,
                    "data": {"customer": f"cus_{rng.randrange(10**8):08d}", "amount": event_id},
                }
            ).encode()
            event_rows.append(
                event_row(
                    {
                        "id": event_id,
                        "code": uuid.UUID(int=rng.getrandbits(128), version=4),
                        "webhook_id": hook,
                        "entrypoint_id": entrypoints[hook],
                        "method": "POST",
                        "headers": [
                            ["Content-Type", "application/json"],
                            ["X-GitHub-Event", kind],
                            ["X-GitHub-Delivery", f"dlv-{event_id}"],
                        ],
                        "body": body,
                        "body_size": len(body),
                        "content_type": "application/json",
                        "remote_addr": "203.0.113.7",
                        "received_at": received,
                        "provider_id": f"evt_{event_id:010d}",
                        "event_type": kind,
                    }
                )
            )
            for target in by_hook[hook]:
                delivery_id += 1
                status = rng.choice(statuses)
                attempts = 2 if status in ("delivered", "failed", "retrying") else 0
                updated = received + datetime.timedelta(seconds=rng.randrange(1, 120))
                delivery_rows.append(
                    delivery_row(
                        {
                            "id": delivery_id,
                            "event_id": event_id,
                            "target_id": target,
                            "status": status,
                            "attempts": attempts,
                            "next_attempt_at": updated if status == "retrying" else None,
                            "created_at": received,
                            "updated_at": updated,
                        }
                    )
                )
                # Two results per delivery on average: 2 000 000 at full scale.
                for attempt in (1, 2):
                    result_id += 1
                    success = status == "delivered" and attempt == 2
                    result_rows.append(
                        result_row(
                            {
                                "id": result_id,
                                "delivery_id": delivery_id,
                                "target_id": target,
                                "attempt": attempt,
                                "success": success,
                                "status_code": 200 if success else 503,
                                "response_body": "ok" if success else "busy",
                                "error": "" if success else "HTTP 503",
                                "duration_ms": rng.randrange(5, 900),
                                "created_at": received,
                            }
                        )
                    )
        with transaction.atomic():
            insert(connection, Event, event_cols, event_rows)
            insert(connection, Delivery, delivery_cols, delivery_rows)
            insert(connection, DeliveryResult, result_cols, result_rows)
        log(f"built {min(events, start + BATCH)} of {events} events")
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            for model in (Event, Delivery, DeliveryResult):
                table = model._meta.db_table
                cursor.execute(
                    f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                    f"(SELECT max(id) FROM {table}))"
                )
        cursor.execute("ANALYZE")
    (Path(os.environ["DATA_DIR"]) / "built").touch()
    log(f"built in {time.monotonic() - started:.0f} s")


def pages():
    from django.urls import reverse

    from deliveries.models import Delivery, Event, Webhook

    hook = Webhook.objects.order_by("pk")[WEBHOOKS // 2]
    event = Event.objects.order_by("-pk").values_list("pk", "code", "provider_id")[100]
    delivery = Delivery.objects.order_by("-pk").values_list("pk", flat=True)[100]
    events = reverse("admin:deliveries_event_changelist")
    deliveries = reverse("admin:deliveries_delivery_changelist")
    return {
        "dashboard": reverse("admin:index"),
        "dashboard_live": reverse("dashboard_live"),
        "webhook_list": reverse("admin:deliveries_webhook_changelist"),
        "webhook_page": reverse("admin:deliveries_webhook_change", args=[hook.pk]),
        "target_list": reverse("admin:deliveries_target_changelist"),
        "event_list": events,
        "event_list_webhook": f"{events}?webhook={hook.pk}",
        "event_list_status": f"{events}?delivery_status=failed",
        "event_search_code": f"{events}?q={str(event[1])[:8]}",
        "event_search_provider_id": f"{events}?q={event[2]}",
        "event_search_payload": f"{events}?search_in=payload&q=cus_0000",
        "event_search_header": f"{events}?search_in=headers&q=dlv-12",
        "event_page": reverse("admin:deliveries_event_change", args=[event[0]]),
        "delivery_list": deliveries,
        "delivery_list_status": f"{deliveries}?status__exact=failed",
        "delivery_list_webhook": f"{deliveries}?webhook={hook.pk}",
        "delivery_list_sorted": f"{deliveries}?o=-6",
        "delivery_page": reverse("admin:deliveries_delivery_change", args=[delivery]),
    }


def time_pages(runs=5):
    from django.contrib.auth import get_user_model
    from django.test import Client

    client = Client()
    client.force_login(get_user_model().objects.get(username="bench"))
    for name, url in pages().items():
        timings = []
        for n in range(runs + 1):
            started = time.perf_counter()
            response = client.get(url)
            elapsed = (time.perf_counter() - started) * 1000
            if response.status_code != 200:
                raise SystemExit(f"{url} answered {response.status_code}")
            if n:  # the first request warms caches
                timings.append(elapsed)
        print(f"admin_ms_{name}={statistics.median(timings):.1f}", flush=True)


def worker():
    setup()
    build(float(os.environ.get("ADMIN_BENCH_SCALE", "1")))
    time_pages()


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker()
    else:
        main()

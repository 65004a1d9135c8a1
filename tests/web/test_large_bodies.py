"""Large bodies on SQLite are written beside the database, not in the writer's
transaction (deliveries/bodies.py): a 10 MiB upload must not hold every other
event of every process while its pages reach the WAL (issue found from outside:
twenty 9.9 MiB uploads made small events wait 20 s for the writer, then 503)."""

import datetime
import hashlib
import os
import time

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from deliveries import bodies, retention
from deliveries.models import Event
from tests.support.admin import client_for
from tests.support.api import key_for
from tests.support.engines import make_engine, pump

pytestmark = pytest.mark.django_db

sqlite_only = pytest.mark.skipif(
    connection.vendor != "sqlite",
    reason="PostgreSQL's writers do not queue behind one another: bodies stay in rows",
)

LARGE = 2 * 1024 * 1024


@pytest.fixture(autouse=True)
def own_data_dir(settings, tmp_path):
    settings.DATA_DIR = tmp_path


def large_body(size=LARGE, seed=b"x"):
    block = hashlib.sha256(seed).digest() * 32  # 1 KiB of bytes that are not all alike
    return (block * (size // len(block) + 1))[:size]


def post(entrypoint, body, **extra):
    return Client().generic(
        "POST",
        f"/webhook/{entrypoint.code}",
        body,
        content_type="application/octet-stream",
        **extra,
    )


class LargestParameter:
    """The largest bytes parameter any statement was given (an execute_wrapper)."""

    def __init__(self):
        self.size = 0

    def __call__(self, execute, sql, params, many, context):
        for param in (params or []) if not many else [p for row in params for p in row]:
            if isinstance(param, (bytes, bytearray, memoryview)):
                self.size = max(self.size, len(param))
        return execute(sql, params, many, context)


@sqlite_only
def test_a_large_body_is_not_written_in_the_database_transaction(entrypoint, make_target):
    make_target(url="http://127.0.0.1:9/x")
    body = large_body()
    largest = LargestParameter()
    with connection.execute_wrapper(largest):
        response = post(entrypoint, body)
    assert response.status_code == 200
    assert largest.size < 64 * 1024  # the row names the file; no 2 MiB blob
    event = Event.objects.get()
    assert event.body_size == LARGE and bytes(event.body) == b""
    assert event.body_file
    assert event.read_body() == body
    assert (bodies.directory() / event.body_file).stat().st_size == LARGE


def test_a_body_under_the_threshold_stays_in_the_row(entrypoint, settings):
    body = large_body(settings.WEBHOOKER_BODY_FILE_BYTES - 1)
    assert post(entrypoint, body).status_code == 200
    event = Event.objects.get()
    assert event.body_file is None and bytes(event.body) == body
    assert event.read_body() == body


def test_large_bodies_stay_in_rows_when_the_setting_is_off(entrypoint, settings):
    settings.WEBHOOKER_BODY_FILE_BYTES = 0
    body = large_body()
    assert post(entrypoint, body).status_code == 200
    event = Event.objects.get()
    assert event.body_file is None and bytes(event.body) == body


@sqlite_only
def test_a_spilled_body_is_delivered_served_and_resent_byte_for_byte(
    user, entrypoint, make_target, sink
):
    make_target(url=sink.url("/big"))
    body = large_body(seed=b"delivered")
    assert post(entrypoint, body).status_code == 200
    event = Event.objects.get()
    assert event.body_file

    pump(make_engine(), lambda: sink.requests("/big"))
    (received,) = sink.requests("/big")
    assert received.body == body

    api = Client(headers={"Authorization": f"Bearer {key_for(user)}"})
    served = api.get(f"/api/v1/events/{event.pk}/body/")
    assert served.status_code == 200
    assert b"".join(served.streaming_content if served.streaming else [served.content]) == body

    resent = api.post(f"/api/v1/events/{event.pk}/resend/", {}, content_type="application/json")
    assert resent.status_code in (200, 201), resent.content
    copy = Event.objects.get(resent_from=event)
    assert copy.body_file and copy.body_file != event.body_file
    assert copy.read_body() == body


@sqlite_only
def test_a_duplicate_leaves_no_file_behind(entrypoint):
    entrypoint.dedup, entrypoint.dedup_source = True, "header:X-Event-Id"
    entrypoint.save()
    body = large_body()
    for _ in range(2):
        assert post(entrypoint, body, HTTP_X_EVENT_ID="evt-1").status_code == 200
    event = Event.objects.get()
    assert event.duplicates == 1
    assert [p.name for p in bodies.directory().iterdir()] == [event.body_file]


@sqlite_only
def test_the_sweep_deletes_files_no_event_names_once_they_are_old(entrypoint):
    for seed in (b"kept", b"deleted"):
        assert post(entrypoint, large_body(seed=seed)).status_code == 200
    kept, deleted = Event.objects.order_by("id")
    Event.objects.filter(pk=deleted.pk).delete()
    orphan = bodies.write(b"a crash between the file and the row" * 40_000)
    young = bodies.write(b"a row about to commit" * 60_000)
    old = time.time() - bodies.ORPHAN_AGE - 60
    for name in (kept.body_file, deleted.body_file, orphan):
        os.utime(bodies.directory() / name, (old, old))

    assert retention.sweep_body_files() == 2
    assert sorted(p.name for p in bodies.directory().iterdir()) == sorted([kept.body_file, young])
    assert kept.read_body() == large_body(seed=b"kept")


@sqlite_only
def test_pruning_an_old_event_deletes_its_body_file(entrypoint):
    assert post(entrypoint, large_body()).status_code == 200
    event = Event.objects.get()
    Event.objects.filter(pk=event.pk).update(
        received_at=event.received_at - datetime.timedelta(days=400)
    )
    removed = retention.prune_events()
    assert removed["events"] == 1 and removed["body files"] == 1
    assert list(bodies.directory().iterdir()) == []


@sqlite_only
def test_a_body_file_that_cannot_be_written_is_a_503_and_nothing_stored(entrypoint, settings):
    """A full disk (or any failure to write the file) is the service being
    unavailable, as when SQLite cannot store the row: 503 with Retry-After."""
    bodies.directory().write_bytes(b"")  # a file where the folder goes: nothing is made
    response = post(entrypoint, large_body())
    assert response.status_code == 503 and response["Retry-After"]
    assert not Event.objects.exists()


@sqlite_only
def test_a_missing_body_file_holds_its_delivery_and_says_why(
    user, superuser, entrypoint, make_target, sink, caplog
):
    """A body file gone (a restore without it, a disk fault): the delivery waits,
    owned, for BODY_RETRY, rather than circling through recovery (an ordered
    target's head at once, for ever); the console and the API say what is wrong."""
    make_target(url=sink.url("/big"), ordered=True, max_retries=3)
    assert post(entrypoint, large_body()).status_code == 200
    event = Event.objects.get()
    (bodies.directory() / event.body_file).unlink()

    engine = make_engine()
    engine.intake_once()
    assert engine.process_one()
    assert sink.requests("/big") == []
    (task,) = engine.scheduler.take(lambda t: True)  # waiting, still owned
    assert task.event_id == event.pk
    assert "body file" in caplog.text

    api = Client(headers={"Authorization": f"Bearer {key_for(user)}"})
    answer = api.get(f"/api/v1/events/{event.pk}/body/")
    assert answer.status_code == 500 and "body file" in answer.json()["error"]
    page = client_for(superuser).get(reverse("admin:deliveries_event_change", args=[event.pk]))
    assert page.status_code == 200 and b"cannot be read" in page.content

"""Export (issue 28): the event and delivery lists as filtered, streamed as CSV or JSON
Lines, from the API and the console, under the ownership rule."""

import csv
import io
import json
import math
import tracemalloc

import pytest
from django.http import StreamingHttpResponse
from django.utils import timezone

from deliveries import export
from deliveries.models import Delivery, Event
from tests.support.admin import client_for, world
from tests.support.api import client_of
from tests.support.history import copies

pytestmark = pytest.mark.django_db


def body(response) -> str:
    assert isinstance(response, StreamingHttpResponse)
    return b"".join(response.streaming_content).decode()


def test_events_as_jsonl_and_csv_with_the_lists_filters(alice, bob):
    hook, _, event, _ = world(alice, "alices")
    world(bob, "bobs")  # never in alice's export
    client = client_of(alice)

    lines = body(client.get(f"/api/v1/events/export/?webhook={hook.pk}")).splitlines()
    assert [json.loads(line)["code"] for line in lines] == [str(event.code)]

    response = client.get("/api/v1/events/export/?as=csv", HTTP_ACCEPT="text/csv")
    assert response["Content-Type"].startswith("text/csv")
    assert 'filename="events.csv"' in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(body(response))))
    assert [row["code"] for row in rows] == [str(event.code)]
    assert rows[0]["webhook"] == str(hook.pk)


def test_deliveries_export_with_whose_fault_and_a_bad_format_refused(alice):
    _, target, _, delivery = world(alice, "alices")
    Delivery.objects.filter(pk=delivery.pk).update(failure="timeout")
    client = client_of(alice)
    lines = body(client.get("/api/v1/deliveries/export/?fault=receiver")).splitlines()
    (row,) = [json.loads(line) for line in lines]
    assert (row["id"], row["target"], row["status"], row["failure"]) == (
        delivery.pk,
        target.pk,
        "failed",
        "timeout",
    )
    assert body(client.get("/api/v1/deliveries/export/?fault=ours")) == ""
    refused = client.get("/api/v1/deliveries/export/?as=xml")
    assert refused.status_code == 400
    assert "as" in refused.json()["fields"]


def test_the_console_exports_what_the_list_shows(alice, bob):
    _, _, event, _ = world(alice, "alices")
    world(bob, "bobs")
    client = client_for(alice)
    page = client.get("/admin/deliveries/event/?q=" + str(event.code)[:8]).content.decode()
    assert "/admin/deliveries/event/export/csv/?q=" in page
    rows = list(
        csv.DictReader(io.StringIO(body(client.get("/admin/deliveries/event/export/csv/"))))
    )
    assert [row["code"] for row in rows] == [str(event.code)]
    lines = body(client.get("/admin/deliveries/delivery/export/jsonl/?status__exact=failed"))
    assert [json.loads(line)["event_code"] for line in lines.splitlines()] == [str(event.code)]
    assert client.get("/admin/deliveries/delivery/export/xml/").status_code == 404


def test_an_export_streams_in_constant_memory(alice):
    hook, *_ = world(alice, "big")
    # 100 000 events, as the issue asks.
    copies(Event.objects.create(webhook=hook, method="POST", received_at=timezone.now()), 99_999)
    response = client_of(alice).get("/api/v1/events/export/?as=csv")
    tracemalloc.start()
    try:
        rows = chunks = 0
        peak_at_first_chunk = None
        for chunk in response.streaming_content:
            rows += chunk.count(b"\n")
            chunks += 1
            if peak_at_first_chunk is None and rows > 2500:
                peak_at_first_chunk = tracemalloc.get_traced_memory()[1]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rows == 100_002  # the header and every event, world's one included
    # Written a chunk of rows at a time, not a row at a time.
    assert chunks == math.ceil(rows / export.CHUNK)
    # Reading forty times the rows did not take forty times the memory: chunks come and go.
    assert peak < 2 * peak_at_first_chunk

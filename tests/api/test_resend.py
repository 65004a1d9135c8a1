"""Edit and resend (issue 28): an edited copy of one event, stored as a new event
linked to the original, delivered as usual; from the API and the event's page."""

import json

import pytest

from deliveries.models import Delivery, Event
from tests.support.admin import client_for, world
from tests.support.api import client_of
from tests.support.engines import pump, started_engine

pytestmark = pytest.mark.django_db


def test_the_api_resends_an_edited_copy_that_is_delivered(alice, sink):
    hook, target, event, _ = world(alice, "alices")
    target.config = {"url": sink.url("/again")}
    target.save()
    response = client_of(alice).post(
        f"/api/v1/events/{event.pk}/resend/",
        {
            "body": '{"who": "fixed"}',
            "headers": [["Content-Type", "application/json"], ["X-Fix", "1"]],
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    copy = Event.objects.get(pk=response.json()["id"])
    assert response.json()["resent_from"] == event.pk
    assert (copy.resent_from, copy.webhook, bytes(copy.body)) == (event, hook, b'{"who": "fixed"}')
    assert copy.headers == [["Content-Type", "application/json"], ["X-Fix", "1"]]
    assert Delivery.objects.get(event=copy).status == "pending"

    engine = started_engine()
    pump(engine, lambda: Delivery.objects.get(event=copy).status == "delivered")
    (received,) = sink.requests("/again")
    assert json.loads(received.body) == {"who": "fixed"}
    assert received.headers["X-Fix"] == "1"


def test_what_is_left_out_is_kept_and_bad_lines_are_refused(alice, bob):
    _, _, event, _ = world(alice, "alices")
    client = client_of(alice)
    same = client.post(f"/api/v1/events/{event.pk}/resend/", {}, format="json").json()
    assert bytes(Event.objects.get(pk=same["id"]).body) == bytes(event.body)
    bad = client.post(
        f"/api/v1/events/{event.pk}/resend/", {"headers": [["Bad Name", "x"]]}, format="json"
    )
    assert bad.status_code == 400 and "Line 1" in bad.json()["fields"]["headers"][0]
    theirs = client_of(bob).post(f"/api/v1/events/{event.pk}/resend/", {}, format="json")
    assert theirs.status_code == 404


def test_the_event_page_edits_and_resends(alice):
    _, _, event, _ = world(alice, "alices")
    client = client_for(alice)
    page = client.get(f"/admin/deliveries/event/{event.pk}/change/").content.decode()
    url = f"/admin/deliveries/event/{event.pk}/resend/"
    assert url in page
    form = client.get(url).content.decode()
    assert "Content-Type: application/json" in form and "alices" in form
    response = client.post(
        url, {"apply": "1", "headers": "Content-Type: application/json\nX-A: 1", "body": '{"n": 2}'}
    )
    copy = Event.objects.exclude(pk=event.pk).get()
    assert response.status_code == 302
    assert response["Location"] == f"/admin/deliveries/event/{copy.pk}/change/"
    assert (copy.resent_from_id, bytes(copy.body)) == (event.pk, b'{"n": 2}')
    assert copy.headers == [["Content-Type", "application/json"], ["X-A", "1"]]
    refused = client.post(url, {"apply": "1", "headers": "no colon here", "body": ""})
    assert refused.status_code == 200 and "Line 1" in refused.content.decode()
    assert Event.objects.count() == 2

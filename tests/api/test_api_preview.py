"""A target's transform, set and tried through the API and the console before a
receiver sees it: POST /api/v1/targets/{id}/preview/ and the target page's
"Run on an event"."""

import json

import pytest
from django.urls import reverse

from deliveries.models import Event, Target
from tests.support.admin import target_form_data, world
from tests.support.api import client_of
from tests.support.engines import store

pytestmark = pytest.mark.django_db


@pytest.fixture
def mine(alice):
    _, target, event, _ = world(alice, "alice-hook")
    return target, event


def preview(alice, target, **data):
    return client_of(alice).post(f"/api/v1/targets/{target.pk}/preview/", data, format="json")


def test_preview_of_the_saved_program(alice, mine):
    target, event = mine
    Target.objects.filter(pk=target.pk).update(transform='{body: {who: .body.who}, query: "a=1"}')
    target.refresh_from_db()

    answer = preview(alice, target, event=event.pk).json()

    assert answer["dropped"] is False
    assert json.loads(answer["body"]) == {"who": "alice-hook"}
    assert ["Content-Type", "application/json"] in answer["headers"]
    assert any(name == "webhook-signature" for name, _ in answer["headers"])
    assert answer["query"] == "a=1"
    assert answer["input"]["body"] == {"who": "alice-hook"}
    assert answer["input"]["event"]["code"] == str(event.code)
    assert answer["output"] == {"body": {"who": "alice-hook"}, "query": "a=1"}


def test_preview_of_an_unsaved_program_changes_nothing(alice, mine):
    target, event = mine
    answer = preview(alice, target, event=event.pk, transform="null").json()
    assert answer["dropped"] is True
    assert answer["reason"] == "dropped by transform"
    target.refresh_from_db()
    assert target.transform == ""


def test_preview_without_a_transform_shows_the_event_as_sent_and_its_input(alice, mine):
    target, event = mine
    answer = preview(alice, target, event=event.pk).json()
    assert answer["dropped"] is False
    assert json.loads(answer["body"]) == {"who": "alice-hook"}
    assert answer["output"] is None
    assert answer["input"]["headers"]["content-type"] == "application/json"


def test_preview_errors_are_400_in_words(alice, bob, mine):
    target, event = mine
    syntax = preview(alice, target, event=event.pk, transform=".body |")
    assert syntax.status_code == 400
    assert "syntax error" in syntax.json()["fields"]["transform"][0]

    failing = preview(alice, target, event=event.pk, transform='error("nope")')
    assert failing.status_code == 400
    assert failing.json()["error"] == "The transform failed: nope"

    _, _, their_event, _ = world(bob, "bob-hook")
    other = preview(alice, target, event=their_event.pk)
    assert other.status_code == 400
    assert "event" in other.json()["fields"]


def test_a_syntax_error_is_a_field_error_when_saved(alice, mine):
    target, _ = mine
    response = client_of(alice).patch(
        f"/api/v1/targets/{target.pk}/", {"transform": "{body: .x"}, format="json"
    )
    assert response.status_code == 400
    assert "syntax error" in response.json()["fields"]["transform"][0]

    saved = client_of(alice).patch(
        f"/api/v1/targets/{target.pk}/", {"transform": "{body: .body}"}, format="json"
    )
    assert saved.status_code == 200
    assert saved.json()["transform"] == "{body: .body}"


def test_the_console_runs_the_program_as_typed_on_a_chosen_event(client, alice, mine):
    target, event = mine
    [newer] = store(target.webhook.entrypoints.get(), body=b'{"who": "newer"}')
    client.force_login(alice)
    page = client.get(reverse("admin:deliveries_target_change", args=[target.pk]))
    assert page.status_code == 200
    assert b"Run on this event" in page.content
    picker = page.content.index(b"wh-preview-event")
    assert page.content.index(str(newer.pk).encode(), picker) < page.content.index(
        str(event.pk).encode(), picker
    )  # newest first

    url = reverse("admin:deliveries_target_preview", args=[target.pk])
    by_code = client.post(url, {"event": str(event.code), "transform": "{body: .body.who}"})
    assert by_code.status_code == 200
    assert by_code.json()["body"] == "alice-hook"

    broken = client.post(url, {"event": newer.pk, "transform": "{"})
    assert broken.status_code == 400
    assert "syntax error" in broken.json()["error"]
    assert Event.objects.count() == 2


def test_the_console_saves_a_transform_and_refuses_a_broken_one(client, alice, mine):
    target, _ = mine
    client.force_login(alice)
    url = reverse("admin:deliveries_target_change", args=[target.pk])
    data = target_form_data(target.config["url"])
    response = client.post(url, {**data, "transform": "{body: ."})
    assert response.status_code == 200
    assert b"syntax error" in response.content
    response = client.post(url, {**data, "transform": "{body: .body}"})
    assert response.status_code == 302
    target.refresh_from_db()
    assert target.transform == "{body: .body}"


def test_preview_with_unsaved_filters(alice, mine):
    target, event = mine
    keep_none = [{"source": "json", "name": "who", "op": "equals", "value": "nobody"}]
    answer = preview(alice, target, event=event.pk, filters=keep_none).json()
    assert answer["dropped"] is True
    assert answer["reason"] == "the target's filters did not match"
    assert answer["input"]["body"] == {"who": "alice-hook"}  # still shown, to write a rule

    broken = preview(alice, target, event=event.pk, filters=[{"source": "nope"}])
    assert broken.status_code == 400
    assert "source must be one of" in broken.json()["fields"]["filters"][0]
    target.refresh_from_db()
    assert target.filters == []

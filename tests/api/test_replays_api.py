"""Replay jobs through the API (issue 28): POST /api/v1/replays/ (a dry run counts),
GET one for its progress, pause, resume and cancel."""

import datetime

import pytest
from django.utils import timezone

from deliveries import replays
from deliveries.models import Delivery, ReplayJob, Target
from tests.support.admin import world
from tests.support.api import client_of

pytestmark = pytest.mark.django_db

SINCE = "2000-01-01T00:00:00Z"


def test_a_dry_run_counts_and_starts_nothing(alice):
    hook, _target, _, _ = world(alice, "alices")
    client = client_of(alice)
    asked = {"webhook": hook.pk, "since": SINCE, "statuses": ["failed"], "dry_run": True}
    response = client.post("/api/v1/replays/", asked, format="json")
    assert (response.status_code, response.json()) == (200, {"matched": 1})
    asked["statuses"] = ["delivered"]
    assert client.post("/api/v1/replays/", asked, format="json").json() == {"matched": 0}
    assert not ReplayJob.objects.exists()


def test_a_job_is_started_followed_and_controlled(alice):
    hook, target, _event, delivery = world(alice, "alices")
    client = client_of(alice)
    response = client.post(
        "/api/v1/replays/",
        {"webhook": hook.pk, "since": SINCE, "target": target.pk, "statuses": ["failed"]},
        format="json",
    )
    assert response.status_code == 201, response.content
    job = response.json()
    assert {k: job[k] for k in ("state", "matched", "queued", "delivered", "failed")} == {
        "state": "planning",
        "matched": 0,
        "queued": 0,
        "delivered": 0,
        "failed": 0,
    }
    url = f"/api/v1/replays/{job['id']}/"
    replays.step({0}, 1)
    shown = client.get(url).json()
    assert (shown["state"], shown["matched"], shown["queued"]) == ("running", 1, 1)
    assert Delivery.objects.get(pk=delivery.pk).status == "pending"

    assert client.post(url + "pause/").json()["state"] == "paused"
    assert client.post(url + "pause/").json()["state"] == "paused"  # already: no change
    assert client.post(url + "resume/").json()["state"] == "running"
    assert client.post(url + "cancel/").json()["state"] == "cancelled"
    response = client.post(url + "resume/")
    assert response.status_code == 409
    assert "cancelled" in response.json()["error"]
    listed = client.get(f"/api/v1/replays/?webhook={hook.pk}").json()["results"]
    assert [row["id"] for row in listed] == [job["id"]]


def test_a_job_ends_done_with_its_counts(alice):
    hook, _target, _, delivery = world(alice, "alices")
    client = client_of(alice)
    job = client.post(
        "/api/v1/replays/", {"webhook": hook.pk, "since": SINCE}, format="json"
    ).json()
    replays.step({0}, 1)
    Delivery.objects.filter(pk=delivery.pk).update(status="delivered")
    replays.step({0}, 1)
    shown = client.get(f"/api/v1/replays/{job['id']}/").json()
    assert (shown["state"], shown["matched"], shown["delivered"]) == ("done", 1, 1)
    assert shown["finished_at"] is not None
    assert client.post(f"/api/v1/replays/{job['id']}/pause/").status_code == 409


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"statuses": ["pending"]}, "statuses"),
        ({"statuses": ["lost"]}, "statuses"),
        ({"until": SINCE}, "until"),
        ({"webhok": 1}, "webhok"),
    ],
)
def test_what_cannot_be_replayed_is_a_400_naming_the_field(alice, fields, field):
    hook, _, _, _ = world(alice, "alices")
    response = client_of(alice).post(
        "/api/v1/replays/", {"webhook": hook.pk, "since": SINCE, **fields}, format="json"
    )
    assert response.status_code == 400
    assert field in response.json()["fields"], response.json()
    assert not ReplayJob.objects.exists()


def test_a_target_of_another_webhook_is_refused(alice):
    hook, _, _, _ = world(alice, "alices")
    _, other, _, _ = world(alice, "others")
    for field in ("target", "to_target"):
        response = client_of(alice).post(
            "/api/v1/replays/",
            {"webhook": hook.pk, "since": SINCE, field: other.pk},
            format="json",
        )
        assert response.status_code == 400
        assert "is not a target of webhook" in response.json()["fields"][field][0]


def test_to_a_new_target_with_until_and_pending_sources(alice):
    hook, target, _event, _ = world(alice, "alices")
    new = Target.objects.create(
        webhook=hook, name="new", type="http", config={"url": "https://example.com/new"}
    )
    Delivery.objects.filter(target=target).update(status="retrying")
    until = (timezone.now() + datetime.timedelta(minutes=1)).isoformat()
    body = {"webhook": hook.pk, "since": SINCE, "until": until, "to_target": new.pk}
    response = client_of(alice).post(
        "/api/v1/replays/", {**body, "statuses": ["retrying"], "dry_run": True}, format="json"
    )
    assert response.json() == {"matched": 1}

"""Idempotency-Key on every POST (issue 28): a retried POST whose answer was lost gets
the first answer again, with no second effect."""

import datetime

import pytest
from django.utils import timezone

from deliveries.models import IdempotentRequest, Webhook
from deliveries.retention import prune_events
from tests.support.api import client_of, world_ids

pytestmark = pytest.mark.django_db


def post(client, path, body, key):
    return client.post(f"/api/v1/{path}", body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_the_same_key_and_body_answer_the_same_with_one_effect(alice):
    client = client_of(alice)
    first = post(client, "webhooks/", {"name": "once"}, "key-1")
    again = post(client, "webhooks/", {"name": "once"}, "key-1")
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    assert Webhook.objects.filter(name="once").count() == 1


def test_the_same_key_with_another_body_is_refused(alice):
    client = client_of(alice)
    post(client, "webhooks/", {"name": "one"}, "key-2")
    other = post(client, "webhooks/", {"name": "two"}, "key-2")
    assert other.status_code == 422
    assert "another request" in other.json()["error"]
    assert not Webhook.objects.filter(name="two").exists()


def test_an_action_is_not_done_twice_and_an_error_is_answered_again(alice):
    ids = world_ids(alice, "h")
    client = client_of(alice)
    body = {"target": ids["target"], "status": "failed"}
    first = post(client, "deliveries/redeliver/", body, "retry-7")
    assert first.json()["queued"] == 1
    assert post(client, "deliveries/redeliver/", body, "retry-7").json() == first.json()
    bad = post(client, "deliveries/redeliver/", {"webhok": 1}, "typo-1")
    assert bad.status_code == 400
    assert post(client, "deliveries/redeliver/", {"webhok": 1}, "typo-1").json() == bad.json()


def test_keys_are_each_users_and_kept_for_a_day(alice, bob):
    post(client_of(alice), "webhooks/", {"name": "alices"}, "shared")
    assert post(client_of(bob), "webhooks/", {"name": "bobs"}, "shared").status_code == 201

    IdempotentRequest.objects.update(created_at=timezone.now() - datetime.timedelta(hours=25))
    again = post(client_of(alice), "webhooks/", {"name": "alices"}, "shared")
    assert again.status_code == 201 and "Idempotent-Replayed" not in again
    assert Webhook.objects.filter(name="alices").count() == 2
    IdempotentRequest.objects.update(created_at=timezone.now() - datetime.timedelta(hours=25))
    assert prune_events()["idempotency keys"] == 2
    assert not IdempotentRequest.objects.exists()


def test_a_key_still_being_answered_or_malformed(alice):
    client = client_of(alice)
    post(client, "webhooks/", {"name": "busy"}, "busy")
    IdempotentRequest.objects.update(status_code=None)  # as while the first is answered
    assert post(client, "webhooks/", {"name": "busy"}, "busy").status_code == 409
    assert Webhook.objects.filter(name="busy").count() == 1
    # A first request that never finished (its worker killed) lets the key go.
    IdempotentRequest.objects.update(created_at=timezone.now() - datetime.timedelta(minutes=3))
    assert post(client, "webhooks/", {"name": "busy"}, "busy").status_code == 201
    bad = post(client, "webhooks/", {"name": "n"}, "é" * 3)
    assert bad.status_code == 400
    assert "Idempotency-Key" in bad.json()["fields"]
    assert not Webhook.objects.filter(name="n").exists()

"""Provider event ids and deduplication on the inbound endpoint."""

import datetime
import hashlib
import hmac
import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from django.core.exceptions import ValidationError
from django.utils import timezone

from deliveries import metrics
from deliveries.models import Delivery, Entrypoint, Event, Target, Webhook
from deliveries.retention import prune_events
from tests.support.metrics import value
from tests.support.processes import start_web

SECRET = "gh-secret"


def github_headers(body, delivery_id):
    signature = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return {
        "X-GitHub-Event": "push",
        "X-GitHub-Delivery": delivery_id,
        "X-Hub-Signature-256": f"sha256={signature}",
    }


def github_entrypoint(entrypoint, *, dedup=True):
    entrypoint.verification = "github"
    entrypoint.verification_config = {"secret": SECRET}
    entrypoint.dedup = dedup
    entrypoint.full_clean()
    entrypoint.save()
    return entrypoint


def post(client, entrypoint, body=b'{"zen": "Keep it logically awesome."}', headers=None):
    return client.generic(
        "POST",
        f"/webhook/{entrypoint.code}",
        body,
        content_type="application/json",
        headers=headers or {},
    )


@pytest.mark.django_db
def test_a_repeat_answers_200_with_the_first_events_code_and_creates_nothing(
    client, entrypoint, make_target
):
    make_target(url="http://example.com/a")
    github_entrypoint(entrypoint)
    body = b'{"action": "opened"}'
    headers = github_headers(body, "72d3162e-cc78-11e3-81ab-4c9367dc0958")

    first = post(client, entrypoint, body, headers)
    second = post(client, entrypoint, body, headers)
    third = post(client, entrypoint, body, headers)

    assert first.status_code == 200
    event = Event.objects.get()
    assert first.json() == {"event": str(event.code), "deliveries": 1}
    for repeat in (second, third):
        assert repeat.status_code == 200
        assert repeat.json() == {"event": str(event.code), "duplicate": True}
    assert Delivery.objects.count() == 1
    event.refresh_from_db()
    assert event.provider_id == "72d3162e-cc78-11e3-81ab-4c9367dc0958"
    assert event.duplicates == 2  # received 3 times
    text = metrics.render().decode()
    code = str(entrypoint.webhook.code)
    assert value(text, "webhooker_events_duplicate_total", webhook=code) == 2
    assert value(text, "webhooker_events_received_total", webhook=code) == 1


@pytest.mark.django_db
def test_the_id_is_stored_without_dedup_and_repeats_are_kept(client, entrypoint):
    github_entrypoint(entrypoint, dedup=False)
    body = b"{}"
    for _ in range(2):
        assert post(client, entrypoint, body, github_headers(body, "d-1")).status_code == 200
    assert list(Event.objects.values_list("provider_id", "deduplicated")) == [
        ("d-1", False),
        ("d-1", False),
    ]


@pytest.mark.django_db
def test_different_ids_are_different_events(client, entrypoint):
    github_entrypoint(entrypoint)
    body = b"{}"
    post(client, entrypoint, body, github_headers(body, "d-1"))
    post(client, entrypoint, body, github_headers(body, "d-2"))
    assert sorted(Event.objects.values_list("provider_id", flat=True)) == ["d-1", "d-2"]


@pytest.mark.django_db
def test_a_request_without_an_id_is_stored_and_not_deduplicated(client, entrypoint):
    github_entrypoint(entrypoint)
    body = b"{}"
    headers = github_headers(body, "")
    for _ in range(2):
        assert post(client, entrypoint, body, headers).json().get("duplicate") is None
    assert Event.objects.filter(provider_id="", deduplicated=False).count() == 2


@pytest.mark.django_db
def test_stripe_default_is_the_body_id(client, entrypoint):
    entrypoint.verification = "stripe"
    entrypoint.verification_config = {"secret": "whsec_x"}
    entrypoint.dedup = True
    entrypoint.full_clean()
    entrypoint.save()
    body = json.dumps({"id": "evt_1NG8Du2eZvKYlo2CUI79vXWy", "type": "invoice.paid"}).encode()

    def headers():
        ts = int(time.time())
        mac = hmac.new(b"whsec_x", f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
        return {"Stripe-Signature": f"t={ts},v1={mac}"}

    first = post(client, entrypoint, body, headers()).json()
    again = post(client, entrypoint, body, headers()).json()
    assert again == {"event": first["event"], "duplicate": True}
    assert Event.objects.get().provider_id == "evt_1NG8Du2eZvKYlo2CUI79vXWy"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("source", "body", "headers", "expected"),
    [
        ("header:X-Request-Id", b"{}", {"X-Request-Id": "req-7"}, "req-7"),
        ("json:data.object.id", b'{"data": {"object": {"id": "ch_1"}}}', {}, "ch_1"),
        ("json:seq", b'{"seq": 17}', {}, "17"),
        # A list's element by its index, as SendGrid posts a list of events.
        ("json:0.sg_event_id", b'[{"sg_event_id": "sg-1"}, {"sg_event_id": "sg-2"}]', {}, "sg-1"),
        ("json:2.sg_event_id", b'[{"sg_event_id": "sg-1"}]', {}, ""),
        ("json:\u00b2", b"[1, 2, 3]", {}, ""),  # a digit int() does not read
        ("json:data.id", b'{"data": ["not", "an", "object"]}', {}, ""),
        ("json:id", b"not json at all", {}, ""),
        ("json:id", b'{"id": {"nested": 1}}', {}, ""),
        ("json:id", b'{"id": true}', {}, ""),
        ("json:id", json.dumps({"id": "x" * 256}).encode(), {}, ""),
    ],
)
def test_an_own_source_header_or_json_path(client, entrypoint, source, body, headers, expected):
    entrypoint.dedup, entrypoint.dedup_source = True, source
    entrypoint.full_clean()
    entrypoint.save()
    assert post(client, entrypoint, body, headers).status_code == 200
    assert Event.objects.get().provider_id == expected


@pytest.mark.django_db
def test_same_webhook_across_entrypoints_other_webhooks_apart(client, entrypoint, user):
    def by_header(ep):
        ep.dedup, ep.dedup_source = True, "header:X-Id"
        ep.save()
        return ep

    by_header(entrypoint)
    second = by_header(Entrypoint.objects.create(webhook=entrypoint.webhook))
    elsewhere = Webhook.objects.create(name="elsewhere", owner=user)
    elsewhere.ensure_entrypoint()
    third = by_header(elsewhere.entrypoints.get())

    first = post(client, entrypoint, headers={"X-Id": "same"}).json()
    assert post(client, second, headers={"X-Id": "same"}).json() == {
        "event": first["event"],
        "duplicate": True,
    }
    assert "duplicate" not in post(client, third, headers={"X-Id": "same"}).json()
    assert Event.objects.count() == 2


@pytest.mark.django_db
def test_an_event_stored_without_dedup_does_not_block_one_with(client, entrypoint):
    entrypoint.dedup_source = "header:X-Id"
    entrypoint.save()
    post(client, entrypoint, headers={"X-Id": "a"})
    Entrypoint.objects.filter(pk=entrypoint.pk).update(dedup=True)
    assert "duplicate" not in post(client, entrypoint, headers={"X-Id": "a"}).json()
    assert post(client, entrypoint, headers={"X-Id": "a"}).json()["duplicate"] is True
    assert Event.objects.count() == 2


@pytest.mark.django_db
def test_once_the_first_is_pruned_the_id_is_free_again(client, entrypoint):
    entrypoint.dedup, entrypoint.dedup_source = True, "header:X-Id"
    entrypoint.save()
    first = post(client, entrypoint, headers={"X-Id": "a"}).json()["event"]
    Event.objects.update(received_at=timezone.now() - datetime.timedelta(days=31))
    assert prune_events()["events"] == 1
    again = post(client, entrypoint, headers={"X-Id": "a"}).json()
    assert "duplicate" not in again and again["event"] != first
    assert Event.objects.get().provider_id == "a"


@pytest.mark.django_db
def test_dedup_without_a_source_is_a_field_error(entrypoint):
    entrypoint.dedup = True
    with pytest.raises(ValidationError) as caught:
        entrypoint.full_clean()
    assert "dedup_source" in caught.value.message_dict


@pytest.mark.django_db
@pytest.mark.parametrize("source", ["X-Request-Id", "query:id", "json:", "json:a..b", "header:"])
def test_a_malformed_source_is_a_field_error(entrypoint, source):
    entrypoint.dedup_source = source
    with pytest.raises(ValidationError) as caught:
        entrypoint.full_clean()
    assert "dedup_source" in caught.value.message_dict


@pytest.mark.django_db(transaction=True)
@pytest.mark.e2e
def test_twenty_concurrent_posts_of_one_github_delivery_make_one_event(
    entrypoint, make_target, data_dir
):
    make_target(Target.Type.LOG, name="log")
    github_entrypoint(entrypoint)
    body = json.dumps({"action": "completed", "check_run": {"id": 4}}).encode()
    headers = {**github_headers(body, str(uuid.uuid4())), "Content-Type": "application/json"}
    web, base = start_web(data_dir, workers=4, WEB_THREADS=5)
    url = f"{base}/webhook/{entrypoint.code}"
    try:
        # Every sender connects first, then all post at once.
        with ThreadPoolExecutor(20) as pool:
            sessions = list(pool.map(lambda _: requests.Session(), range(20)))
            responses = list(
                pool.map(lambda s: s.post(url, data=body, headers=headers, timeout=60), sessions)
            )
    finally:
        web.stop()

    assert [r.status_code for r in responses] == [200] * 20
    event = Event.objects.get()
    assert {r.json()["event"] for r in responses} == {str(event.code)}
    assert sum(1 for r in responses if r.json().get("duplicate")) == 19
    assert event.duplicates == 19
    assert Delivery.objects.count() == 1
    assert "Traceback" not in web.log()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("headers", "body", "expected"),
    [
        (
            {"X-GitHub-Delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958"},
            b"{}",
            "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        ),
        ({"X-Gitlab-Event-UUID": "gl-1"}, b"{}", "gl-1"),
        ({"X-Shopify-Webhook-Id": "sh-1"}, b"{}", "sh-1"),
        ({"webhook-id": "msg_1"}, b"{}", "msg_1"),
        ({"svix-id": "msg_2"}, b"{}", "msg_2"),
        ({}, b'{"id": "evt_1", "type": "invoice.paid"}', "evt_1"),
        ({}, b'{"event_id": "Ev01", "type": "event_callback"}', "Ev01"),
        ({}, b'{"id": 7}', ""),
    ],
)
def test_the_senders_event_id_is_kept_whatever_the_entrypoint(
    client, entrypoint, headers, body, expected
):
    """No preset, no dedup source: the id is still found (search by it), and two
    posts with one id are two events (deduplication reads only the entrypoint's
    own source)."""
    assert post(client, entrypoint, body, headers).status_code == 200
    assert post(client, entrypoint, body, headers).status_code == 200
    assert list(Event.objects.values_list("provider_id", flat=True)) == [expected] * 2

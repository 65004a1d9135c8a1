"""The REST API: every operation for its owner, for another user, without a key,
with a revoked or expired key and over the throttle; then each resource and action."""

import datetime

import pytest
from auditlog.models import LogEntry
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from deliveries import wake
from deliveries.forms import TargetForm
from deliveries.models import ApiKey, Delivery, DeliveryResult, Entrypoint, Event, Target
from tests.support.api import (
    CALLS,
    client_of,
    client_with,
    fresh_throttle,  # noqa: F401
    key_for,
    listed_rows,
    snapshot,
    world_ids,
)
from tests.support.engines import store

pytestmark = pytest.mark.django_db

by_name = pytest.mark.parametrize("call", CALLS, ids=lambda call: call.name)


@pytest.fixture
def mine(alice):
    return world_ids(alice, "alice-hook")


@pytest.fixture
def theirs(bob):
    return world_ids(bob, "bob-hook")


def audited_for(response) -> set:
    """Whose objects the audit entries listed are about."""
    assert response.status_code == 200, response.content
    ids = [row["id"] for row in listed_rows(response)]
    return {entry.additional_data["owner"] for entry in LogEntry.objects.filter(pk__in=ids)}


def assert_error(response, status):
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error", "fields"} and body["error"]
    return body


# --- every operation ---------------------------------------------------------------


@by_name
def test_the_owner_can(call, alice, mine, theirs):
    response = call.send(client_of(alice), mine)
    assert response.status_code == call.status, response.content
    if call.name == "audit_list":
        assert audited_for(response) == {alice.pk}  # none of bob's
    elif call.method == "get" and "{" not in call.path:
        listed = {row["id"] for row in listed_rows(response)}
        assert listed and listed <= set(mine.values())  # none of bob's


@by_name
def test_another_user_sees_nothing_and_changes_nothing(call, alice, bob, mine):
    before = snapshot(alice)
    response = call.send(client_of(bob), mine)
    if call.addresses_one:
        assert_error(response, 404)
    elif call.name in ("entrypoints_create", "targets_create", "replays_create"):
        body = assert_error(response, 400)
        assert "does not exist" in body["fields"]["webhook"][0]
    elif call.name == "audit_list":
        assert audited_for(response) == {bob.pk}  # his own key's creation, none of alice's
    elif call.method == "get":
        assert response.status_code == 200
        assert listed_rows(response) == []
    else:  # a webhook of bob's own
        assert response.status_code == 201
        assert response.json()["owner"] == "bob"
    assert snapshot(alice) == before


@by_name
def test_without_a_key_401(call, mine):
    response = call.send(client_with(None), mine)
    assert_error(response, 401)
    assert response["WWW-Authenticate"].startswith("Bearer")


@by_name
@pytest.mark.parametrize("state", ["revoked", "expired"])
def test_with_a_revoked_or_expired_key_401(call, state, alice, mine):
    past = timezone.now() - datetime.timedelta(seconds=1)
    fields = {"revoked_at": past} if state == "revoked" else {"expires_at": past}
    before = snapshot(alice)
    response = call.send(client_with(key_for(alice, **fields)), mine)
    assert_error(response, 401)
    assert snapshot(alice) == before


@by_name
def test_over_the_throttle_429(call, settings, alice, mine):
    settings.API_THROTTLE_RATE = "2/min"
    client = client_of(alice)
    for _ in range(2):
        assert client.get("/api/v1/webhooks/").status_code == 200
    response = call.send(client, mine)
    assert_error(response, 429)
    assert int(response["Retry-After"]) > 0
    # Per key: the user's other key is still served.
    assert call.send(client_of(alice), mine).status_code == call.status


# --- keys ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    ["Bearer", "Bearer a b", "Bearer whk_wrong", "Bearer not-a-key", "Bearer \u00e9t\u00e9"],
)
def test_malformed_or_unknown_keys_401(header, alice):
    key_for(alice)
    response = client_with(None).get("/api/v1/webhooks/", HTTP_AUTHORIZATION=header)
    assert_error(response, 401)


def test_an_inactive_users_key_401(alice):
    client = client_of(alice)
    alice.is_active = False
    alice.save()
    assert_error(client.get("/api/v1/webhooks/"), 401)


def test_a_key_is_stored_as_its_digest_only(alice):
    key = key_for(alice)
    stored = ApiKey.objects.get()
    assert stored.digest == ApiKey.digest_of(key) != key
    assert key.startswith(stored.prefix) and len(stored.prefix) < 12
    assert not ApiKey.objects.filter(digest__contains=key[4:]).exists()


def test_last_use_is_written_at_most_once_a_minute(alice):
    client = client_of(alice)

    def writes():
        with CaptureQueriesContext(connection) as queries:
            assert client.get("/api/v1/webhooks/").status_code == 200
        return [q["sql"] for q in queries if q["sql"].startswith("UPDATE")]

    assert len(writes()) == 1
    first = ApiKey.objects.get().last_used_at
    assert first is not None
    assert writes() == []
    ApiKey.objects.update(last_used_at=first - datetime.timedelta(minutes=2))
    assert len(writes()) == 1
    assert ApiKey.objects.get().last_used_at > first


# --- errors and routing -------------------------------------------------------------


def test_unknown_paths_and_methods_answer_in_the_error_shape(alice, mine):
    client = client_of(alice)
    assert_error(client.get("/api/v1/nothing-here/"), 404)
    assert_error(client.get("/api/v1/events/not-a-number/"), 404)
    assert_error(client.get("/api/v1/events/99999999999999999999/"), 404)
    body = assert_error(client.delete(f"/api/v1/events/{mine['event']}/"), 405)
    assert "DELETE" in body["error"]


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("events/?webhook=abc", "webhook"),
        ("events/?entrypoint=-1", "entrypoint"),
        ("events/?since=yesterday", "since"),
        ("events/?until=2026-13-01", "until"),
        ("events/?code=not-a-uuid", "code"),
        ("events/?provider_id=" + "x" * 300, "provider_id"),
        ("deliveries/?status=lost", "status"),
        ("deliveries/?target=1e3", "target"),
        ("deliveries/?webhook=99999999999999999999", "webhook"),
        ("deliveries/?event_code=1", "event_code"),
        ("targets/?webhook=x", "webhook"),
        ("entrypoints/?webhook=0", "webhook"),
    ],
)
def test_bad_filters_answer_400_with_the_field(path, field, alice, mine):
    body = assert_error(client_of(alice).get("/api/v1/" + path), 400)
    assert list(body["fields"]) == [field]


# --- webhooks, entrypoints, targets ------------------------------------------------------


def test_a_new_webhook_is_owned_by_the_key_and_can_receive_at_once(alice):
    response = client_of(alice).post("/api/v1/webhooks/", {"name": "shop"}, format="json")
    assert response.status_code == 201
    body = response.json()
    assert body["owner"] == "alice"
    [entrypoint] = body["entrypoints"]
    assert entrypoint["url"] == f"http://testserver/webhook/{entrypoint['code']}"
    received = client_with(None).post(entrypoint["url"], {"a": 1}, format="json")
    assert received.status_code == 200


def test_inbound_urls_use_the_public_url_when_set(settings, alice, mine):
    settings.WEBHOOKER_PUBLIC_URL = "https://hooks.example.com"
    body = client_of(alice).get(f"/api/v1/entrypoints/{mine['entrypoint']}/").json()
    assert body["url"] == f"https://hooks.example.com/webhook/{body['code']}"


def test_webhook_fields_are_validated_as_in_the_admin(alice, mine):
    client = client_of(alice)
    response = client.patch(
        f"/api/v1/webhooks/{mine['webhook']}/",
        {"retention_days": 0, "alert_url": "http://10.1.2.3/alerts"},
        format="json",
    )
    body = assert_error(response, 400)
    assert set(body["fields"]) == {"retention_days"}
    response = client.patch(
        f"/api/v1/webhooks/{mine['webhook']}/", {"alert_url": "http://10.1.2.3/a"}, format="json"
    )
    assert "private address" in assert_error(response, 400)["fields"]["alert_url"][0]


def test_target_config_errors_are_the_admin_forms_errors(alice, mine):
    url = "http://10.0.0.1/hook"
    form = TargetForm(
        data={"name": "t", "type": "http", "url": url, "max_retries": 0, "max_queue_size": 10}
    )
    assert not form.is_valid()
    response = client_of(alice).post(
        "/api/v1/targets/",
        {"webhook": mine["webhook"], "name": "t", "type": "http", "config": {"url": url}},
        format="json",
    )
    body = assert_error(response, 400)
    assert body["fields"] == {"config": form.errors["url"]}
    assert not Target.objects.filter(name="t").exists()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"config": {}}, "config"),
        ({"config": {"url": "ftp://example.com/"}}, "config"),
        ({"config": {"url": "https://example.com/", "timeout": 0}}, "config"),
        ({"type": "carrier-pigeon"}, "type"),
        ({"type": "slack", "config": {"webhook_url": "http://169.254.169.254/"}}, "config"),
        ({"filters": [{"source": "header", "name": "X", "op": "sounds_like"}]}, "filters"),
        ({"rate_limit": -1}, "rate_limit"),
        ({"max_queue_size": 0}, "max_queue_size"),
        ({"retry_schedule": [5, -1]}, "retry_schedule"),
        ({"transform": "{body: ."}, "transform"),
    ],
)
def test_invalid_targets_answer_400_per_field(change, field, alice, mine):
    before = snapshot(alice)
    response = client_of(alice).patch(f"/api/v1/targets/{mine['target']}/", change, format="json")
    assert list(assert_error(response, 400)["fields"]) == [field]
    assert snapshot(alice) == before


def test_a_target_takes_a_retry_schedule(alice, mine):
    url = f"/api/v1/targets/{mine['target']}/"
    response = client_of(alice).patch(url, {"retry_schedule": [5, 60, 600]}, format="json")
    assert response.status_code == 200
    assert response.json()["retry_schedule"] == [5, 60, 600]
    assert Target.objects.get(pk=mine["target"]).retry_schedule == [5, 60, 600]


def test_a_target_config_is_stored_normalised(alice, mine):
    response = client_of(alice).patch(
        f"/api/v1/targets/{mine['target']}/",
        {"config": {"url": "  https://example.com/new  ", "timeout": 5}},
        format="json",
    )
    assert response.status_code == 200
    assert Target.objects.get(pk=mine["target"]).config == {
        "url": "https://example.com/new",
        "timeout": 5,
    }


def test_a_target_or_entrypoint_stays_with_its_webhook(alice, mine):
    other = client_of(alice).post("/api/v1/webhooks/", {"name": "other"}, format="json").json()
    client = client_of(alice)
    for kind in ("targets", "entrypoints"):
        response = client.patch(
            f"/api/v1/{kind}/{mine[kind[:-1]]}/", {"webhook": other["id"]}, format="json"
        )
        assert response.status_code == 200
        assert response.json()["webhook"] == mine["webhook"]


def test_pause_and_resume(alice, mine):
    client = client_of(alice)
    url = f"/api/v1/targets/{mine['target']}"
    paused = client.post(f"{url}/pause/", {"reason": "receiver upgrade"}, format="json").json()
    assert paused["paused"] is True and paused["paused_reason"] == "receiver upgrade"
    assert Target.objects.get(pk=mine["target"]).paused
    # Not through a plain update: pausing goes through the operation the engine hears.
    client.patch(f"{url}/", {"paused": False}, format="json")
    assert Target.objects.get(pk=mine["target"]).paused
    resumed = client.post(f"{url}/resume/").json()
    assert resumed["paused"] is False and resumed["paused_at"] is None


# --- events ---------------------------------------------------------------------------


def test_events_filter_by_webhook_entrypoint_time_and_code(alice, mine):
    client = client_of(alice)
    second = client.post("/api/v1/entrypoints/", {"webhook": mine["webhook"]}, format="json").json()
    [old, new] = store(Event.objects.get(pk=mine["event"]).entrypoint, n=2)
    Event.objects.filter(pk=old.pk).update(received_at=timezone.now() - datetime.timedelta(days=3))
    client_with(None).post(second["url"], {"via": "second"}, format="json")
    via_second = Event.objects.get(entrypoint_id=second["id"])

    def listed(query):
        response = client.get(f"/api/v1/events/?{query}")
        assert response.status_code == 200, response.content
        return [row["id"] for row in response.json()["results"]]

    since = (timezone.now() - datetime.timedelta(days=1)).isoformat()
    everything = [via_second.pk, new.pk, old.pk, mine["event"]]
    assert sorted(listed(f"webhook={mine['webhook']}")) == sorted(everything)
    assert listed(f"entrypoint={second['id']}") == [via_second.pk]
    assert listed("since=" + since.replace("+", "%2B")) == [via_second.pk, new.pk, mine["event"]]
    assert listed("until=" + since.replace("+", "%2B")) == [old.pk]
    assert listed(f"code={new.code}") == [new.pk]
    assert listed(f"webhook={mine['webhook'] + 1000}") == []


def test_event_pages_follow_their_cursor_newest_first(alice, mine):
    entrypoint = Event.objects.get(pk=mine["event"]).entrypoint
    store(entrypoint, n=6)
    client = client_of(alice)
    seen, url = [], "/api/v1/events/?limit=3"
    while url:
        page = client.get(url).json()
        seen += [row["id"] for row in page["results"]]
        url = page["next"]
    assert seen == sorted(Event.objects.values_list("pk", flat=True), reverse=True)


def test_an_event_with_its_headers_and_its_body_as_received(alice, mine):
    entrypoint = Event.objects.get(pk=mine["event"]).entrypoint
    body = b"\x00\xffbinary\r\n<script>"
    [event] = store(
        entrypoint,
        body=body,
        headers=[["Content-Type", "application/x-thing"], ["X-Trace", "1"]],
        content_type="application/x-thing",
    )
    client = client_of(alice)
    Event.objects.filter(pk=event.pk).update(query_string="a=1&b=2")
    detail = client.get(f"/api/v1/events/{event.pk}/").json()
    assert detail["query_string"] == "a=1&b=2"
    assert detail["headers"] == [["Content-Type", "application/x-thing"], ["X-Trace", "1"]]
    assert detail["body_size"] == len(body)
    for accept in ("*/*", "application/octet-stream", "application/json"):
        response = client.get(detail["body_url"], HTTP_ACCEPT=accept)
        assert response.status_code == 200
        assert response.content == body
        assert response["Content-Type"] == "application/x-thing"
        assert response["Content-Disposition"].startswith("attachment")
        assert response["X-Content-Type-Options"] == "nosniff"
        assert "sandbox" in response["Content-Security-Policy"]


def test_replay_by_time_range_onto_a_new_target_only(alice, mine):
    entrypoint = Event.objects.get(pk=mine["event"]).entrypoint
    recent = store(entrypoint, n=3)
    Event.objects.filter(pk=mine["event"]).update(
        received_at=timezone.now() - datetime.timedelta(days=2)
    )
    client = client_of(alice)
    new_target = client.post(
        "/api/v1/targets/",
        {"webhook": mine["webhook"], "name": "late", "type": "log"},
        format="json",
    ).json()
    since = (timezone.now() - datetime.timedelta(hours=1)).isoformat()
    response = client.post(
        "/api/v1/events/replay/",
        {"webhook": mine["webhook"], "since": since, "target": new_target["id"]},
        format="json",
    )
    assert response.json() == {"queued": 3, "redelivered": 0, "created": 3}
    assert set(
        Delivery.objects.filter(target_id=new_target["id"]).values_list("event_id", flat=True)
    ) == {e.pk for e in recent}
    # The first target's deliveries were left alone.
    assert Delivery.objects.get(pk=mine["delivery"]).status == "failed"


def test_replay_by_ids_counts_exactly(alice, mine):
    response = client_of(alice).post(
        "/api/v1/events/replay/", {"ids": [mine["event"]]}, format="json"
    )
    assert response.json() == {"queued": 1, "redelivered": 1, "created": 0}
    assert Delivery.objects.get(pk=mine["delivery"]).status == "pending"


def test_replay_refuses_a_target_of_another_webhook_or_user(alice, bob, mine, theirs):
    client = client_of(alice)
    other = client.post("/api/v1/webhooks/", {"name": "other"}, format="json").json()
    response = client.post(
        "/api/v1/events/replay/",
        {"webhook": other["id"], "target": mine["target"]},
        format="json",
    )
    assert list(assert_error(response, 400)["fields"]) == ["target"]
    response = client.post(
        "/api/v1/events/replay/",
        {"ids": [mine["event"]], "target": theirs["target"]},
        format="json",
    )
    assert "does not exist" in assert_error(response, 400)["fields"]["target"][0]
    assert_error(client.post("/api/v1/events/replay/", {}, format="json"), 400)


# --- deliveries -----------------------------------------------------------------------


def test_a_delivery_with_its_attempts(alice, mine):
    DeliveryResult.objects.create(
        delivery_id=mine["delivery"], attempt=2, success=True, status_code=200, duration_ms=3
    )
    body = client_of(alice).get(f"/api/v1/deliveries/{mine['delivery']}/").json()
    assert body["webhook"] == mine["webhook"] and body["target"] == mine["target"]
    assert [(r["attempt"], r["success"], r["status_code"]) for r in body["results"]] == [
        (1, False, 500),
        (2, True, 200),
    ]


def failed_deliveries(target, n, age):
    """n deliveries to `target` that failed `age` ago."""
    events = store(target.webhook.entrypoints.get(), n=n)
    rows = Delivery.objects.filter(event__in=events, target=target)
    rows.update(status="failed", attempts=1, updated_at=timezone.now() - age)
    return list(rows.values_list("pk", flat=True))


def test_redeliver_failed_for_a_target_since_a_time(alice, mine):
    target = Target.objects.get(pk=mine["target"])
    other = Target.objects.create(webhook=target.webhook, name="other", type="log")
    # Failed before the time: left alone, however recent its event.
    Delivery.objects.filter(pk=mine["delivery"]).update(
        updated_at=timezone.now() - datetime.timedelta(days=5)
    )
    recent = failed_deliveries(target, 3, datetime.timedelta(minutes=5))
    Delivery.objects.filter(pk=recent[0]).update(status="delivered")
    Delivery.objects.filter(target=other).update(status="failed")
    since = (timezone.now() - datetime.timedelta(hours=1)).isoformat()
    client = client_of(alice)
    listed = client.get(
        "/api/v1/deliveries/",
        {"target": target.pk, "status": "failed", "since": since},
    ).json()["results"]
    assert sorted(row["id"] for row in listed) == sorted(recent[1:])

    response = client.post(
        "/api/v1/deliveries/redeliver/",
        {"target": target.pk, "status": "failed", "since": since},
        format="json",
    )
    assert response.json() == {"queued": 2, "matched": 2}
    assert set(Delivery.objects.filter(status="pending").values_list("pk", flat=True)) == set(
        recent[1:]
    )


def test_redeliver_with_one_unknown_id_changes_nothing(alice, mine, theirs):
    before = snapshot(alice)
    response = client_of(alice).post(
        "/api/v1/deliveries/redeliver/",
        {"ids": [mine["delivery"], theirs["delivery"]]},
        format="json",
    )
    assert str(theirs["delivery"]) in assert_error(response, 404)["error"]
    assert snapshot(alice) == before


def test_redeliver_ids_and_a_filter_together(alice, mine):
    client = client_of(alice)
    url = "/api/v1/deliveries/redeliver/"
    body = {"ids": [mine["delivery"]], "status": "delivered"}
    assert client.post(url, body, format="json").json() == {"queued": 0, "matched": 0}
    body["status"] = "failed"
    assert client.post(url, body, format="json").json() == {"queued": 1, "matched": 1}


def test_redeliver_needs_ids_or_a_filter(alice, mine):
    assert_error(client_of(alice).post("/api/v1/deliveries/redeliver/", {}, format="json"), 400)
    response = client_of(alice).post(
        "/api/v1/deliveries/redeliver/", {"ids": ["x"], "since": "soon"}, format="json"
    )
    assert set(assert_error(response, 400)["fields"]) == {"ids", "since"}


def test_retry_now_skips_the_backoff_of_a_retrying_delivery(alice, mine):
    client = client_of(alice)
    url = f"/api/v1/deliveries/{mine['delivery']}/retry/"
    assert client.post(url).json() == {"queued": 0}  # failed: redeliver is the way
    later = timezone.now() + datetime.timedelta(hours=1)
    Delivery.objects.filter(pk=mine["delivery"]).update(status="retrying", next_attempt_at=later)
    assert client.post(url).json() == {"queued": 1}
    delivery = Delivery.objects.get(pk=mine["delivery"])
    assert (delivery.status, delivery.next_attempt_at, delivery.attempts) == ("pending", None, 1)


# --- docs --------------------------------------------------------------------------------


def test_the_docs_page_loads_nothing_from_the_internet(client):
    page = client.get("/api/v1/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/" in html
    assert "https://" not in html and "http://" not in html.replace("http://testserver", "")
    bundle = client.get("/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js")
    assert bundle.status_code == 200


def test_events_by_the_senders_own_id_and_how_often_they_came(alice, mine):
    Event.objects.filter(pk=mine["event"]).update(provider_id="gh-123", duplicates=2)
    response = client_of(alice).get("/api/v1/events/", {"provider_id": "gh-123"})
    [row] = response.json()["results"]
    assert (row["id"], row["provider_id"], row["duplicates"]) == (mine["event"], "gh-123", 2)
    assert client_of(alice).get("/api/v1/events/?provider_id=gh-1").json()["results"] == []


# --- trust: verification and signing ------------------------------------------------------


def test_entrypoint_verification_secrets_are_entered_once_and_masked(alice, mine):
    client = client_of(alice)
    url = f"/api/v1/entrypoints/{mine['entrypoint']}/"
    response = client.patch(
        url, {"verification": "github", "verification_config": {"secret": "s3cret"}}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["verification_config"] == {"secret": "********"}
    assert "s3cret" not in client.get(url).content.decode()
    # Sent back as read (masked), or left out: the secret stays.
    client.patch(url, {"verification_config": {"secret": "********"}}, format="json")
    client.patch(url, {"verification_config": {}, "dedup": True}, format="json")
    entrypoint = Entrypoint.objects.get(pk=mine["entrypoint"])
    assert (entrypoint.verification_config, entrypoint.dedup) == ({"secret": "s3cret"}, True)
    client.patch(url, {"verification_config": {"secret": "new"}}, format="json")
    assert Entrypoint.objects.get(pk=mine["entrypoint"]).verification_config == {"secret": "new"}


def test_entrypoint_verification_is_validated_as_in_the_admin(alice, mine):
    response = client_of(alice).patch(
        f"/api/v1/entrypoints/{mine['entrypoint']}/",
        {"verification": "stripe", "verification_config": {}},
        format="json",
    )
    assert list(assert_error(response, 400)["fields"]) == ["verification_config"]
    response = client_of(alice).patch(
        f"/api/v1/entrypoints/{mine['entrypoint']}/", {"verification": "telepathy"}, format="json"
    )
    assert list(assert_error(response, 400)["fields"]) == ["verification"]


def test_a_target_shows_its_signing_secret_and_rotates_it(alice, mine):
    client = client_of(alice)
    url = f"/api/v1/targets/{mine['target']}"
    before = client.get(f"{url}/").json()
    assert before["signing"] is True and before["signing_secret"].startswith("whsec_")
    after = client.post(f"{url}/rotate-secret/").json()
    assert after["signing_secret"].startswith("whsec_")
    assert after["signing_secret"] != before["signing_secret"]
    target = Target.objects.get(pk=mine["target"])
    assert target.previous_signing_secret == before["signing_secret"]
    assert client.patch(f"{url}/", {"signing": False}, format="json").json()["signing"] is False


def test_a_target_change_wakes_the_engine(alice, mine, monkeypatch):
    woken = []
    monkeypatch.setattr(wake, "notify_on_commit", woken.append)
    client_of(alice).patch(f"/api/v1/targets/{mine['target']}/", {"name": "x"}, format="json")
    assert woken

"""The admin's target controls: the target list and page, pause / resume, redeliver
failed since, retry now, the control fields of the target form, alerts, health."""

import datetime
import json

import pytest
from django.urls import reverse
from django.utils import timezone

from deliveries.models import Alert, Delivery, DeliveryResult, EngineStatus, Target, Webhook
from tests.support.admin import act as act_confirmed
from tests.support.admin import client_for, inline_data, world

pytestmark = pytest.mark.django_db

TARGETS = reverse("admin:deliveries_target_changelist")


def target_page(target):
    return reverse("admin:deliveries_target_change", args=[target.pk])


def open_breaker(target, seconds=30):
    now = timezone.now()
    until = now + datetime.timedelta(seconds=seconds)
    EngineStatus.objects.create(
        heartbeat_at=now,
        started_at=now,
        breakers={
            str(target.pk): {"state": "open", "since": now.isoformat(), "until": until.isoformat()}
        },
    )
    return until


def act(client, action, targets, **data):
    return client.post(
        TARGETS,
        {"action": action, "_selected_action": [t.pk for t in targets], **data},
        follow=True,
    )


def test_the_target_list_shows_state_breaker_success_and_last_error(alice, bob):
    _, target, _, delivery = world(alice, "alices-hook")
    DeliveryResult.objects.filter(delivery=delivery).update(target=target)
    _, theirs, _, _ = world(bob, "bobs-secret-hook")
    Target.objects.filter(pk=target.pk).pause("maintenance window")
    until = open_breaker(target)
    client = client_for(alice)
    body = client.get(TARGETS).content.decode()
    assert "alices-hook-target" in body and "bobs-secret-hook" not in body
    assert "paused: maintenance window" in body
    assert f"open, next probe {timezone.localtime(until):%H:%M:%S}" in body
    assert "0.0 % of 1" in body and "HTTP 500" in body
    assert client.get(target_page(theirs)).status_code == 404
    assert client.post(target_page(theirs), {}).status_code == 404


def test_the_target_page_shows_health_breaker_and_next_probe(alice):
    _, target, _, delivery = world(alice, "h")
    DeliveryResult.objects.filter(delivery=delivery).update(target=target, duration_ms=42)
    until = open_breaker(target)
    body = client_for(alice).get(target_page(target)).content.decode()
    assert "0.0 % of 1 attempts succeeded" in body
    assert "p50 42 ms, p95 42 ms" in body and "1 failures in a row" in body
    assert "last error: HTTP 500" in body
    assert f"breaker open, next probe {timezone.localtime(until):%H:%M:%S}" in body


def test_target_list_queries_do_not_grow_with_targets(alice, django_assert_max_num_queries):
    hook, *_ = world(alice, "h")
    Target.objects.bulk_create(
        Target(webhook=hook, name=f"t{n}", type="log", paused=n % 2) for n in range(60)
    )
    client = client_for(alice)
    with django_assert_max_num_queries(12):
        assert client.get(TARGETS).status_code == 200


def test_pause_asks_for_a_reason_then_pauses(alice, bob):
    _, target, *_ = world(alice, "h")
    _, theirs, *_ = world(bob, "bobs")
    client = client_for(alice)
    page = act(client, "pause", [target])
    assert page.status_code == 200 and 'name="reason"' in page.content.decode()
    assert not Target.objects.get(pk=target.pk).paused  # nothing happens before the answer
    response = act(client, "pause", [target], apply="1", reason="deploying the receiver")
    assert "Paused 1 targets." in response.content.decode()
    target.refresh_from_db()
    assert target.paused and target.paused_reason == "deploying the receiver"
    assert target.paused_at is not None
    # No reason given: who paused it.
    Target.objects.filter(pk=target.pk).resume()
    act(client, "pause", [target], apply="1", reason="")
    assert Target.objects.get(pk=target.pk).paused_reason == "paused by alice"
    # Another user's target cannot be paused through a forged selection.
    act(client, "pause", [theirs], apply="1", reason="x")
    assert not Target.objects.get(pk=theirs.pk).paused


def test_resume(alice):
    _, target, *_ = world(alice, "h")
    Target.objects.filter(pk=target.pk).pause("held")
    response = act(client_for(alice), "resume", [target])
    assert "Resumed 1 targets" in response.content.decode()
    target.refresh_from_db()
    assert (target.paused, target.paused_reason, target.paused_at) == (False, "", None)


def test_redeliver_failed_since_sends_the_exact_set_again(alice, bob):
    _, target, _, old = world(alice, "h")
    Delivery.objects.filter(pk=old.pk).update(
        updated_at=timezone.now() - datetime.timedelta(days=3)
    )
    recent = [world(alice, "h")[3] for _ in range(3)]  # other webhooks, same owner
    Delivery.objects.filter(pk=recent[2].pk).update(status="delivered")
    _, theirs, _, their_delivery = world(bob, "bobs")
    client = client_for(alice)
    targets = [target, *(d.target for d in recent)]

    page = act(client, "redeliver_failed", targets)
    assert 'name="since"' in page.content.decode()
    since = (timezone.now() - datetime.timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    response = act(client, "redeliver_failed", targets, apply="1", since=since)
    assert "Queued 2 failed deliveries since" in response.content.decode()
    assert Delivery.objects.get(pk=old.pk).status == "failed"  # before `since`
    assert [Delivery.objects.get(pk=d.pk).status for d in recent] == [
        "pending",
        "pending",
        "delivered",
    ]
    act(client, "redeliver_failed", [theirs], apply="1", since=since)
    assert Delivery.objects.get(pk=their_delivery.pk).status == "failed"
    # A bad time is asked again, with the error.
    page = act(client, "redeliver_failed", targets, apply="1", since="yesterday-ish")
    assert "Enter a valid date/time." in page.content.decode()


def test_retry_now_hurries_only_retrying_deliveries(alice):
    _, _, _, failed = world(alice, "h")
    _, _, _, retrying = world(alice, "h2")
    later = timezone.now() + datetime.timedelta(hours=1)
    Delivery.objects.filter(pk=retrying.pk).update(status="retrying", next_attempt_at=later)
    response = act_confirmed(
        client_for(alice),
        reverse("admin:deliveries_delivery_changelist"),
        {"action": "retry_now", "_selected_action": [failed.pk, retrying.pk]},
        follow=True,
    )
    assert "1 deliveries will be attempted now. 1 were not waiting for a retry." in (
        response.content.decode()
    )
    retrying.refresh_from_db()
    assert (retrying.status, retrying.next_attempt_at, retrying.attempts) == ("pending", None, 1)
    assert Delivery.objects.get(pk=failed.pk).status == "failed"


def test_filtered_deliveries_have_their_badge_and_filter(alice):
    _, _, _, delivery = world(alice, "h")
    Delivery.objects.filter(pk=delivery.pk).update(status="filtered")
    url = reverse("admin:deliveries_delivery_changelist")
    response = client_for(alice).get(f"{url}?status__exact=filtered")
    assert response.context["cl"].result_count == 1
    assert 'style="background:#0e7490">filtered<' in response.content.decode()


RULE = {"source": "header", "name": "X-GitHub-Event", "op": "equals", "value": "push"}


def test_the_target_form_saves_control_fields(alice):
    client = client_for(alice)
    data = inline_data(ordered="on", rate_limit="5", filters=json.dumps([RULE]), paused="on")
    response = client.post(reverse("admin:deliveries_webhook_add"), data)
    assert response.status_code == 302, response.content.decode()[:3000]
    target = Target.objects.get()
    assert (target.ordered, target.rate_limit, target.filters) == (True, 5.0, [RULE])
    assert target.paused and target.paused_reason == "paused by alice"
    assert target.paused_at is not None
    # Left out, as a client that posts only the old fields does: no limit, no filters.
    response = client.post(reverse("admin:deliveries_webhook_add"), inline_data(name="t2"))
    assert response.status_code == 302
    plain = Target.objects.get(name="t2")
    assert (plain.rate_limit, plain.filters, plain.paused) == (0, [], False)


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"filters": "{not json"}, "filters", "Enter a valid JSON."),
        ({"filters": '{"source": "header"}'}, "filters", "Filters must be a list of rules."),
        ({"filters": '[{"source": "body", "name": "x", "op": "exists"}]'}, "filters", "Rule 1"),
        (
            {"filters": '[{"source": "json", "name": "a", "op": "one_of", "value": []}]'},
            "filters",
            "one_of",
        ),
        ({"rate_limit": "-1"}, "rate_limit", "greater than or equal to 0"),
        ({"rate_limit": "fast"}, "rate_limit", "Enter a number."),
    ],
)
def test_bad_control_fields_are_field_errors(alice, fields, field, message):
    client = client_for(alice)
    response = client.post(reverse("admin:deliveries_webhook_add"), inline_data(**fields))
    assert response.status_code == 200
    inlines = {f.formset.prefix: f.formset for f in response.context["inline_admin_formsets"]}
    assert message in " ".join(inlines["targets"].forms[0].errors[field])
    assert not Webhook.objects.filter(name="new hook").exists()


def target_form_data(target, **changes):
    data = {
        "name": target.name,
        "type": target.type,
        "active": "on",
        "url": target.config.get("url", ""),
        "max_retries": "0",
        "max_queue_size": "10000",
        "rate_limit": "0",
        "filters": "[]",
        "initial-paused": "False",
        "initial-paused_reason": "",
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def test_the_target_page_edits_control_fields_with_field_errors(alice):
    _, target, *_ = world(alice, "h")
    client = client_for(alice)
    response = client.post(target_page(target), target_form_data(target, filters="[1]"))
    assert response.status_code == 200
    assert "filters" in response.context["adminform"].form.errors
    response = client.post(
        target_page(target), target_form_data(target, rate_limit="2.5", filters=json.dumps([RULE]))
    )
    assert response.status_code == 302
    target.refresh_from_db()
    assert (target.rate_limit, target.filters) == (2.5, [RULE])


def test_a_form_opened_before_the_engine_paused_does_not_resume(alice):
    _, target, *_ = world(alice, "h")
    Target.objects.filter(pk=target.pk).pause("answered 410 Gone")  # after the page was opened
    client = client_for(alice)
    response = client.post(target_page(target), target_form_data(target, rate_limit="1"))
    assert response.status_code == 302
    target.refresh_from_db()
    assert target.paused and target.paused_reason == "answered 410 Gone"
    assert target.rate_limit == 1
    # Unticking the box, as shown ticked, resumes.
    client.post(
        target_page(target),
        target_form_data(
            target, **{"initial-paused": "True", "initial-paused_reason": "answered 410 Gone"}
        ),
    )
    target.refresh_from_db()
    assert (target.paused, target.paused_reason, target.paused_at) == (False, "", None)


def test_the_webhook_form_has_the_alert_url(alice):
    client = client_for(alice)
    data = {**inline_data(), "alert_url": "https://hooks.slack.com/services/T/B/x"}
    assert client.post(reverse("admin:deliveries_webhook_add"), data).status_code == 302
    assert Webhook.objects.get().alert_url == "https://hooks.slack.com/services/T/B/x"
    data["alert_url"], data["name"] = "http://10.0.0.1/alerts", "other"
    response = client.post(reverse("admin:deliveries_webhook_add"), data)
    assert response.status_code == 200
    assert "alert_url" in response.context["adminform"].form.errors


def test_alerts_are_listed_for_their_owner_only(alice, bob):
    _, target, *_ = world(alice, "h")
    _, theirs, *_ = world(bob, "bobs-secret-hook")
    Alert.objects.create(target=target, kind="paused", message="alices alert", email="sent")
    other = Alert.objects.create(target=theirs, kind="breaker", message="bobs alert")
    client = client_for(alice)
    body = client.get(reverse("admin:deliveries_alert_changelist")).content.decode()
    assert "alices alert" in body and "bobs alert" not in body
    assert "bobs-secret-hook" not in body
    assert client.get(reverse("admin:deliveries_alert_change", args=[other.pk])).status_code == 404
    assert client.get(reverse("admin:index")).content.decode().count("/admin/deliveries/alert/")


def test_health_on_the_webhook_page_and_the_dashboard(alice):
    hook, target, _, delivery = world(alice, "h")
    DeliveryResult.objects.filter(delivery=delivery).update(target=target)
    paused = Target.objects.create(webhook=hook, name="held-one", type="log")
    Target.objects.filter(pk=paused.pk).pause("ordered delivery: event e failed")
    until = open_breaker(target)
    client = client_for(alice)
    body = client.get(reverse("admin:deliveries_webhook_change", args=[hook.pk])).content.decode()
    assert "0.0 % of 1 attempts succeeded" in body and "last error: HTTP 500" in body
    assert "paused: ordered delivery: event e failed" in body
    body = client.get(reverse("admin:index")).content.decode()
    assert "held-one" in body and "ordered delivery: event e failed" in body
    assert f"breaker open</span>, next probe {timezone.localtime(until):%H:%M:%S}" in body

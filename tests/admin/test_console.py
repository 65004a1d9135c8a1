"""The console: what the event list, search, event and delivery pages, dashboard and
sidebar show (the look itself is django-unfold's; tests/admin/test_browser.py walks it)."""

import datetime
import json
import warnings

import pytest
from django.urls import reverse
from django.utils import timezone

from deliveries.admin import search
from deliveries.models import Alert, Delivery, DeliveryResult, EngineStatus, Event, Target
from tests.support.admin import client_for, world
from tests.support.engines import attempt_one, store

pytestmark = pytest.mark.django_db

EVENTS = reverse("admin:deliveries_event_changelist")


def test_event_type_is_read_from_the_senders_header_or_json_type(alice):
    hook, *_ = world(alice, "h")
    entrypoint = hook.entrypoints.get()
    [github] = store(entrypoint, headers=[["X-GitHub-Event", "push"]])
    [stripe] = store(entrypoint, body=json.dumps({"id": "evt_1", "type": "invoice.paid"}).encode())
    [plain] = store(entrypoint, body=b"[1, 2]")
    types = dict(Event.objects.values_list("pk", "event_type"))
    assert (types[github.pk], types[stripe.pk], types[plain.pk]) == ("push", "invoice.paid", "")


def test_the_event_list_shows_short_codes_types_ids_and_outcomes(alice):
    hook, _target, _event, _ = world(alice, "h")  # its one delivery failed
    Target.objects.create(webhook=hook, name="second", type="log")
    [both] = store(hook.entrypoints.get(), headers=[["X-GitHub-Event", "issues"]])
    Delivery.objects.filter(event=both).update(status="delivered")
    Event.objects.filter(pk=both.pk).update(provider_id="gh-delivery-77")
    body = client_for(alice).get(EVENTS).content.decode()
    short = str(both.code)[:8]
    assert f'title="{both.code}">' in body and f">{short}</a>" in body
    assert f'data-copy="{both.code}"' in body
    assert "issues" in body and "gh-delivery-77" in body
    assert "2 of 2 delivered" in body
    assert "1 failed" in body  # the first event: its one delivery failed


def test_event_list_filters_by_entrypoint_status_and_received_range(alice):
    hook, _, failed_event, _ = world(alice, "h")
    second = hook.entrypoints.create(description="second door")
    [other] = store(second)
    Delivery.objects.filter(event=other).update(status="delivered")
    Event.objects.filter(pk=other.pk).update(
        received_at=timezone.now() - datetime.timedelta(days=3)
    )
    client = client_for(alice)

    def listed(query):
        response = client.get(f"{EVENTS}?{query}")
        assert response.status_code == 200, query
        return {e.pk for e in response.context["cl"].result_list}

    assert listed(f"entrypoint={second.pk}") == {other.pk}
    assert listed("delivery_status=failed") == {failed_event.pk}
    assert listed("delivery_status=delivered") == {other.pk}
    since = (timezone.now() - datetime.timedelta(days=1)).strftime("%Y-%m-%d %H:%M")
    day = since.split()[0]
    # The range is read in the current time zone, aware: Django has nothing to
    # warn about (unfold's own filter built naive datetimes, one warning a request).
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        found = listed(f"received_at_from_0={day}&received_at_from_1={since.split()[1]}")
        assert listed(f"received_at_to_0={day}&received_at_to_1={since.split()[1]}") == {other.pk}
        # Not a date: the range is left out, as unfold leaves it.
        assert listed("received_at_from_0=soon&received_at_from_1=12:00") == {
            failed_event.pk,
            other.pk,
        }
    assert found == {failed_event.pk}
    assert [str(w.message) for w in warned if w.category is RuntimeWarning] == []


def test_search_by_code_prefix_provider_id_header_and_payload(alice, bob):
    hook, _, event, _ = world(alice, "h")
    entrypoint = hook.entrypoints.get()
    [tagged] = store(
        entrypoint,
        body=b'{"customer": "cus_needle"}',
        headers=[["X-Request-Id", "req-haystack-42"]],
    )
    Event.objects.filter(pk=tagged.pk).update(provider_id="evt_exact")
    theirs = world(bob, "theirs")[2]
    client = client_for(alice)

    def found(query):
        response = client.get(f"{EVENTS}?{query}")
        assert response.status_code == 200
        return {e.pk for e in response.context["cl"].result_list}, response.content.decode()

    assert found(f"q={str(event.code)[:8]}")[0] == {event.pk}
    assert found(f"q={str(event.code)[:13]}")[0] == {event.pk}  # dashes are fine
    assert found("q=evt_exact")[0] == {tagged.pk}
    assert found("q=evt_exa")[0] == set()  # provider ids match whole
    assert found(f"q={str(theirs.code)[:8]}")[0] == set()  # never another user's
    hits, page = found("search_in=payload&q=cus_needle")
    assert hits == {tagged.pk}
    assert "Searched the payload of the 2 newest events" in page
    assert found("search_in=headers&q=haystack-42")[0] == {tagged.pk}


def test_a_payload_search_says_when_it_stopped_short(alice, monkeypatch):
    hook, *_ = world(alice, "h")
    store(hook.entrypoints.get(), n=3)
    monkeypatch.setattr(search, "SCAN_ROWS", 2)
    found, reach = search.scan(Event.objects.all(), "who", "payload", limit=2)
    assert reach.looked == 2 and reach.capped and reach.oldest <= reach.newest
    assert found.count() == 0  # only the oldest event says "who": out of reach
    response = client_for(alice).get(f"{EVENTS}?search_in=payload&q=ok")
    assert "That is the limit of one search (2 events)" in response.content.decode()


def test_the_event_page_shows_its_deliveries_first_with_their_buttons(alice):
    _hook, _target, event, delivery = world(alice, "h")
    body = (
        client_for(alice)
        .get(reverse("admin:deliveries_event_change", args=[event.pk]))
        .content.decode()
    )
    assert body.index(">Deliveries<") < body.index(">Headers<") < body.index(">Body<")
    redeliver = reverse("admin:deliveries_delivery_redeliver", args=[delivery.pk])
    assert f'formaction="{redeliver}?next=' in body and ">Redeliver</button>" in body


def test_retry_now_and_redeliver_buttons_act_on_one_delivery(alice, bob):
    _, _, event, delivery = world(alice, "h")
    later = timezone.now() + datetime.timedelta(hours=1)
    Delivery.objects.filter(pk=delivery.pk).update(status="retrying", next_attempt_at=later)
    client = client_for(alice)
    retry = reverse("admin:deliveries_delivery_retry_now", args=[delivery.pk])
    assert client.get(retry).status_code == 405  # a change: POST only
    page = reverse("admin:deliveries_event_change", args=[event.pk])
    response = client.post(f"{retry}?next={page}")
    assert response.status_code == 302 and response["Location"] == page
    assert Delivery.objects.get(pk=delivery.pk).status == "pending"
    # Off-site "next" is not followed; another user's delivery is not found.
    Delivery.objects.filter(pk=delivery.pk).update(status="failed")
    redeliver = reverse("admin:deliveries_delivery_redeliver", args=[delivery.pk])
    response = client.post(f"{redeliver}?next=https://evil.example/")
    assert response["Location"] == reverse("admin:deliveries_delivery_change", args=[delivery.pk])
    assert Delivery.objects.get(pk=delivery.pk).status == "pending"
    assert client_for(bob).post(redeliver).status_code == 404


def test_the_delivery_page_shows_each_attempt_sent_and_answered(user, sink, make_target):
    target = make_target(
        url=sink.url("/hook"),
        config={"url": sink.url("/hook"), "headers": {"X-Token": "t0p-secret"}},
    )
    sink.always("/hook", 503, {"X-Served-By": "sink-7", "Retry-After": "1"})
    attempt_one(target.webhook.entrypoints.get(), headers=[["Authorization", "Bearer abc123"]])
    result = DeliveryResult.objects.get()
    assert result.request_url == sink.url("/hook")
    sent = dict(result.request_headers)
    assert sent["X-Token"] == sent["Authorization"] == "••••••••"
    assert "X-Served-By: sink-7" in result.response_headers
    user.is_staff = user.is_superuser = True
    user.save()
    body = (
        client_for(user)
        .get(reverse("admin:deliveries_delivery_change", args=[result.delivery_id]))
        .content.decode()
    )
    assert f"POST {sink.url('/hook')}" in body and "Response 503" in body
    assert "sink-7" in body and "t0p-secret" not in body and "abc123" not in body
    assert body.index(">Request<") < body.index(">Response 503")


def test_the_dashboard_says_how_long_ago_an_engine_stopped_in_seconds(alice):
    now = timezone.now()
    EngineStatus.objects.create(
        name="a",
        pid=11,
        started_at=now - datetime.timedelta(hours=2),
        heartbeat_at=now - datetime.timedelta(seconds=45),
        stopped_at=now - datetime.timedelta(seconds=45),
    )
    body = client_for(alice).get(reverse("admin:index")).content.decode()
    assert "stopped 45 s ago" in body or "stopped 46 s ago" in body
    assert "0 minutes" not in body


def test_the_dashboard_reloads_from_its_live_url(alice, settings):
    settings.WEBHOOKER_CONSOLE_REFRESH = 7
    _hook, target, *_ = world(alice, "h")
    Target.objects.filter(pk=target.pk).pause("maintenance window")
    Alert.objects.create(target=target, kind="disabled", message="too many failures")
    client = client_for(alice)
    page = client.get(reverse("admin:index")).content.decode()
    live = reverse("dashboard_live")
    assert f'data-live="{live}" data-refresh="7000"' in page  # every 7 s, as set
    fragment = client.get(live)
    assert fragment.status_code == 200
    body = fragment.content.decode()
    assert body.lstrip().startswith('<div class="wh-dashboard" id="wh-dashboard"')
    assert "maintenance window" in body and "too many failures" in body
    assert 'id="wh-slowest"' in body
    assert client_for_anonymous(live).status_code == 302  # to the login page


def client_for_anonymous(url):
    from django.test import Client

    return Client().get(url)


def test_the_sidebar_hides_login_throttling_except_under_security(alice, superuser):
    axes = reverse("admin:axes_accessattempt_changelist")
    mine = client_for(alice).get(reverse("admin:index")).content.decode()
    assert axes not in mine and ">Security<" not in mine
    assert reverse("admin:deliveries_event_changelist") in mine
    theirs = client_for(superuser).get(reverse("admin:index")).content.decode()
    assert axes in theirs and "Security" in theirs
    # Not in the main list of models either: the dashboard replaces it.
    assert "Access attempts" not in theirs

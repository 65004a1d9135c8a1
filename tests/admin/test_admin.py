"""The admin as the management UI: pages, ownership, actions, forms, query counts."""

import datetime

import pytest
from django.urls import reverse
from django.utils import timezone

from deliveries.models import Delivery, DeliveryResult, EngineStatus, Event, Target, Webhook
from tests.support.admin import act, client_for, inline_data, world
from tests.support.engines import make_engine, pump, store

pytestmark = pytest.mark.django_db


def pages(hook, event, delivery):
    return [
        reverse("admin:index"),
        reverse("admin:deliveries_webhook_changelist"),
        reverse("admin:deliveries_webhook_add"),
        reverse("admin:deliveries_webhook_change", args=[hook.pk]),
        reverse("admin:deliveries_event_changelist"),
        reverse("admin:deliveries_event_change", args=[event.pk]),
        reverse("admin:deliveries_event_body", args=[event.pk]),
        reverse("admin:deliveries_delivery_changelist"),
        reverse("admin:deliveries_delivery_change", args=[delivery.pk]),
    ]


@pytest.mark.parametrize("who", ["superuser", "alice"])
def test_every_page_renders(who, superuser, alice, request):
    user = request.getfixturevalue(who)
    hook, _, event, delivery = world(alice, "alices-hook")
    client = client_for(user)
    for url in pages(hook, event, delivery):
        response = client.get(url)
        assert response.status_code == 200, url


def test_a_scoped_user_gets_nothing_of_another_users(alice, bob):
    mine = world(alice, "alices-hook")
    theirs = world(bob, "bobs-secret-hook")
    client = client_for(alice)
    for url in [
        *pages(*(mine[0], mine[2], mine[3]))[:2],
        reverse("admin:deliveries_event_changelist"),
        reverse("admin:deliveries_delivery_changelist"),
    ]:
        body = client.get(url).content.decode()
        assert "bobs-secret-hook" not in body, url
        assert str(theirs[2].code) not in body, url
    hook, _, event, delivery = theirs
    theirs_by_url = [
        reverse("admin:deliveries_webhook_change", args=[hook.pk]),
        reverse("admin:deliveries_event_change", args=[event.pk]),
        reverse("admin:deliveries_event_body", args=[event.pk]),
        reverse("admin:deliveries_delivery_change", args=[delivery.pk]),
    ]
    for url in theirs_by_url:
        assert client.get(url).status_code == 404, url
    # Filter choices list only her own webhooks and targets.
    body = client.get(reverse("admin:deliveries_delivery_changelist")).content.decode()
    assert "alices-hook" in body and "bobs-secret-hook" not in body
    # Changing another user's webhook by URL is refused too.
    response = client.post(reverse("admin:deliveries_webhook_change", args=[hook.pk]), {})
    assert response.status_code == 404


def test_actions_cannot_touch_another_users_rows(alice, bob):
    theirs = world(bob, "bobs-hook")
    client = client_for(alice)
    response = act(
        client,
        reverse("admin:deliveries_delivery_changelist"),
        {
            "action": "redeliver",
            "_selected_action": [theirs[3].pk],
        },
    )
    assert response.status_code in (200, 302)
    assert Delivery.objects.get(pk=theirs[3].pk).status == "failed"
    act(
        client,
        reverse("admin:deliveries_event_changelist"),
        {
            "action": "replay",
            "_selected_action": [theirs[2].pk],
        },
    )
    assert Delivery.objects.get(pk=theirs[3].pk).status == "failed"


def test_webhook_list_shows_counts_and_health(alice):
    world(alice, "alices-hook")
    body = client_for(alice).get(reverse("admin:deliveries_webhook_changelist")).content.decode()
    assert "failing" in body
    assert "1 (1 failed, 0 retrying)" in body


def test_entrypoint_shows_full_inbound_url_with_copy_button(alice, settings):
    hook, *_ = world(alice, "alices-hook")
    code = hook.entrypoints.get().code
    url = reverse("admin:deliveries_webhook_change", args=[hook.pk])
    body = client_for(alice).get(url).content.decode()
    assert f"http://testserver/webhook/{code}" in body
    assert "wh-copy" in body
    settings.WEBHOOKER_PUBLIC_URL = "https://hooks.example.com"
    body = client_for(alice).get(url).content.decode()
    assert f"https://hooks.example.com/webhook/{code}" in body


def test_event_page_renders_headers_and_body_and_downloads_exact_bytes(alice):
    hook = Webhook.objects.create(name="h", owner=alice)
    hook.ensure_entrypoint()
    binary = bytes(range(256))
    [event] = store(
        hook.entrypoints.get(),
        body=binary,
        content_type="application/octet-stream",
        headers=[["X-Signature", "sha256=abc"]],
    )
    client = client_for(alice)
    body = client.get(reverse("admin:deliveries_event_change", args=[event.pk])).content.decode()
    assert "X-Signature" in body and "sha256=abc" in body
    assert "00000000  00 01 02 03" in body  # the hex view
    download = client.get(reverse("admin:deliveries_event_body", args=[event.pk]))
    assert download.content == binary
    assert download["Content-Type"] == "application/octet-stream"

    [json_event] = store(hook.entrypoints.get(), body=b'{"a":{"b":1}}')
    body = client.get(reverse("admin:deliveries_event_change", args=[json_event.pk]))
    assert "{\n  &quot;a&quot;: {\n    &quot;b&quot;: 1" in body.content.decode()


def test_delivery_page_shows_the_attempt_timeline(alice):
    _, _, _, delivery = world(alice, "h")
    body = (
        client_for(alice)
        .get(reverse("admin:deliveries_delivery_change", args=[delivery.pk]))
        .content.decode()
    )
    assert "attempts, newest first" in body.lower()
    assert "HTTP 500" in body and "Response 500" in body


def test_delivery_list_filters(alice):
    hook, target, _, delivery = world(alice, "h")
    client = client_for(alice)
    url = reverse("admin:deliveries_delivery_changelist")
    for query in [
        "status__exact=failed",
        f"webhook={hook.pk}",
        f"target={target.pk}",
        "target__type__exact=http",
        f"q={delivery.event.code}",
    ]:
        response = client.get(f"{url}?{query}")
        assert response.status_code == 200, query
        assert response.context["cl"].result_count == 1, query
    assert client.get(f"{url}?status__exact=delivered").context["cl"].result_count == 0


def test_redeliver_keeps_history_and_the_engine_delivers_again(alice, sink):
    hook = Webhook.objects.create(name="h", owner=alice)
    hook.ensure_entrypoint()
    Target.objects.create(webhook=hook, name="t", type="http", config={"url": sink.url("/r")})
    engine = make_engine()
    engine.recover_once(at_start=True)
    store(hook.entrypoints.get(), n=3)
    pump(engine, lambda: not Delivery.objects.unfinished().exists())
    first, second, third = Delivery.objects.order_by("id")
    client = client_for(alice)
    response = act(
        client,
        reverse("admin:deliveries_delivery_changelist"),
        {
            "action": "redeliver",
            "_selected_action": [first.pk, second.pk],
        },
        follow=True,
    )
    assert "Queued 2 deliveries for redelivery." in response.content.decode()
    assert Delivery.objects.get(pk=first.pk).status == "pending"
    assert Delivery.objects.get(pk=first.pk).attempts == 1
    assert Delivery.objects.get(pk=third.pk).status == "delivered"
    assert DeliveryResult.objects.count() == 3  # history kept
    pump(engine, lambda: not Delivery.objects.unfinished().exists())
    assert Delivery.objects.get(pk=first.pk).attempts == 2
    assert DeliveryResult.objects.filter(delivery=first).count() == 2
    assert len(sink.requests("/r")) == 5


def test_replay_redelivers_and_adds_deliveries_for_new_targets(alice):
    hook, target, event, delivery = world(alice, "h")
    other_event = store(hook.entrypoints.get())[0]
    Delivery.objects.filter(event=other_event).update(status="delivered", attempts=1)
    new_target = Target.objects.create(webhook=hook, name="new", type="log")
    Target.objects.create(webhook=hook, name="off", type="log", active=False)
    client = client_for(alice)
    response = act(
        client,
        reverse("admin:deliveries_event_changelist"),
        {
            "action": "replay",
            "_selected_action": [event.pk],
        },
        follow=True,
    )
    assert "Queued 2 deliveries" in response.content.decode()
    assert Delivery.objects.get(pk=delivery.pk).status == "pending"
    assert Delivery.objects.get(pk=delivery.pk).attempts == 1
    assert Delivery.objects.get(event=event, target=new_target).status == "pending"
    assert not Delivery.objects.filter(target__name="off").exists()
    assert Delivery.objects.get(event=other_event, target=target).status == "delivered"


def test_bulk_actions_run_a_few_queries_for_thousands(alice, django_assert_max_num_queries):
    hook, target, event, _ = world(alice, "h")
    now = timezone.now()
    events = Event.objects.bulk_create(
        Event(webhook=hook, method="POST", received_at=now) for _ in range(2000)
    )
    Delivery.objects.bulk_create(Delivery(event=e, target=target, status="failed") for e in events)
    client = client_for(alice)
    with django_assert_max_num_queries(35):  # the action, then its confirmation
        act(
            client,
            reverse("admin:deliveries_delivery_changelist"),
            {
                "action": "redeliver",
                "select_across": "1",
                "index": "0",
                "_selected_action": [event.pk],
            },
        )
    assert Delivery.objects.filter(status="pending").count() == 2001
    Target.objects.create(webhook=hook, name="new", type="log")
    with django_assert_max_num_queries(50):  # the action, then its confirmation
        act(
            client,
            reverse("admin:deliveries_event_changelist"),
            {
                "action": "replay",
                "select_across": "1",
                "index": "0",
                "_selected_action": [event.pk],
            },
        )
    assert Delivery.objects.filter(target__name="new").count() == 2001


@pytest.mark.parametrize("rows", [10, 1000])
def test_list_query_counts_do_not_grow_with_rows(rows, alice, django_assert_max_num_queries):
    hook, target, *_ = world(alice, "h")
    now = timezone.now()
    events = Event.objects.bulk_create(
        Event(
            webhook=hook,
            method="POST",
            body=b"x" * 100,
            body_size=100,
            received_at=now - datetime.timedelta(seconds=n),
        )
        for n in range(rows)
    )
    Delivery.objects.bulk_create(Delivery(event=e, target=target) for e in events)
    client = client_for(alice)
    for name in ("event", "delivery", "webhook"):
        with django_assert_max_num_queries(12):
            response = client.get(reverse(f"admin:deliveries_{name}_changelist"))
        assert response.status_code == 200


def test_dashboard_shows_the_engine_and_the_last_day(alice):
    world(alice, "h")
    client = client_for(alice)
    body = client.get(reverse("admin:index")).content.decode()
    assert "not running" in body and "No heartbeat yet" in body
    now = timezone.now()
    EngineStatus.objects.create(
        pid=4242,
        started_at=now,
        heartbeat_at=now,
        channel_depth=7,
        inflight=9,
        busy_workers=3,
        workers=10,
        open_breakers=1,
    )
    body = client.get(reverse("admin:index")).content.decode()
    assert "running" in body and "4242" in body and "3 of 10" in body
    assert 'id="wh-count-failed">1<' in body
    assert "<svg" in body and "h-target" in body  # failing targets list
    EngineStatus.objects.update(heartbeat_at=now - datetime.timedelta(minutes=5))
    body = client.get(reverse("admin:index")).content.decode()
    assert "not running" in body and "wh-stale" in body


def test_creating_a_webhook_with_a_target_through_the_form(alice):
    client = client_for(alice)
    response = client.post(
        reverse("admin:deliveries_webhook_add"),
        inline_data(headers="X-Token: s3cret\nX-Other: 1", timeout="5"),
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    hook = Webhook.objects.get(name="new hook")
    assert hook.owner == alice
    assert hook.entrypoints.count() == 1
    target = hook.targets.get()
    assert target.config == {
        "url": "https://example.com/hook",
        "headers": {"X-Token": "s3cret", "X-Other": "1"},
        "timeout": 5.0,
    }
    assert target.max_retries == 3


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"url": "not a url"}, "url"),
        ({"url": "ftp://example.com/x"}, "url"),
        ({"url": ""}, "url"),
        ({"headers": "no colon here"}, "headers"),
        ({"headers": "Bad Name: x"}, "headers"),
        ({"headers": "Host: evil"}, "headers"),
        ({"max_retries": "-1"}, "max_retries"),
        ({"max_retries": "lots"}, "max_retries"),
        ({"timeout": "-3"}, "timeout"),
        ({"type": "slack", "webhook_url": "javascript:alert(1)"}, "webhook_url"),
        ({"type": "slack", "webhook_url": ""}, "webhook_url"),
        ({"type": "carrier-pigeon"}, "type"),
        ({"max_queue_size": "0"}, "max_queue_size"),
    ],
)
def test_target_form_rejects_bad_input_with_field_errors(alice, fields, field):
    client = client_for(alice)
    response = client.post(reverse("admin:deliveries_webhook_add"), inline_data(**fields))
    assert response.status_code == 200
    formset = next(
        f for f in response.context["inline_admin_formsets"] if f.formset.prefix == "targets"
    ).formset
    assert field in formset.forms[0].errors
    assert not Webhook.objects.filter(name="new hook").exists()


def test_superuser_can_assign_an_owner(superuser, alice):
    client = client_for(superuser)
    data = inline_data()
    data["owner"] = alice.pk
    assert client.post(reverse("admin:deliveries_webhook_add"), data).status_code == 302
    assert Webhook.objects.get(name="new hook").owner == alice


def test_junk_in_urls_and_bodies_never_500s(alice):
    hook = Webhook.objects.create(name="h", owner=alice)
    hook.ensure_entrypoint()
    nested = b"[" * 100_000 + b"]" * 100_000
    [event] = store(hook.entrypoints.get(), body=nested)
    client = client_for(alice)
    response = client.get(reverse("admin:deliveries_event_change", args=[event.pk]))
    assert response.status_code == 200  # shown as text, not pretty-printed
    assert client.get("/admin/deliveries/event/abc/body/").status_code == 404
    assert client.get("/admin/deliveries/event/abc/change/").status_code == 404
    url = reverse("admin:deliveries_delivery_changelist")
    for query in ("webhook=²", "target=99999999999999999999", "webhook=-1", "target=x"):
        response = client.get(f"{url}?{query}")
        assert response.status_code == 200, query
        assert response.context["cl"].result_count == 0, query


def test_retention_days_is_bounded(alice):
    client = client_for(alice)
    data = inline_data()
    data["retention_days"] = "99999999"
    response = client.post(reverse("admin:deliveries_webhook_add"), data)
    assert response.status_code == 200
    assert "retention_days" in response.context["adminform"].form.errors


@pytest.mark.django_db(transaction=True)
def test_target_hosts_are_resolved_before_the_admin_transaction(alice, dns, monkeypatch):
    """The DNS lookup of the SSRF check happens before the write transaction opens."""
    from django.db import connection

    from deliveries import ssrf

    real_resolve = ssrf.resolve
    seen_in_transaction = []

    def watching(host, port):
        seen_in_transaction.append(connection.in_atomic_block)
        return real_resolve(host, port)

    monkeypatch.setattr(ssrf, "resolve", watching)
    response = client_for(alice).post(reverse("admin:deliveries_webhook_add"), inline_data())
    assert response.status_code == 302
    assert seen_in_transaction and not any(seen_in_transaction)

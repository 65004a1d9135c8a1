"""The console defects an outside reviewer met as a new user (at 1440 and 390 px),
each pinned by a test that failed before its fix."""

import datetime
import html
import re
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib import admin
from django.contrib.admin.views.main import PAGE_VAR
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from unfold.widgets import BASE_INPUT_CLASSES, SELECT_CLASSES

from deliveries.admin import health
from deliveries.admin.base import CappedCountPaginator
from deliveries.alerts import raise_alert
from deliveries.models import Alert, Delivery, DeliveryResult, Event, Target, Webhook
from tests.support.admin import Tags, client_for, inline_data, world
from tests.support.api import client_of
from tests.support.engines import store

pytestmark = pytest.mark.django_db

LISTS = {
    "event": ("admin:deliveries_event_changelist", Event),
    "delivery": ("admin:deliveries_delivery_changelist", Delivery),
}


def failed_deliveries(hook_world, n):
    _, target, *_ = hook_world
    events = store(target.webhook.entrypoints.get(), n=n)
    Delivery.objects.filter(event__in=events).update(status="failed", attempts=1)
    return events


# --- 1. "Show counts" counts as the list does: at most CAP rows each ----------------


@pytest.mark.parametrize("model", list(LISTS))
def test_show_counts_reads_at_most_the_capped_number_of_rows(alice, model, monkeypatch):
    """Show counts took 3.9 s on 100 000 events and up to 21 s on 200 000
    deliveries: one COUNT per filter over every row. Each count is now the list's
    own capped count (a LIMIT subquery), shown as "at least" past the cap."""
    monkeypatch.setattr(CappedCountPaginator, "CAP", 3)
    hook_world = world(alice, "h")  # one failed delivery
    failed_deliveries(hook_world, 4)  # five in all, past the cap
    client = client_for(alice)
    url = reverse(LISTS[model][0])
    with CaptureQueriesContext(connection) as plain:
        client.get(url)
    with CaptureQueriesContext(connection) as faceted:
        response = client.get(f"{url}?_facets=1")
    assert response.status_code == 200
    seen = {query["sql"] for query in plain.captured_queries}
    counts = [
        query["sql"]
        for query in faceted.captured_queries
        if query["sql"] not in seen
        and re.search(r'FROM "deliveries_(event|delivery)"', query["sql"])
    ]
    assert counts  # the counts were made...
    for sql in counts:  # ...each over at most CAP + 1 rows
        assert re.fullmatch(r"SELECT COUNT\(\*\) FROM \(SELECT .* LIMIT 4\) subquery", sql), sql
    page = html.unescape(response.content.decode())
    assert "Failed (3+)" in page  # past the cap: at least
    assert "Pending (0)" in page


# --- 2. A page past the end keeps the filters ------------------------------------


@pytest.mark.parametrize("model", list(LISTS))
@pytest.mark.parametrize("page", ["500", "0"])
def test_a_page_out_of_range_keeps_every_filter(alice, model, page, monkeypatch):
    hook_world = world(alice, "h")
    failed_deliveries(hook_world, 2)  # three failed deliveries, three events
    name, model_class = LISTS[model]
    monkeypatch.setattr(admin.site.get_model_admin(model_class), "list_per_page", 1)
    url = reverse(name)
    query = f"webhook={hook_world[0].pk}&q=&{PAGE_VAR}={page}"
    query += "&delivery_status=failed" if model == "event" else "&status__exact=failed"
    client = client_for(alice)
    response = client.get(f"{url}?{query}")
    assert response.status_code == 302
    location = urlsplit(response["Location"])
    assert location.path == url
    kept = parse_qs(location.query, keep_blank_values=True)
    assert kept["webhook"] == [str(hook_world[0].pk)]
    assert "e" not in kept  # not the admin's "invalid lookup" reset
    assert kept[PAGE_VAR] == ["3" if page == "500" else "1"]
    assert (kept.get("status__exact") or kept.get("delivery_status")) == ["failed"]
    landed = client.get(response["Location"])
    assert landed.status_code == 200
    assert len(landed.context["cl"].result_list) == 1


# --- 3. No header link leads to a 404 ----------------------------------------------


def links(body):
    return {a["href"] for a in Tags(body).find("a") if a.get("href", "").startswith("/")}


def test_no_link_of_the_console_header_or_login_page_is_a_404(alice):
    client = client_for(alice)
    body = client.get(reverse("admin:index")).content.decode()
    assert "View site" not in body
    for href in sorted(links(body)):
        assert client.get(href).status_code != 404, href
    login = Client().get(reverse("admin:login")).content.decode()
    for href in sorted(links(login)):
        assert Client().get(href).status_code != 404, href


# --- 4. The delivery page: one consistent read, and it refreshes itself ------------


def delivery_page(client, delivery):
    return client.get(reverse("admin:deliveries_delivery_change", args=[delivery.pk]))


@pytest.mark.parametrize("after", [1, 2, 3])
def test_the_delivery_page_never_shows_a_torn_view(alice, after):
    """The engine commits an attempt (its result and the delivery's new state, in
    one transaction) between any two of the page's reads: what the page shows of
    the delivery agrees with the attempts it lists."""
    *_, delivery = world(alice, "h")  # failed, attempt 1
    Delivery.objects.filter(pk=delivery.pk).update(status="pending")  # Retry now
    reads = []

    def engine_commits_meanwhile(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.lstrip().startswith("SELECT") and re.search(r'"deliveries_delivery(result)?"', sql):
            reads.append(sql)
            if len(reads) == after:
                DeliveryResult.objects.create(
                    delivery_id=delivery.pk, attempt=2, success=True, status_code=200
                )
                Delivery.objects.filter(pk=delivery.pk).update(status="delivered", attempts=2)
        return result

    with connection.execute_wrapper(engine_commits_meanwhile):
        response = delivery_page(client_for(alice), delivery)
    assert response.status_code == 200
    body = response.content.decode()
    # As rendered: the status badge and the attempts field come before the attempts.
    status = re.search(r'<span class="wh-badge"[^>]*>(\w+)</span>', body)[1]
    attempts = re.search(r">Attempts</label>.*?<div class=\"readonly[^>]*>(\d+)</div>", body, re.S)
    listed = re.findall(r"<strong>Attempt (\d+)</strong>", body)
    assert max(map(int, listed)) == int(attempts[1])
    assert status == ("delivered" if attempts[1] == "2" else "pending")


@pytest.mark.parametrize(
    ("status", "refreshes"),
    [("pending", True), ("retrying", True), ("delivered", False), ("failed", False)],
)
def test_the_delivery_page_refreshes_itself_while_on_its_way(alice, status, refreshes, settings):
    settings.WEBHOOKER_CONSOLE_REFRESH = 7
    *_, delivery = world(alice, "h")
    Delivery.objects.filter(pk=delivery.pk).update(status=status)
    body = delivery_page(client_for(alice), delivery).content.decode()
    meta = Tags(body).find("meta", **{"http-equiv": "refresh"})
    assert bool(meta) == refreshes
    if refreshes:  # as often as the setting says
        assert meta[0]["content"] == "7"


# --- 5. A new webhook's inbound URL at the top, with a curl to try it -------------


def test_a_saved_webhook_shows_its_inbound_url_and_a_curl_at_the_top(alice):
    client = client_for(alice)
    response = client.post(reverse("admin:deliveries_webhook_add"), inline_data(), follow=True)
    hook = Webhook.objects.get()
    assert response.redirect_chain[-1][0] == reverse(
        "admin:deliveries_webhook_change", args=[hook.pk]
    )
    url = f"http://testserver/webhook/{hook.entrypoints.get().code}"
    body = response.content.decode()
    curl = f"""curl -X POST {url} -H 'Content-Type: application/json' -d '{{"hello": "world"}}'"""
    text = html.unescape(body)
    assert curl in text
    tags = Tags(body)
    assert tags.find("button", **{"data-copy": url})
    assert tags.find("button", **{"data-copy": curl})
    # Above the form's fields, not below the fold.
    assert text.index(curl) < text.index('id="id_name"')


def test_save_and_add_another_still_adds_another(alice):
    data = {**inline_data(), "_addanother": "1"}
    response = client_for(alice).post(reverse("admin:deliveries_webhook_add"), data)
    assert response["Location"] == reverse("admin:deliveries_webhook_add")


# --- 6. The target form's inputs are unfold's, the inline compact ------------------


def test_the_target_inline_uses_styled_inputs_and_folds_its_advanced_fields(alice):
    hook, _target, *_ = world(alice, "h")
    response = client_for(alice).get(reverse("admin:deliveries_webhook_change", args=[hook.pk]))
    tags = Tags(response.content.decode())
    for prefix in ("targets-0", "targets-__prefix__"):
        for tag, name in [
            ("input", "url"),
            ("textarea", "headers"),
            ("input", "timeout"),
            ("input", "webhook_url"),
            ("textarea", "filters"),
            ("input", "max_retries"),
        ]:
            [field] = tags.find(tag, name=f"{prefix}-{name}")
            assert set(BASE_INPUT_CLASSES) <= set(field.get("class", "").split()), name
        [select] = tags.find("select", name=f"{prefix}-type")
        assert set(SELECT_CLASSES) - {"max-w-2xl"} <= set(select["class"].split())
    [inline] = [
        f for f in response.context["inline_admin_formsets"] if f.formset.prefix == "targets"
    ]
    form = next(iter(inline))
    folded = {fieldset.name for fieldset in form if fieldset.is_collapsible}
    assert {
        "HTTP endpoint options",
        "Signing (Standard Webhooks)",
        "Delivery",
        "Pause",
        "Filters",
    } <= (folded)
    # The first row holds the name and the type alone: room for "HTTP endpoint".
    first = next(iter(form))
    assert next(line.fields for line in first) == ("name", "type")


def test_a_folded_section_with_an_error_opens(alice):
    response = client_for(alice).post(
        reverse("admin:deliveries_webhook_add"), inline_data(max_retries="lots")
    )
    [inline] = [
        f for f in response.context["inline_admin_formsets"] if f.formset.prefix == "targets"
    ]
    form = next(iter(inline))
    delivery = next(fieldset for fieldset in form if fieldset.name == "Delivery")
    assert not delivery.is_collapsible


# --- 7. New targets retry by default ----------------------------------------------


def test_new_targets_retry_by_default_in_the_model_admin_and_api(alice):
    default = Target._meta.get_field("max_retries").default
    assert default == 5  # retried with backoff, behind the breaker
    body = client_for(alice).get(reverse("admin:deliveries_webhook_add")).content.decode()
    [field] = Tags(body).find("input", name="targets-__prefix__-max_retries")
    assert field["value"] == str(default)
    hook, *_ = world(alice, "h")
    response = client_of(alice).post(
        "/api/v1/targets/",
        {
            "webhook": hook.pk,
            "name": "api",
            "type": "http",
            "config": {"url": "https://example.com/"},
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    assert response.json()["max_retries"] == default


# --- 8. Webhook health is graded ----------------------------------------------------


def hook_with(owner, name, delivered, failed, retrying=0):
    hook = Webhook.objects.create(name=name, owner=owner)
    hook.ensure_entrypoint()
    Target.objects.create(webhook=hook, name="t", type="log")
    events = store(hook.entrypoints.get(), n=delivered + failed + retrying)
    ids = list(Delivery.objects.filter(event__in=events).values_list("pk", flat=True))
    Delivery.objects.filter(pk__in=ids[:delivered]).update(status="delivered")
    Delivery.objects.filter(pk__in=ids[delivered : delivered + failed]).update(status="failed")
    Delivery.objects.filter(pk__in=ids[delivered + failed :]).update(status="retrying")
    return hook


def test_webhook_health_is_graded_by_the_share_of_failures(alice):
    hook_with(alice, "quiet", 0, 0)
    hook_with(alice, "fine", 50, 0)
    hook_with(alice, "six-percent", 47, 3)  # 6 %
    hook_with(alice, "half", 5, 5)
    hook_with(alice, "waiting", 50, 0, retrying=1)
    # Failures older than the window count no more.
    old = hook_with(alice, "long-ago", 10, 10)
    Delivery.objects.filter(target__webhook=old).update(
        updated_at=timezone.now() - health.WINDOW - datetime.timedelta(minutes=1)
    )
    assert health.FAILING_SHARE > 0.06 >= health.DEGRADED_SHARE > 0
    client = client_for(alice)
    url = reverse("admin:deliveries_webhook_changelist")
    response = client.get(url)
    grades = {hook.name: hook.health_grade for hook in response.context["cl"].result_list}
    assert grades == {
        "quiet": health.HEALTHY,
        "fine": health.HEALTHY,
        "six-percent": health.DEGRADED,
        "half": health.FAILING,
        "waiting": health.DEGRADED,
        "long-ago": health.HEALTHY,
    }
    body = response.content.decode()
    assert "6.0 % of 50 deliveries failed" in body
    for grade in (health.HEALTHY, health.DEGRADED, health.FAILING):
        listed = client.get(f"{url}?health={grade}").context["cl"].result_list
        assert {hook.name for hook in listed} == {n for n, g in grades.items() if g == grade}


def test_the_webhook_list_reads_health_in_a_constant_number_of_queries(alice):
    hook_with(alice, "one", 5, 1)
    client = client_for(alice)
    url = reverse("admin:deliveries_webhook_changelist")
    with CaptureQueriesContext(connection) as few:
        client.get(url)
    for n in range(4):
        hook_with(alice, f"more-{n}", 5, n)
    with CaptureQueriesContext(connection) as many:
        client.get(url)
    assert len(many) == len(few)


# --- 9. The dashboard says when alerts had nowhere to go -----------------------------


def test_the_dashboard_warns_when_alerts_could_not_be_sent_for_lack_of_an_address(alice):
    hook, target, *_ = world(alice, "h")
    assert not alice.email and not hook.alert_url
    alert = raise_alert(target.pk, Alert.Kind.BREAKER, "breaker open for 10 minutes")
    assert alert.email.startswith("not sent")  # as recorded by the alert itself
    client = client_for(alice)
    body = client.get(reverse("admin:index")).content.decode()
    tags = Tags(body)
    [_warning] = tags.find("div", id="wh-alerts-nowhere")
    assert "could not be sent" in body and "no email address" in body
    assert tags.find("a", href=reverse("admin:deliveries_webhook_change", args=[hook.pk]))
    # The live refresh carries it too.
    assert "wh-alerts-nowhere" in client.get(reverse("dashboard_live")).content.decode()


def test_the_warning_links_a_superuser_to_the_owners_account(alice, superuser):
    _, target, *_ = world(alice, "h")
    raise_alert(target.pk, Alert.Kind.BREAKER, "breaker open for 10 minutes")
    body = client_for(superuser).get(reverse("admin:index")).content.decode()
    assert Tags(body).find("a", href=reverse("admin:auth_user_change", args=[alice.pk]))


def test_no_warning_once_the_alerts_have_somewhere_to_go(alice):
    _hook, target, *_ = world(alice, "h")
    raise_alert(target.pk, Alert.Kind.BREAKER, "breaker open for 10 minutes")
    alice.email = "alice@example.com"
    alice.save()
    body = client_for(alice).get(reverse("admin:index")).content.decode()
    assert "wh-alerts-nowhere" not in body


def test_search_in_is_chosen_beside_the_search_box_not_in_the_filters(alice):
    world(alice, "h")
    page = client_for(alice).get(
        reverse("admin:deliveries_event_changelist"), {"search_in": "payload", "q": "ok"}
    )
    assert page.status_code == 200
    text = page.content.decode()
    form = text[text.index('id="changelist-search"') :]
    form = form[: form.index("</form>")]
    # One form: the box and what it searches, the choice kept.
    assert 'name="q"' in form and 'name="search_in"' in form
    assert re.search(r'<option value="payload"\s+selected', form)
    # No longer a filter of the drawer.
    assert all(spec.title != "search in" for spec in page.context["cl"].filter_specs)
    assert page.context["cl"].result_count is not None

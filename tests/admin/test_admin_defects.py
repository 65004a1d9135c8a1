"""The admin defects of the console issue, each pinned by a test that failed before
its fix."""

import io

import pytest
from django.core.management import call_command
from django.templatetags.static import static
from django.urls import reverse
from unfold.widgets import INPUT_CLASSES

from deliveries.admin.base import STATUS_COLOURS, CappedCountPaginator, status_badge
from deliveries.admin.events import OUTCOME_ORDER
from deliveries.models import Delivery, Event, Target
from tests.support.admin import Tags, client_for, inline_data, target_form_data, world
from tests.support.engines import store

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("model", ["event", "delivery"])
def test_show_counts_in_the_filter_sidebar_answers(alice, model):
    world(alice, "h")
    url = reverse(f"admin:deliveries_{model}_changelist")
    response = client_for(alice).get(f"{url}?_facets=1")
    assert response.status_code == 200


def failed_deliveries(hook_world, n):
    _, target, *_ = hook_world
    events = store(target.webhook.entrypoints.get(), n=n)
    Delivery.objects.filter(event__in=events).update(status="failed", attempts=1)
    return events


def test_select_all_confirms_the_exact_number_and_acts_on_that_set(alice, monkeypatch):
    monkeypatch.setattr(CappedCountPaginator, "CAP", 3)
    hook_world = world(alice, "h")  # one failed delivery
    failed_deliveries(hook_world, 4)  # five in all, more than the capped count
    client = client_for(alice)
    url = reverse("admin:deliveries_delivery_changelist")
    listed = client.get(url).content.decode()
    assert "3+" in listed or "more than 3" in listed
    response = client.post(
        url, {"action": "redeliver", "select_across": "1", "_selected_action": ["1"], "index": "0"}
    )
    assert response.status_code == 200  # asks first
    page = response.content.decode()
    assert "5 deliveries" in page
    assert Delivery.objects.filter(status="pending").count() == 0
    # One more arrives while the page is open: it is not part of what was confirmed.
    failed_deliveries(hook_world, 1)
    data = {key: response.context["hidden"][key] for key in response.context["hidden"]}
    response = client.post(url, {**data, "confirm": "1"})
    assert response.status_code == 302
    assert Delivery.objects.filter(status="pending").count() == 5
    assert Delivery.objects.filter(status="failed").count() == 1


def test_selected_rows_are_confirmed_with_their_number(alice):
    hook_world = world(alice, "h")
    failed_deliveries(hook_world, 2)
    client = client_for(alice)
    url = reverse("admin:deliveries_delivery_changelist")
    ids = list(Delivery.objects.values_list("pk", flat=True)[:2])
    response = client.post(url, {"action": "redeliver", "_selected_action": ids, "index": "0"})
    assert response.status_code == 200
    assert "2 deliveries" in response.content.decode()
    response = client.post(url, {**response.context["hidden"], "confirm": "1"})
    assert response.status_code == 302
    assert sorted(Delivery.objects.filter(status="pending").values_list("pk", flat=True)) == sorted(
        ids
    )


def test_a_lone_surrogate_in_a_json_body_is_shown(alice):
    hook, *_ = world(alice, "h")
    [event] = store(hook.entrypoints.get(), body=b'{"bad": "\\ud800", "ok": "caf\\u00e9"}')
    response = client_for(alice).get(reverse("admin:deliveries_event_change", args=[event.pk]))
    assert response.status_code == 200
    body = response.content.decode()
    assert "\\ud800" in body and "café" in body


def test_a_valid_url_gets_no_false_error_when_another_field_is_invalid(alice):
    response = client_for(alice).post(
        reverse("admin:deliveries_webhook_add"), inline_data(max_retries="lots")
    )
    assert response.status_code == 200
    inlines = {f.formset.prefix: f.formset for f in response.context["inline_admin_formsets"]}
    form = inlines["targets"].forms[0]
    assert "max_retries" in form.errors
    assert "url" not in form.errors
    assert not form.non_field_errors()


def test_a_url_without_scheme_asks_for_one(alice):
    response = client_for(alice).post(
        reverse("admin:deliveries_webhook_add"), inline_data(url="example.com/hook")
    )
    assert response.status_code == 200
    inlines = {f.formset.prefix: f.formset for f in response.context["inline_admin_formsets"]}
    assert "http:// or https://" in " ".join(inlines["targets"].forms[0].errors["url"])
    assert not Target.objects.exists()


def test_a_single_label_host_is_accepted_when_its_network_is(alice, dns, settings):
    dns["receiver"] = ["10.1.2.3"]
    response = client_for(alice).post(
        reverse("admin:deliveries_webhook_add"), inline_data(url="http://receiver:8000/")
    )
    inlines = {f.formset.prefix: f.formset for f in response.context["inline_admin_formsets"]}
    # Refused: 10/8 is private and not allowed here...
    assert "private" in " ".join(inlines["targets"].forms[0].errors["url"]).lower()
    settings.WEBHOOKER_ALLOWED_TARGET_NETWORKS = ["10.0.0.0/8"]
    response = client_for(alice).post(
        reverse("admin:deliveries_webhook_add"), inline_data(url="http://receiver:8000/")
    )
    assert response.status_code == 302  # ...and accepted once it is.
    assert Target.objects.get().config["url"] == "http://receiver:8000/"


def test_utf8_header_values_are_shown_as_sent(alice):
    hook, *_ = world(alice, "h")
    # What WSGI (and ASGI) hand over: the header's bytes decoded as Latin-1.
    as_received = "café ☕".encode().decode("latin-1")
    [event] = store(hook.entrypoints.get(), headers=[["X-Name", as_received]])
    body = (
        client_for(alice)
        .get(reverse("admin:deliveries_event_change", args=[event.pk]))
        .content.decode()
    )
    assert "café ☕" in body
    assert Event.objects.get(pk=event.pk).headers == [["X-Name", as_received]]  # kept as is


def test_target_header_values_are_masked_and_kept_on_save(alice):
    client = client_for(alice)
    response = client.post(
        reverse("admin:deliveries_webhook_add"), inline_data(headers="X-Token: s3cret-value")
    )
    assert response.status_code == 302
    target = Target.objects.get()
    page = client.get(reverse("admin:deliveries_target_change", args=[target.pk]))
    assert "s3cret-value" not in page.content.decode()
    hook_page = client.get(reverse("admin:deliveries_webhook_change", args=[target.webhook_id]))
    assert "s3cret-value" not in hook_page.content.decode()
    # Saved back unchanged, the masked value keeps the secret; a new value replaces it.
    form = page.context["adminform"].form
    shown = form["headers"].value()
    data = target_form_data(
        "https://example.com/hook",
        headers=form.fields["headers"].prepare_value(shown) + "\nX-New: 2",
    )
    url = reverse("admin:deliveries_target_change", args=[target.pk])
    assert client.post(url, data).status_code == 302
    target.refresh_from_db()
    assert target.config["headers"] == {"X-Token": "s3cret-value", "X-New": "2"}


def test_ensureadmin_prints_the_bound_address(monkeypatch, db):
    monkeypatch.setenv("WEBHOOKER_BIND", "0.0.0.0:9123")
    out = io.StringIO()
    call_command("ensureadmin", stdout=out)
    assert ":9123/admin/" in out.getvalue()
    assert ":8080" not in out.getvalue()


def test_the_webhook_page_has_no_view_on_site_link_to_a_post_only_url(alice):
    hook, *_ = world(alice, "h")
    page = client_for(alice).get(reverse("admin:deliveries_webhook_change", args=[hook.pk]))
    body = page.content.decode()
    code = str(hook.entrypoints.get().code)
    assert f'href="/webhook/{code}"' not in body
    assert "/r/" not in body  # the admin's view-on-site redirect


def test_logging_in_on_the_login_page_itself_lands_on_the_dashboard(alice):
    from django.test import Client

    response = Client().post(
        reverse("admin:login"), {"username": "alice", "password": "pw-alice-12345!"}
    )
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:index")


def test_the_alert_url_needs_its_scheme_too(alice):
    data = inline_data()
    data["alert_url"] = "hooks.slack.com/services/x"
    response = client_for(alice).post(reverse("admin:deliveries_webhook_add"), data)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors["alert_url"]
    assert "http:// or https://" in " ".join(errors)


@pytest.mark.parametrize(("action", "field"), [("pause", "reason"), ("redeliver_failed", "since")])
def test_the_question_of_a_target_action_is_a_styled_admin_page(alice, action, field):
    """Pause and Redeliver failed since asked on a page of their own, unstyled: a
    borderless input, the buttons bare words, and "gettext is not defined" from
    the admin's scripts, for the page left out the admin's JavaScript catalog."""
    _, target, *_ = world(alice, "h")
    url = reverse("admin:deliveries_target_changelist")
    response = client_for(alice).post(url, {"action": action, "_selected_action": [target.pk]})
    assert response.status_code == 200
    tags = Tags(response.content.decode())
    [answer] = tags.find("input", name=field)
    assert set(INPUT_CLASSES) <= set(answer["class"].split())  # unfold's styled input
    scripts = [attrs.get("src") for tag, attrs in tags.tags if tag == "script"]
    assert scripts.index(reverse("admin:jsi18n")) < scripts.index(static("admin/js/core.js"))
    assert tags.find("button", type="submit", **{"class": "wh-button wh-button-primary"})
    assert tags.find("a", href=url, **{"class": "wh-button"})  # Cancel
    # The same page, the same template, as a bulk action's confirmation.
    assert "admin/deliveries/confirm_action.html" in [t.name for t in response.templates]


def test_a_bulk_actions_confirmation_loads_the_admins_javascript_catalog(alice):
    *_, delivery = world(alice, "h")
    url = reverse("admin:deliveries_delivery_changelist")
    response = client_for(alice).post(
        url, {"action": "redeliver", "index": "0", "_selected_action": [delivery.pk]}
    )
    assert response.status_code == 200
    assert Tags(response.content.decode()).find("script", src=reverse("admin:jsi18n"))
    assert 'class="wh-button wh-button-primary">Redeliver selected deliveries: 1 deliveries<' in (
        response.content.decode()
    )


def test_every_delivery_status_has_its_colour_and_place():
    """A status the model gains must be given a colour (and a place among an
    event's outcomes), not shown as a grey badge or not at all."""
    assert set(STATUS_COLOURS) == set(Delivery.Status)
    assert len(set(STATUS_COLOURS.values())) == len(Delivery.Status)
    assert sorted(OUTCOME_ORDER) == sorted(Delivery.Status)
    with pytest.raises(ValueError):
        status_badge("lost")

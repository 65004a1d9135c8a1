"""The audit log (issue 30): every create, change and delete of webhooks, entrypoints,
targets, API keys and users — through the API, the console or a command — with who,
from where, the API key and the request id, secrets masked; GET /api/v1/audit/ and
the console's list show each user their own; kept for AUDIT_RETENTION_DAYS."""

import datetime
import io
import json

import pytest
from auditlog.models import LogEntry
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from deliveries import audit
from deliveries.models import ApiKey, Target, Webhook
from tests.support.admin import client_for, target_form_data
from tests.support.api import client_with, key_for

pytestmark = pytest.mark.django_db

SECRET = "Bearer s3cr3t-audited-header"


def entries(client, **params):
    response = client.get("/api/v1/audit/", params)
    assert response.status_code == 200, response.content
    return response.json()["results"]


def test_every_change_through_the_api_is_recorded_with_who_how_and_where(alice):
    key = key_for(alice, name="terraform")
    api = client_with(key)
    hook = api.post("/api/v1/webhooks/", {"name": "orders"}, format="json").json()
    created = api.post(
        "/api/v1/targets/",
        {
            "webhook": hook["id"],
            "name": "shop",
            "config": {"url": "https://example.com/in", "headers": {"Authorization": SECRET}},
        },
        format="json",
    )
    target = created.json()["id"]
    changed = api.patch(
        f"/api/v1/targets/{target}/",
        {"config": {"url": "https://example.com/v2", "headers": {"Authorization": SECRET + "2"}}},
        format="json",
    )
    assert changed.status_code == 200
    api.post(f"/api/v1/targets/{target}/pause/", {"reason": "maintenance"}, format="json")
    api.post(f"/api/v1/targets/{target}/rotate-secret/", format="json")
    api.delete(f"/api/v1/targets/{target}/")

    rows = entries(api, object_type="target", object_id=target)
    assert [row["action"] for row in rows] == ["delete", "update", "update", "update", "create"]
    for row in rows:
        assert row["actor"] == "alice"
        assert row["api_key"] == str(ApiKey.objects.get(name="terraform"))
        assert row["remote_addr"] == "127.0.0.1"
        assert row["object_type"] == "target"
    assert rows[-1]["request_id"] == created["X-Request-Id"]
    assert rows[3]["request_id"] == changed["X-Request-Id"]
    # What changed, secrets masked: the URL shows, the header's value never does.
    change = rows[3]["changes"]["config"]
    assert "https://example.com/v2" in change[1]
    assert "paused" in rows[2]["changes"] and rows[2]["changes"]["paused"] == ["False", "True"]
    assert "signing_secret" in rows[1]["changes"]
    assert "s3cr3t" not in json.dumps(rows)
    assert not any("s3cr3t" in str(entry.changes) for entry in LogEntry.objects.all())


def test_each_user_reads_the_entries_about_their_own_objects_and_a_superuser_all(
    alice, bob, superuser
):
    Webhook.objects.create(name="alices", owner=alice)
    Webhook.objects.create(name="bobs", owner=bob)
    seen = {
        user.username: {
            row["object_repr"] for row in entries(client_with(key_for(user)), object_type="webhook")
        }
        for user in (alice, bob, superuser)
    }
    assert seen == {"alice": {"alices"}, "bob": {"bobs"}, "root": {"alices", "bobs"}}
    # Deleted, still theirs to read.
    Webhook.objects.filter(name="alices").delete()
    rows = entries(client_with(key_for(alice)), object_type="webhook", action="delete")
    assert [row["object_repr"] for row in rows] == ["alices"]


def test_the_console_and_commands_are_recorded_too(alice):
    hook = Webhook.objects.create(name="w", owner=alice)
    target = Target.objects.create(webhook=hook, name="t", config={"url": "https://example.com/in"})
    client = client_for(alice)
    data = target_form_data("https://example.com/v2", webhook=hook.pk, name="renamed")
    response = client.post(reverse("admin:deliveries_target_change", args=[target.pk]), data)
    assert response.status_code == 302
    entry = LogEntry.objects.get_for_model(Target).filter(action=LogEntry.Action.UPDATE).get()
    assert entry.actor == alice and entry.remote_addr == "127.0.0.1"
    call_command("createapikey", "alice", "--name", "ci", stdout=io.StringIO())
    made = LogEntry.objects.get_for_model(ApiKey).get()
    assert made.actor is None and "digest" in made.changes_dict
    assert made.changes_dict["digest"][1] == "••••••••"
    # The console's list shows her entries, and narrows to one object's history.
    page = client.get(reverse("admin:auditlog_logentry_changelist")).content.decode()
    assert "renamed" in page
    history = client.get(
        reverse("admin:auditlog_logentry_changelist"),
        {"content_type": entry.content_type_id, "object_id": target.pk},
    )
    assert history.status_code == 200
    shown = history.context["cl"].result_list
    assert [e.action for e in shown] == [LogEntry.Action.UPDATE, LogEntry.Action.CREATE]
    assert {e.object_id for e in shown} == {target.pk}


def test_the_list_refuses_unknown_parameters(alice):
    response = client_with(key_for(alice)).get("/api/v1/audit/", {"objct_type": "target"})
    assert response.status_code == 400
    assert "objct_type" in response.content.decode()


def test_entries_are_kept_for_the_retention_period(alice, settings):
    settings.AUDIT_RETENTION_DAYS = 30
    Webhook.objects.create(name="old", owner=alice)
    Webhook.objects.create(name="new", owner=alice)
    LogEntry.objects.exclude(object_repr="new").update(
        timestamp=timezone.now() - datetime.timedelta(days=31)
    )
    assert audit.prune() == 2  # the webhook's, and alice's own
    assert list(LogEntry.objects.get_for_model(Webhook).values_list("object_repr", flat=True)) == [
        "new"
    ]


def test_an_objects_page_links_to_its_history(alice, bob):
    hook = Webhook.objects.create(name="w", owner=alice)
    target = Target.objects.create(webhook=hook, name="t", config={"url": "https://example.com/in"})
    page = client_for(alice).get(reverse("admin:deliveries_target_change", args=[target.pk]))
    history = reverse("admin:deliveries_target_history", args=[target.pk])
    assert history in page.content.decode()
    response = client_for(alice).get(history, follow=True)
    assert [e.object_id for e in response.context["cl"].result_list] == [target.pk]
    # Another user's object's history is no more there than the object.
    assert client_for(bob).get(history).status_code == 404

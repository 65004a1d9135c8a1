"""Stored secrets stay where they were given (issue 29, found by review): each case
was a failing test first. A masked value never follows a changed destination, a
token sent to the API is never opened, nothing masked reaches the audit log or an
attempt's record, unreadable values survive saves, a target's own proxy is
connected to at the address the guard vetted."""

import datetime
import http.server
import json
import time

import pytest
import trustme
from auditlog.models import LogEntry
from django.urls import reverse

from deliveries.models import DeliveryResult, Target, Webhook
from deliveries.targets import egress
from tests.support.admin import client_for, target_form_data
from tests.support.api import client_of
from tests.support.database import raw
from tests.support.egress import client_pems, receiver, run
from tests.support.engines import attempt_one
from tests.support.keys import KEY_A, KEY_B
from webhooker import encryption

pytestmark = pytest.mark.django_db

ALERT = "https://hooks.slack.com/services/T/B/s3cr3t-alert"


def test_the_audit_log_masks_every_egress_secret(user, keys):
    hook = Webhook.objects.create(name="w", owner=user)
    Target.objects.create(
        webhook=hook,
        name="t",
        config={
            "url": "https://example.com/in",
            "basic_username": "u",
            "basic_password": "s3cr3t-basic",
            "proxy": "http://ops:s3cr3t-proxy@proxy.example.com:3128",
            "oauth_client_secret": "s3cr3t-oauth",
            "tls_client_key": "-----BEGIN PRIVATE KEY-----\ns3cr3tKEY\n-----END PRIVATE KEY-----",
        },
    )
    text = json.dumps([entry.changes for entry in LogEntry.objects.all()])
    assert "s3cr3t" not in text


def test_a_secret_in_the_audit_log_is_masked_without_being_parsed():
    """A secret may begin like a number run into a keyword ("5jor…", "3if…"):
    masking it must not run it through Python's parser, which warned on stderr
    ("invalid imaginary literal") for such secrets."""
    import warnings

    from deliveries import audit

    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        for secret in ("5jorQx9Wm2sKp0", "3ifAb", "0xfor1"):
            assert audit.mask(secret) == audit.MASK
    assert [str(w.message) for w in warned] == []
    config = {"url": "https://example.com/in", "basic_password": "s3cr3t"}
    assert "s3cr3t" not in audit.mask(repr(config))


def test_a_masked_header_does_not_follow_a_new_host(user, keys):
    hook = Webhook.objects.create(name="w", owner=user)
    target = Target.objects.create(
        webhook=hook,
        name="t",
        config={"url": "https://example.com/in", "headers": {"Authorization": "Bearer s3cr3t"}},
    )
    api = client_of(user)
    shown = api.get(f"/api/v1/targets/{target.pk}/").json()["config"]
    shown["url"] = "https://hooks.example.com/attacker"
    answer = api.patch(f"/api/v1/targets/{target.pk}/", {"config": shown}, format="json")
    assert answer.status_code == 400
    assert "type the secrets again" in answer.json()["fields"]["config"][0]
    target.refresh_from_db()
    assert target.config["url"] == "https://example.com/in"
    # With the secret typed again, the new host is fine.
    shown["headers"]["Authorization"] = "Bearer other"
    assert (
        api.patch(f"/api/v1/targets/{target.pk}/", {"config": shown}, format="json").status_code
        == 200
    )


def test_a_masked_client_secret_does_not_follow_a_new_token_url(user, keys):
    hook = Webhook.objects.create(name="w", owner=user)
    target = Target.objects.create(
        webhook=hook,
        name="t",
        config={
            "url": "https://example.com/in",
            "oauth_token_url": "https://example.com/token",
            "oauth_client_id": "id",
            "oauth_client_secret": "s3cr3t-oauth",
        },
    )
    api = client_of(user)
    shown = api.get(f"/api/v1/targets/{target.pk}/").json()["config"]
    shown["oauth_token_url"] = "https://hooks.example.com/steal"
    answer = api.patch(f"/api/v1/targets/{target.pk}/", {"config": shown}, format="json")
    assert answer.status_code == 400
    target.refresh_from_db()
    assert target.config["oauth_token_url"] == "https://example.com/token"


def test_the_console_keeps_a_masked_header_only_for_the_same_host(alice, keys):
    hook = Webhook.objects.create(name="w", owner=alice)
    target = Target.objects.create(
        webhook=hook,
        name="t",
        config={"url": "https://example.com/in", "headers": {"Authorization": "Bearer s3cr3t"}},
    )
    page = reverse("admin:deliveries_target_change", args=[target.pk])
    data = target_form_data("https://hooks.example.com/x", headers="Authorization: ••••••••")
    data["webhook"] = hook.pk
    answer = client_for(alice).post(page, data)
    assert answer.status_code == 200
    assert "type the secrets again" in str(answer.context["adminform"].form.errors)
    data["url"] = "https://example.com/in"
    assert client_for(alice).post(page, data).status_code == 302
    target.refresh_from_db()
    assert target.config["headers"] == {"Authorization": "Bearer s3cr3t"}


def test_an_attempts_record_shows_no_credentials_of_the_url(entrypoint, webhook, sink, keys):
    url = sink.url("/in").replace("http://", "http://user:s3cr3t-pw@")
    Target.objects.create(webhook=webhook, name="t", max_retries=0, config={"url": url})
    attempt_one(entrypoint)
    assert "s3cr3t" not in DeliveryResult.objects.get().request_url


def test_a_token_in_a_urls_user_name_is_masked(user, keys):
    hook = Webhook.objects.create(name="w", owner=user)
    target = Target.objects.create(
        webhook=hook, name="t", config={"url": "https://ghp_s3cr3t@example.com/in"}
    )
    shown = client_of(user).get(f"/api/v1/targets/{target.pk}/").json()["config"]
    assert shown["url"] == "https://••••••••@example.com/in"


def test_an_unreadable_alert_url_survives_a_console_save(alice, keys):
    hook = Webhook.objects.create(name="w", owner=alice, alert_url=ALERT)
    keys(KEY_B)
    page = reverse("admin:deliveries_webhook_change", args=[hook.pk])
    form = client_for(alice).get(page).context["adminform"].form
    data = {"name": "renamed", "description": "", "retention_days": "30"}
    data["alert_url"] = form["alert_url"].value() or ""
    for prefix in ("entrypoints", "targets"):
        data.update({f"{prefix}-TOTAL_FORMS": "0", f"{prefix}-INITIAL_FORMS": "0"})
    assert client_for(alice).post(page, data).status_code == 302
    keys(KEY_B, KEY_A)
    assert (Webhook.objects.get().name, Webhook.objects.get().alert_url) == ("renamed", ALERT)


def test_an_unreadable_alert_url_survives_an_api_put(user, keys):
    hook = Webhook.objects.create(name="w", owner=user, alert_url=ALERT)
    keys(KEY_B)
    api = client_of(user)
    shown = api.get(f"/api/v1/webhooks/{hook.pk}/").json()
    body = {k: shown[k] for k in ("description", "retention_days", "alert_url")}
    assert (
        api.put(f"/api/v1/webhooks/{hook.pk}/", {**body, "name": "x"}, format="json").status_code
        == 200
    )
    keys(KEY_B, KEY_A)
    assert Webhook.objects.get().alert_url == ALERT


def test_a_target_whose_config_is_unreadable_can_still_be_renamed(user, keys):
    hook = Webhook.objects.create(name="w", owner=user)
    target = Target.objects.create(webhook=hook, name="t", config={"url": "https://example.com/in"})
    keys(KEY_B)
    answer = client_of(user).patch(
        f"/api/v1/targets/{target.pk}/", {"name": "renamed"}, format="json"
    )
    assert answer.status_code == 200
    keys(KEY_B, KEY_A)
    assert Target.objects.get().config == {"url": "https://example.com/in"}


def test_a_targets_own_proxy_is_connected_to_where_the_guard_looked(
    entrypoint, webhook, proxy, settings, dns
):
    port, forwarded = proxy
    dns["proxy.example.com"] = ["93.184.215.14"]  # public when checked...
    settings.WEBHOOKER_ALLOWED_TARGET_NETWORKS = []
    target = Target(
        webhook=webhook,
        name="t",
        max_retries=0,
        config={"url": "http://example.com/in", "proxy": f"http://proxy.example.com:{port}"},
    )
    target.full_clean()
    target.save()
    # ...while the system resolver would say 127.0.0.1 ("localhost" rebinding):
    # webhooker connects to the vetted address, never asks again.
    attempt_one(entrypoint)
    assert forwarded == []
    assert not DeliveryResult.objects.get().success


def test_a_token_sent_to_the_api_is_never_opened(user, keys, django_user_model):
    victim = django_user_model.objects.create_user("victim", password="pw-victim-123!")
    theirs = Target.objects.create(
        webhook=Webhook.objects.create(name="v", owner=victim),
        name="vt",
        config={
            "url": "https://example.com/v",
            "headers": {"Authorization": "Bearer victim-s3cr3t"},
        },
    )
    hook = Webhook.objects.create(name="w", owner=user)
    api = client_of(user)
    for column in ("config", "signing_secret"):
        token = raw(Target, column, theirs.pk)  # what a leaked backup holds
        body = {"webhook": hook.pk, "name": "mine", "config": token}
        answer = api.post("/api/v1/targets/", body, format="json")
        assert answer.status_code == 400
    assert not Target.objects.filter(name="mine").exists()


def test_a_password_typed_again_is_kept_when_the_form_comes_back(alice, keys):
    hook = Webhook.objects.create(name="w", owner=alice)
    target = Target.objects.create(
        webhook=hook, name="t", config={"url": "https://u:OLDpw@example.com/in"}
    )
    client = client_for(alice)
    page = reverse("admin:deliveries_target_change", args=[target.pk])
    data = target_form_data("https://u:NEWpw@example.com/in", filters="not json")
    data["webhook"] = hook.pk
    answer = client.post(page, data)
    assert answer.status_code == 200  # the filters are refused...
    assert answer.context["adminform"].form["url"].value() == "https://u:NEWpw@example.com/in"
    data["filters"] = "[]"  # ...and sent again as it came back
    assert client.post(page, data).status_code == 302
    target.refresh_from_db()
    assert target.config["url"] == "https://u:NEWpw@example.com/in"


def test_an_expired_certificate_does_not_block_other_changes(user, keys):
    now = datetime.datetime.now(datetime.UTC)
    cert, key = client_pems(
        trustme.CA(),
        not_before=now - datetime.timedelta(days=10),
        not_after=now - datetime.timedelta(days=1),
    )
    hook = Webhook.objects.create(name="w", owner=user)
    target = Target.objects.create(
        webhook=hook,
        name="t",
        config={"url": "https://example.com/in", "tls_client_cert": cert, "tls_client_key": key},
    )
    answer = client_of(user).patch(
        f"/api/v1/targets/{target.pk}/", {"max_retries": 0}, format="json"
    )
    assert answer.status_code == 200


def test_a_token_answer_in_several_segments_is_read_whole(
    entrypoint, webhook, servers, monkeypatch
):
    monkeypatch.setattr(egress, "tokens", egress.Tokens())

    class Slow(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            body = json.dumps({"access_token": "x" * 3000, "expires_in": 3600}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[:100])
            self.wfile.flush()
            time.sleep(0.05)
            self.wfile.write(body[100:])

        def log_message(self, *args):
            pass

    token_server = servers(Slow)
    port, _ = receiver(servers)
    Target.objects.create(
        webhook=webhook,
        name="o",
        max_retries=0,
        config={
            "url": f"http://127.0.0.1:{port}/in",
            "oauth_token_url": f"http://127.0.0.1:{token_server.server_address[1]}/token",
            "oauth_client_id": "c",
            "oauth_client_secret": "s",
        },
    )
    run(entrypoint)
    result = DeliveryResult.objects.get()
    assert result.success, result.error


def test_unreadable_is_kept_by_keep_masked():
    stored = encryption.Unreadable("gAAAA-token")
    from deliveries.targets.base import keep_masked

    assert keep_masked("", "", stored) is stored

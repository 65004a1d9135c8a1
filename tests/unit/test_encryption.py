"""Secrets encrypted at rest (issue 29): target URLs, header values, Slack webhook
URLs, signing secrets, inbound verification secrets and alert URLs are Fernet tokens
in the database; rotation re-encrypts under the first key; a value no key opens
fails its deliveries in words and crashes nothing."""

import io
import json
import sqlite3
import subprocess
from contextlib import closing

import pytest
from cryptography.fernet import Fernet
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from django.urls import reverse

from deliveries.fields import encrypted_fields
from deliveries.models import Delivery, DeliveryResult, Entrypoint, Target, Webhook
from tests.support.admin import client_for
from tests.support.database import raw, sqlite_file_bytes
from tests.support.engines import pump, started_engine, store
from tests.support.keys import KEY_A, KEY_B
from webhooker import encryption

HEADER = "Bearer s3cr3t-header-value"
URL_PASSWORD = "s3cr3t-url-password"
SLACK = "https://hooks.slack.com/services/T000/B000/s3cr3t-slack-path"
INBOUND = "s3cr3t-inbound-secret"
ALERT = "https://hooks.slack.com/services/T1/B1/s3cr3t-alert-path"


def every_secret(user):
    """One of each kind of stored secret; their plain values."""
    hook = Webhook.objects.create(name="w", owner=user, alert_url=ALERT)
    Entrypoint.objects.create(
        webhook=hook, verification="github", verification_config={"secret": INBOUND}
    )
    http = Target.objects.create(
        webhook=hook,
        name="http",
        config={
            "url": f"https://user:{URL_PASSWORD}@example.com/in",
            "headers": {"Authorization": HEADER},
        },
    )
    Target.objects.create(webhook=hook, name="slack", type="slack", config={"webhook_url": SLACK})
    gated = {
        "url": "https://example.com/gated",
        "basic_password": "s3cr3t-basic",
        "oauth_client_secret": "s3cr3t-oauth",
        "tls_client_key": "-----BEGIN PRIVATE KEY-----\ns3cr3tKEYMATERIAL\n-----END PRIVATE…",
        "proxy": "http://ops:s3cr3t-proxy@proxy.example.com:3128",
    }
    Target.objects.create(webhook=hook, name="gated", config=gated)
    http.rotate_signing_secret()
    http.refresh_from_db()
    return [
        HEADER,
        URL_PASSWORD,
        SLACK,
        INBOUND,
        ALERT,
        http.signing_secret,
        http.previous_signing_secret,
    ]


@pytest.mark.django_db(transaction=True)
def test_no_secret_is_in_the_database_files_or_a_dump_of_its_tables(user, keys, tmp_path):
    secrets = every_secret(user)
    # Read back whole by the code that uses them.
    target = Target.objects.get(name="http")
    assert target.config["headers"]["Authorization"] == HEADER
    assert Webhook.objects.get().alert_url == ALERT
    assert Entrypoint.objects.get(verification="github").verification_config == {"secret": INBOUND}

    if connection.vendor == "sqlite":
        path = connection.settings_dict["NAME"]
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        stored = sqlite_file_bytes(path)
        with closing(sqlite3.connect(path)) as dumped:
            tables = dumped.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            dump = "\n".join(
                repr(row)
                for (table,) in tables.fetchall()
                for row in dumped.execute(f'SELECT * FROM "{table}"')
            )
    else:
        stored = b""
        settings_dict = connection.settings_dict
        dump = subprocess.run(
            [
                "pg_dump",
                "--data-only",
                "-h",
                settings_dict["HOST"] or "127.0.0.1",
                "-U",
                settings_dict["USER"],
                settings_dict["NAME"],
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    out = io.StringIO()
    call_command("dumpdata", "deliveries", stdout=out)
    for secret in secrets:
        assert secret.encode() not in stored
        assert secret not in dump
        assert secret not in out.getvalue()
    # A dump holds the tokens, which load back as the values.
    fixture = tmp_path / "dump.json"
    fixture.write_text(out.getvalue())
    Webhook.objects.all().delete()
    call_command("loaddata", str(fixture), stdout=io.StringIO())
    assert Target.objects.get(name="http").config["headers"]["Authorization"] == HEADER
    assert Webhook.objects.get().alert_url == ALERT


def test_a_value_is_encrypted_afresh_every_time_and_empty_stays_empty(user, keys):
    hook = Webhook.objects.create(name="w", owner=user)
    assert raw(Webhook, "alert_url", hook.pk) == ""
    first = raw(
        Target,
        "config",
        Target.objects.create(webhook=hook, name="a", config={"url": "https://a.example/"}).pk,
    )
    second = raw(
        Target,
        "config",
        Target.objects.create(webhook=hook, name="b", config={"url": "https://a.example/"}).pk,
    )
    assert encryption.is_token(first) and first != second
    # The dashboard's "alerts have nowhere to go" still finds webhooks without a URL.
    assert list(Webhook.objects.filter(alert_url="")) == [hook]


def test_rotation_moves_every_value_under_the_first_key_and_can_run_again(user, keys):
    secrets = every_secret(user)
    keys(KEY_B, KEY_A)  # a new key first; the old one still decrypts
    assert Target.objects.get(name="http").config["headers"]["Authorization"] == HEADER
    out = io.StringIO()
    call_command("rotatekeys", batch=1, stdout=out)
    assert (
        "deliveries.Target.config: 3 re-encrypted, 0 under the first key already" in out.getvalue()
    )
    for model, field in encrypted_fields():
        for pk in model.objects.values_list("pk", flat=True):
            token = raw(model, field.name, pk)
            assert not token or Fernet(KEY_B).decrypt(token.encode())
    out = io.StringIO()
    call_command("rotatekeys", stdout=out)  # run again: nothing left to do
    assert " 0 re-encrypted" in out.getvalue() and "cannot" not in out.getvalue()
    keys(KEY_B)  # the old key removed
    target = Target.objects.get(name="http")
    assert target.config["headers"]["Authorization"] == HEADER
    assert target.signing_secret in secrets


def test_a_value_no_key_opens_fails_its_deliveries_in_words_and_is_kept(
    entrypoint, make_target, sink, keys
):
    target = make_target(url=sink.url("/in"), max_retries=1)
    keys(KEY_B)  # the key that encrypted it is gone
    state = Target.objects.get(pk=target.pk)
    assert isinstance(state.config, encryption.UnreadableDict)
    engine = started_engine()
    store(entrypoint)
    pump(engine, lambda: Delivery.objects.filter(status="failed").exists())
    results = list(DeliveryResult.objects.values_list("error", "failure"))
    assert len(results) == 2  # tried again after a backoff, as any failure
    assert all("the target's configuration cannot be decrypted" in error for error, _ in results)
    assert {failure for _, failure in results} == {"config"}
    assert sink.requests() == []
    # Saved again for another reason, the row keeps the token: the key put back opens it.
    state.name = "renamed"
    state.save()
    keys(KEY_B, KEY_A)
    assert Target.objects.get(pk=target.pk).config == {"url": sink.url("/in")}


def test_rotation_names_what_it_cannot_decrypt(user, keys):
    every_secret(user)
    keys(KEY_B)
    with pytest.raises(CommandError, match="cannot be decrypted"):
        call_command("rotatekeys", stdout=io.StringIO())


def test_the_target_page_says_its_secrets_cannot_be_read(alice, keys):
    hook = Webhook.objects.create(name="w", owner=alice)
    target = Target.objects.create(webhook=hook, name="t", config={"url": "https://a.example/"})
    keys(KEY_B)
    page = client_for(alice).get(reverse("admin:deliveries_target_change", args=[target.pk]))
    assert page.status_code == 200
    assert "Its config cannot be decrypted" in page.content.decode()


def test_an_entrypoint_whose_secret_no_key_opens_answers_503_and_stores_nothing(user, keys):
    hook = Webhook.objects.create(name="w", owner=user)
    ep = Entrypoint.objects.create(
        webhook=hook, verification="github", verification_config={"secret": INBOUND}
    )
    keys(KEY_B)
    response = Client().post(f"/webhook/{ep.code}", b"{}", content_type="application/json")
    assert response.status_code == 503
    assert response["Retry-After"]
    assert not hook.events.exists()


@pytest.mark.django_db(transaction=True)
def test_the_migration_encrypts_what_was_stored_in_plain_text_and_back(user, keys):
    executor = MigrationExecutor(connection)
    before, after = (
        [("deliveries", "0019_event_resent_from")],
        [("deliveries", "0021_encrypt_stored_secrets")],
    )
    latest = executor.loader.graph.leaf_nodes("deliveries")
    executor.migrate(before)
    try:
        old = executor.loader.project_state(before).apps
        hook = old.get_model("deliveries", "Webhook").objects.create(
            name="w", owner_id=user.pk, alert_url=ALERT
        )
        target = old.get_model("deliveries", "Target").objects.create(
            webhook_id=hook.pk,
            name="t",
            config={"url": "https://a.example/", "headers": {"X-Key": HEADER}},
            signing_secret="whsec_plain",
        )
        executor = MigrationExecutor(connection)
        executor.migrate(after)
        assert encryption.is_token(raw(Target, "config", target.pk))
        assert encryption.is_token(raw(Webhook, "alert_url", hook.pk))
        assert HEADER not in raw(Target, "config", target.pk)
        new = (
            executor.loader.project_state(after)
            .apps.get_model("deliveries", "Target")
            .objects.get()
        )
        assert new.config["headers"]["X-Key"] == HEADER and new.signing_secret == "whsec_plain"
        executor = MigrationExecutor(connection)
        executor.migrate(before)
        assert raw(Webhook, "alert_url", hook.pk) == ALERT
        assert json.loads(raw(Target, "config", target.pk)) == {
            "url": "https://a.example/",
            "headers": {"X-Key": HEADER},
        }
    finally:
        MigrationExecutor(connection).migrate(latest)


def test_the_api_never_reads_back_a_saved_secret_and_a_masked_value_sent_back_keeps_it(user, keys):
    from tests.support.api import client_of

    every_secret(user)
    api = client_of(user)
    http = Target.objects.get(name="http")
    shown = api.get(f"/api/v1/targets/{http.pk}/").json()
    assert shown["config"] == {
        "url": "https://user:••••••••@example.com/in",
        "headers": {"Authorization": "••••••••"},
    }
    slack = api.get(f"/api/v1/targets/{Target.objects.get(name='slack').pk}/").json()
    assert slack["config"] == {"webhook_url": "https://hooks.slack.com/services/••••••••"}
    hook = api.get(f"/api/v1/webhooks/{Webhook.objects.get().pk}/").json()
    assert hook["alert_url"] == "https://hooks.slack.com/services/••••••••"
    # What was read, sent back with one header more: the secrets stay as stored.
    config = {**shown["config"], "headers": {**shown["config"]["headers"], "X-New": "v"}}
    assert (
        api.patch(f"/api/v1/targets/{http.pk}/", {"config": config}, format="json").status_code
        == 200
    )
    assert Target.objects.get(pk=http.pk).config == {
        "url": f"https://user:{URL_PASSWORD}@example.com/in",
        "headers": {"Authorization": HEADER, "X-New": "v"},
    }
    assert (
        api.patch(
            f"/api/v1/webhooks/{hook['id']}/",
            {"alert_url": hook["alert_url"], "name": "x"},
            format="json",
        ).status_code
        == 200
    )
    assert Webhook.objects.get().alert_url == ALERT
    # A new value replaces it.
    api.patch(
        f"/api/v1/targets/{http.pk}/", {"config": {"url": "https://example.com/new"}}, format="json"
    )
    assert Target.objects.get(pk=http.pk).config == {"url": "https://example.com/new"}


def test_the_console_shows_urls_with_their_secrets_masked_and_keeps_them_on_save(alice, keys):
    from tests.support.admin import target_form_data

    hook = Webhook.objects.create(name="w", owner=alice, alert_url=ALERT)
    target = Target.objects.create(
        webhook=hook, name="slack", type="slack", config={"webhook_url": SLACK}
    )
    client = client_for(alice)
    page = client.get(reverse("admin:deliveries_target_change", args=[target.pk])).content.decode()
    assert SLACK not in page and "https://hooks.slack.com/services/••••••••" in page
    page = client.get(reverse("admin:deliveries_webhook_change", args=[hook.pk])).content.decode()
    assert ALERT not in page
    data = target_form_data(
        "", type="slack", webhook_url="https://hooks.slack.com/services/••••••••", name="renamed"
    )
    data["webhook"] = hook.pk
    response = client.post(reverse("admin:deliveries_target_change", args=[target.pk]), data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    target.refresh_from_db()
    assert (target.name, target.config) == ("renamed", {"webhook_url": SLACK})

"""Login throttling, production settings, trusted proxies, health and retention."""

import datetime
import os
import sqlite3
import subprocess
import sys

import pytest
from axes.models import AccessAttempt
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import OperationalError
from django.test import Client
from django.utils import timezone

from deliveries.models import Delivery, DeliveryResult, EngineStatus, Event
from deliveries.retention import prune_events
from tests.support.engines import store
from tests.support.processes import ROOT
from webhooker.db.sqlite import library

pytestmark = pytest.mark.django_db


# --- login throttling ------------------------------------------------------------


def login(client, password, addr="198.51.100.7"):
    return client.post(
        "/admin/login/?next=/admin/",
        {"username": "ops", "password": password},
        REMOTE_ADDR=addr,
    )


def test_sixth_bad_login_in_a_minute_gets_429_and_a_good_one_works_after():
    User.objects.create_superuser("ops", password="right-password-123!")
    client = Client()
    for _ in range(5):
        assert login(client, "wrong").status_code == 200  # the form again, with an error
    response = login(client, "wrong")
    assert response.status_code == 429
    assert "Too many failed logins" in response.content.decode()
    # Locked out: even the right password is refused while the window lasts.
    assert login(client, "right-password-123!").status_code == 429
    # Another address is not affected.
    assert login(Client(), "right-password-123!", addr="198.51.100.8").status_code == 302
    # The window passes (attempts age past the one-minute cool-off).
    AccessAttempt.objects.update(attempt_time=timezone.now() - datetime.timedelta(minutes=2))
    assert login(client, "right-password-123!").status_code == 302


def test_get_of_the_login_page_is_never_throttled():
    client = Client()
    for _ in range(8):
        login(client, "wrong")
    assert client.get("/admin/login/", REMOTE_ADDR="198.51.100.7").status_code == 200


# --- production settings ------------------------------------------------------------

PROD = {
    "WEBHOOKER_ENVIRONMENT": "prod",
    "ALLOWED_HOSTS": "hooks.example.com",
    "SECRET_KEY": "p" * 30 + "Q7x!k2Zr9Lm4Vb8Nc1Xa5Sd3Fg6Hj0Kl",
}


def test_check_deploy_is_clean_in_production(tmp_path):
    # The check runs on SQLite, whatever this run's database.
    if library.has_wal_reset_bug(sqlite3.sqlite_version_info):
        pytest.skip("this platform's SQLite has the WAL-reset bug: check warns, and should")
    env = dict(os.environ, **PROD, DATA_DIR=str(tmp_path))
    env.pop("DATABASE_URL", None)
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_production_cookies_and_headers(tmp_path):
    code = (
        "import django; django.setup();"
        "from django.test import Client; from django.contrib.auth.models import User;"
        "from django.core.management import call_command; call_command('migrate', verbosity=0);"
        "User.objects.create_superuser('u', password='pw-123456789!');"
        "c = Client(); r = c.get('/admin/login/', secure=True, HTTP_HOST='hooks.example.com');"
        "csrf = r.cookies['csrftoken'];"
        "r = c.post('/admin/login/', {'username': 'u', 'password': 'pw-123456789!',"
        " 'csrfmiddlewaretoken': csrf.value}, secure=True, HTTP_HOST='hooks.example.com');"
        "s = r.cookies['sessionid'];"
        "print(bool(s['secure']), bool(s['httponly']),"
        " bool(csrf['secure']), bool(csrf['httponly']),"
        " r['Strict-Transport-Security'], r['X-Frame-Options'], r['X-Content-Type-Options'],"
        " r['Referrer-Policy'])"
    )
    env = dict(
        os.environ, **PROD, DATA_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="webhooker.settings"
    )
    env.pop("DATABASE_URL", None)
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "True",
        "True",
        "True",
        "True",
        "max-age=31536000;",
        "includeSubDomains;",
        "preload",
        "DENY",
        "nosniff",
        "same-origin",
    ]


# --- trusted proxies ---------------------------------------------------------------


def test_forwarded_for_is_ignored_from_untrusted_peers(client, entrypoint, settings):
    settings.WEBHOOKER_TRUSTED_PROXIES = ["10.0.0.5"]
    client.post(
        f"/webhook/{entrypoint.code}",
        b"{}",
        content_type="application/json",
        REMOTE_ADDR="203.0.113.9",
        HTTP_X_FORWARDED_FOR="198.51.100.1",
    )
    assert Event.objects.get().remote_addr == "203.0.113.9"


def test_forwarded_for_from_a_trusted_proxy_sets_the_source(client, entrypoint, settings):
    settings.WEBHOOKER_TRUSTED_PROXIES = ["10.0.0.0/24"]
    client.post(
        f"/webhook/{entrypoint.code}",
        b"{}",
        content_type="application/json",
        REMOTE_ADDR="10.0.0.5",
        HTTP_X_FORWARDED_FOR="6.6.6.6, 198.51.100.1, 10.0.0.9",
    )
    # Read from the right past trusted hops; the spoofable left part is not used.
    assert Event.objects.get().remote_addr == "198.51.100.1"


# --- health ------------------------------------------------------------------------


def test_health_is_503_without_an_engine_and_200_with_one(client):
    response = client.get("/.well-known/healthcheck")
    assert response.status_code == 503
    assert response.json()["database"] == "ok"
    assert response.json()["engine"]["running"] is False
    now = timezone.now()
    EngineStatus.objects.create(pid=77, started_at=now, heartbeat_at=now)
    response = client.get("/.well-known/healthcheck")
    assert response.status_code == 200
    assert response.json()["engine"]["pid"] == 77
    EngineStatus.objects.update(stopped_at=now)
    assert client.get("/.well-known/healthcheck").status_code == 503
    EngineStatus.objects.update(stopped_at=None, heartbeat_at=now - datetime.timedelta(minutes=3))
    assert client.get("/.well-known/healthcheck").status_code == 503


def test_health_is_503_when_the_database_is_unreachable(client, monkeypatch):
    from django.db.backends.base.base import BaseDatabaseWrapper

    def down(self, *args, **kwargs):
        raise OperationalError("connection refused")

    monkeypatch.setattr(BaseDatabaseWrapper, "cursor", down)
    response = client.get("/.well-known/healthcheck")
    assert response.status_code == 503
    assert response.json()["database"].startswith("unreachable")


# --- retention -------------------------------------------------------------------


def test_prune_removes_old_finished_events_and_keeps_the_rest(entrypoint, make_target, capsys):
    target = make_target(url="http://127.0.0.1:9/x")
    webhook = entrypoint.webhook
    webhook.retention_days = 7
    webhook.save()
    old_done, old_pending, young = store(entrypoint, n=3)
    long_ago = timezone.now() - datetime.timedelta(days=8)
    Event.objects.filter(pk__in=[old_done.pk, old_pending.pk]).update(received_at=long_ago)
    done = Delivery.objects.get(event=old_done)
    Delivery.objects.filter(pk=done.pk).update(status="delivered", attempts=1)
    DeliveryResult.objects.create(delivery=done, attempt=1, success=True, status_code=200)
    Delivery.objects.filter(event=old_pending).update(status="retrying", attempts=2)
    call_command("pruneevents", batch=1)
    assert "Pruned 1 events, 1 deliveries and 1 attempt results." in capsys.readouterr().out
    assert set(Event.objects.values_list("pk", flat=True)) == {old_pending.pk, young.pk}
    assert Delivery.objects.filter(target=target).count() == 2


def test_prune_is_per_webhook_and_in_batches(entrypoint, user):
    from deliveries.models import Webhook

    other = Webhook.objects.create(name="other", owner=user, retention_days=30)
    other.ensure_entrypoint()
    store(entrypoint, n=5)
    store(other.entrypoints.get(), n=2)
    Event.objects.update(received_at=timezone.now() - datetime.timedelta(days=10))
    entrypoint.webhook.retention_days = 7
    entrypoint.webhook.save()
    removed = prune_events(batch=2)
    assert removed["events"] == 5
    assert Event.objects.filter(webhook=other).count() == 2


def test_prune_survives_a_retention_longer_than_the_calendar(entrypoint):
    from deliveries.models import Webhook

    Webhook.objects.filter(pk=entrypoint.webhook_id).update(retention_days=10**7)
    store(entrypoint)
    assert prune_events()["events"] == 0
    assert Event.objects.count() == 1

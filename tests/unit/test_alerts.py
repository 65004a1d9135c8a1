"""Alerts to a webhook's owner: email, the Slack-compatible alert_url, one per hour."""

import datetime
import json

import pytest
from django.core import mail
from django.utils import timezone

from deliveries.alerts import raise_alert
from deliveries.models import Alert

pytestmark = pytest.mark.django_db


@pytest.fixture
def target(make_target, user):
    user.email = "owner@example.com"
    user.save()
    return make_target("log", name="ci")


def test_an_alert_is_recorded_emailed_and_posted(target, sink, settings):
    settings.WEBHOOKER_PUBLIC_URL = "https://hooks.example.com"
    target.webhook.alert_url = sink.url("/alerts")
    target.webhook.save()
    alert = raise_alert(target.pk, Alert.Kind.PAUSED, "answered 410 Gone: paused")
    assert alert is not None
    assert Alert.objects.get() == alert
    assert (alert.kind, alert.message) == ("paused", "answered 410 Gone: paused")
    assert (alert.email, alert.slack) == ("sent", "sent")
    assert Alert.objects.values_list("email", "slack").get() == ("sent", "sent")

    [message] = mail.outbox
    assert message.to == ["owner@example.com"]
    assert message.from_email == settings.DEFAULT_FROM_EMAIL
    assert message.subject == "webhooker: orders → ci: Target paused itself"
    assert "answered 410 Gone: paused" in message.body
    assert f"https://hooks.example.com/admin/deliveries/target/{target.pk}/change/" in message.body

    [posted] = sink.requests("/alerts")
    text = json.loads(posted.body)["text"]
    assert "orders → ci" in text and "answered 410 Gone: paused" in text


def test_one_alert_of_each_kind_per_target_per_hour(target, make_target):
    assert raise_alert(target.pk, Alert.Kind.BREAKER, "breaker open for 10 min") is not None
    assert raise_alert(target.pk, Alert.Kind.BREAKER, "breaker open for 20 min") is None
    # Another kind is news: a reminder or a breaker never silences a pause.
    assert raise_alert(target.pk, Alert.Kind.PAUSED, "paused") is not None
    assert len(mail.outbox) == 2
    # Another target of the same owner is not held back by this one's alerts.
    other = make_target("log", name="other")
    assert raise_alert(other.pk, Alert.Kind.BREAKER, "open") is not None
    # An hour later the first target may alert again.
    Alert.objects.filter(target=target).update(
        created_at=timezone.now() - datetime.timedelta(seconds=Alert.INTERVAL + 1)
    )
    assert raise_alert(target.pk, Alert.Kind.BREAKER, "still open") is not None
    assert Alert.objects.filter(target=target).count() == 3
    assert len(mail.outbox) == 4


def test_an_owner_without_email_and_a_failing_alert_url_are_recorded(make_target, sink, user):
    target = make_target("log")
    sink.always("/down", 500)
    target.webhook.alert_url = sink.url("/down")
    target.webhook.save()
    alert = raise_alert(target.pk, Alert.Kind.PAUSED, "paused")
    assert alert.email == "not sent: owner has no email address"
    assert alert.slack == "failed: HTTP 500"
    assert not mail.outbox
    assert Alert.objects.get().slack == "failed: HTTP 500"


def test_alert_url_is_refused_for_private_addresses_when_sending(target, settings):
    settings.WEBHOOKER_ALLOWED_TARGET_NETWORKS = []
    target.webhook.alert_url = "http://127.0.0.1:9/alerts"  # saved before the rule changed
    target.webhook.save()
    alert = raise_alert(target.pk, Alert.Kind.PAUSED, "paused")
    assert alert.slack.startswith("failed: blocked")
    assert alert.email == "sent"


def test_email_failure_never_raises(target, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", 9, 2
    alert = raise_alert(target.pk, Alert.Kind.PAUSED, "paused")
    assert alert.email.startswith("failed: ")
    assert Alert.objects.get().email == alert.email


def test_a_deleted_target_raises_nothing(target):
    pk = target.pk
    target.delete()
    assert raise_alert(pk, Alert.Kind.PAUSED, "paused") is None
    assert not Alert.objects.exists()

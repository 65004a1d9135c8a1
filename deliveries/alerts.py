"""Alerts: telling a webhook's owner that one of its targets needs attention.

The engine calls raise_alert() when a target pauses itself (410 Gone, failing for
DELIVERY_DISABLE_AFTER, an ordered delivery that finally failed) and when a
breaker stays open past ALERT_BREAKER_AFTER. It does so from a thread of its own,
never a delivery worker's: mail servers and Slack can take seconds to answer.

Each alert goes by email to the owner and, if the webhook has one, to its
Slack-compatible alert_url; how each channel went is recorded on the Alert row,
which the admin lists. At most one alert of each kind per target per
Alert.INTERVAL: a target that flaps must not flood its owner.
"""

import datetime
import json
import logging

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from deliveries.models import Alert, Target
from deliveries.targets import transport

log = logging.getLogger(__name__)

# Alert.email / Alert.slack hold at most this much of an error.
RESULT_LIMIT = 500
SENT = "sent"


def raise_alert(target_id: int, kind: str, message: str) -> Alert | None:
    """Record an alert about the target and send it; None when the target had one
    within Alert.INTERVAL or no longer exists. Never raises: a channel that fails
    is recorded on the row and logged."""
    try:
        alert = _record(target_id, kind, message)
        if alert is not None:
            _send(alert)
    except Exception:
        log.exception("alert for target %s: %s", target_id, message)
        return None
    return alert


def _send(alert: Alert) -> None:
    target = alert.target
    subject = f"webhooker: {target.webhook.name} → {target.name}: {alert.get_kind_display()}"
    text = alert.message
    if settings.WEBHOOKER_PUBLIC_URL:
        path = reverse("admin:deliveries_target_change", args=[target.pk])
        text += f"\n\n{settings.WEBHOOKER_PUBLIC_URL}{path}"
    # Each channel catches its own errors: one that fails does not stop the other.
    alert.email = _send_email(target.webhook.owner, subject, text)
    alert.slack = _post_slack(target.webhook.alert_url, f"*{subject}*\n{text}")
    Alert.objects.filter(pk=alert.pk).update(email=alert.email, slack=alert.slack)
    log.info(
        "alert %s for target %s: email %s, slack %s",
        alert.pk,
        target.pk,
        alert.email,
        alert.slack or "not configured",
    )


def _record(target_id: int, kind: str, message: str) -> Alert | None:
    now = timezone.now()
    # Locking the target row serialises two callers for one target (two engines,
    # or a breaker alert racing a pause): the second sees the first's alert and
    # sends nothing. SQLite has one writer at a time anyway.
    with transaction.atomic():
        target = (
            Target.objects.select_for_update(of=("self",))
            .select_related("webhook__owner")
            .filter(pk=target_id)
            .first()
        )
        if target is None:
            return None
        recent = now - datetime.timedelta(seconds=Alert.INTERVAL)
        # One of each kind: a certificate reminder never silences a pause.
        if target.alerts.filter(created_at__gt=recent, kind=kind).exists():
            log.info(
                "alert for target %s suppressed (one of a kind per %s s): %s",
                target_id,
                Alert.INTERVAL,
                message,
            )
            return None
        return Alert.objects.create(target=target, kind=kind, message=message, created_at=now)


def _send_email(owner, subject: str, text: str) -> str:
    if not owner.email:
        return f"not sent: {owner.get_username()} has no email address"
    try:
        send_mail(subject, text, settings.DEFAULT_FROM_EMAIL, [owner.email])
    except Exception as exc:  # SMTP errors, refused connections, bad addresses
        log.warning("alert email to %s failed: %s", owner.email, exc)
        return f"failed: {exc}"[:RESULT_LIMIT]
    return SENT


def _post_slack(url: str, text: str) -> str:
    if not url:
        return ""
    try:
        # The transport refuses private addresses on every connection, as it does
        # for targets: the owner chooses this URL.
        outcome = transport.post(
            url,
            data=json.dumps({"text": text}).encode(),
            headers={"Content-Type": "application/json"},
            timeout=None,
        )
    except Exception as exc:
        log.warning("alert to %s failed: %s", url, exc)
        return f"failed: {exc}"[:RESULT_LIMIT]
    if outcome.success:
        return SENT
    log.warning("alert to %s failed: %s", url, outcome.error)
    return f"failed: {outcome.error}"[:RESULT_LIMIT]

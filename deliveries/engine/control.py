"""What the engine decides about a target from its attempts' results.

* failing_since: when the target's current run of failed attempts began,
  written on transitions only (first failure, first success after failures).
* Auto-disable: a target that answers 410 Gone, or has failed every attempt for
  DELIVERY_DISABLE_AFTER, is paused with the reason.
* An ordered target whose head delivery failed for good is paused, so nothing
  after it is delivered out of order.
* Alerts: a target that paused itself, or whose breaker stayed open longer than
  ALERT_BREAKER_AFTER, gets an alert (deliveries/alerts.py, at most one per
  target per hour). Alerts are sent from a thread of their own (`send_alerts`),
  never from a worker or the result writer: mail and chat can be slow.
"""

import datetime
import logging
import queue

from django.utils import timezone

from deliveries.alerts import raise_alert
from deliveries.models import Alert, Delivery, Target
from deliveries.targets import egress
from deliveries.targets.base import whose_fault

logger = logging.getLogger("deliveries.engine")


class TargetControl:
    def __init__(self, *, targets, disable_after: float, alert_breaker_after: float):
        self.targets = targets  # targets.Targets
        self.disable_after = datetime.timedelta(seconds=disable_after)
        self.alert_breaker_after = alert_breaker_after
        self._alerts = queue.SimpleQueue()
        # target id -> clock time of its last breaker alert: one check a heartbeat
        # must not ask the database each time (raise_alert keeps the hourly limit).
        self._breaker_alerted: dict[int, float] = {}
        # target id -> the class of its last failed attempt (targets.base.FAILURES).
        self._last_failure: dict[int, str] = {}
        # When client certificates were last looked at, and each target's last
        # expiry alert (clock times).
        self._certificates_checked = float("-inf")
        self._certificate_alerted: dict[int, float] = {}

    def after(self, result) -> bool:
        """Take note of a committed result; True if it paused the target."""
        outcome, task = result.outcome, result.task
        if outcome is None:  # filtered: nothing was attempted
            return False
        state = task.target
        if outcome.success:
            if state.failing_since is not None:
                self._set_failing_since(state.id, None)
            return False
        self._last_failure[state.id] = outcome.failure
        now = timezone.now()
        since = state.failing_since
        if since is None:
            self._set_failing_since(state.id, now)
        reason = None
        if outcome.status_code == 410:
            reason = "the receiver answered 410 Gone"
        elif since is not None and now - since >= self.disable_after:
            reason = f"every attempt failed since {since:%Y-%m-%d %H:%M} UTC"
        elif state.ordered and result.status == Delivery.Status.FAILED:
            reason = f"ordered delivery: event {task.event_code} failed"
        if reason is None:
            return False
        return self.pause(state.id, reason)

    def pause(self, target_id: int, reason: str) -> bool:
        if not Target.objects.filter(id=target_id, paused=False).pause(reason):
            return False  # paused meanwhile, by someone else
        logger.warning("target %s paused: %s", target_id, reason)
        message = f"Target paused: {reason}. {self._last_words(target_id)}"
        self._alerts.put((target_id, Alert.Kind.PAUSED, message))
        return True

    def breakers_open(self, breakers, clock_now: float) -> None:
        """Alert about breakers open longer than ALERT_BREAKER_AFTER."""
        for target_id, breaker in breakers.items():
            since = breaker.open_since
            if since is None or clock_now - since < self.alert_breaker_after:
                continue
            last = self._breaker_alerted.get(target_id)
            if last is not None and clock_now - last < Alert.INTERVAL:
                continue
            self._breaker_alerted[target_id] = clock_now
            minutes = round((clock_now - since) / 60)
            message = (
                f"Deliveries to this target have failed for {minutes} min; its circuit "
                "breaker is open and only a probe is sent each cooldown. "
                + self._last_words(target_id)
            )
            self._alerts.put((target_id, Alert.Kind.BREAKER, message))

    # Client certificates are looked at this often; an expiring one is told about
    # once a day until it is replaced.
    CERTIFICATE_CHECK = 3600.0
    CERTIFICATE_REMINDER = 86_400.0

    def certificates_expiring(self, clock_now: float) -> None:
        """Alert about the client certificates of the targets this engine delivers
        to that expire within egress.EXPIRY_WARNING (or have expired)."""
        if clock_now - self._certificates_checked < self.CERTIFICATE_CHECK:
            return
        self._certificates_checked = clock_now
        for state in self.targets.rows():
            warning = egress.expiry_warning(state.config) if state.type == "http" else ""
            last = self._certificate_alerted.get(state.id)
            if not warning or (last is not None and clock_now - last < self.CERTIFICATE_REMINDER):
                continue
            self._certificate_alerted[state.id] = clock_now
            self._alerts.put((state.id, Alert.Kind.CERTIFICATE, warning))

    def send_alerts(self) -> int:
        """Send what was raised (each kind at most once per target per hour)."""
        sent = 0
        while True:
            try:
                target_id, kind, message = self._alerts.get_nowait()
            except queue.Empty:
                return sent
            if raise_alert(target_id, kind, message) is not None:
                sent += 1

    def _last_words(self, target_id: int) -> str:
        """Whose fault the target's last failed attempt was, as a sentence."""
        failure = self._last_failure.get(target_id)
        if not failure:
            return ""
        return f"The last attempt failed ({whose_fault(failure)})."

    def _set_failing_since(self, target_id: int, since) -> None:
        # update(), not save(): updated_at is the target's version and must not
        # move, or every engine would re-read the target after each failure run.
        Target.objects.filter(id=target_id).update(failing_since=since)
        self.targets.set_failing_since(target_id, since)

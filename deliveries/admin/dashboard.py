"""Figures for the admin index: the engines' heartbeats, the last 24 hours, and
alerts that reached nobody.

The page reloads its figures every few seconds from live() (admin.js replaces the
block in place), so every query here reads an index range of the last day or a
handful of rows: the page must stay fast on a history of millions.
"""

import datetime

from django.conf import settings
from django.db.models import Avg, CharField, Count, Q
from django.db.models.functions import Cast, Substr
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from deliveries import alerts as alerting
from deliveries.admin import health
from deliveries.models import Alert, Delivery, DeliveryResult, EngineStatus, Target
from deliveries.targets.base import FAULTS, failures_of

HOURS = 24


def failed_by_fault(deliveries, since) -> dict:
    """The day's failed deliveries, the receiver's fault and ours, counted apart: the
    failed rows of the day's index range only, each read for its class."""
    found = dict(
        deliveries.filter(updated_at__gte=since, status=Delivery.Status.FAILED)
        .values_list("failure")
        .annotate(n=Count("*"))
        .order_by()
    )
    return {fault: sum(found.get(name, 0) for name in failures_of(fault)) for fault in FAULTS}


def status_counts(deliveries, since):
    # One pass over delivery_updated_status_idx's range of the day, which holds
    # every column read. (A GROUP BY status would lead the planner to walk
    # delivery_status_idx, every delivery ever made, to save itself a sort.)
    return deliveries.filter(updated_at__gte=since).aggregate(
        **{status: Count("status", filter=Q(status=status)) for status in Delivery.Status.values}
    )


def hourly(deliveries, now):
    """Delivered and failed deliveries per hour, oldest first, as SVG bar geometry."""
    now = now.astimezone(datetime.UTC)
    start = (now - datetime.timedelta(hours=HOURS - 1)).replace(minute=0, second=0, microsecond=0)
    # Grouped by hour alone, on the day's range of delivery_updated_status_idx
    # (see status_counts()).
    rows = (
        deliveries.filter(updated_at__gte=start)
        # "YYYY-MM-DD HH" of the UTC time as stored (both databases talk UTC to
        # Django): native string functions, where TruncHour is a Python function
        # called per row on SQLite.
        .annotate(hour=Substr(Cast("updated_at", CharField()), 1, 13))
        .values("hour")
        .annotate(
            delivered=Count("status", filter=Q(status="delivered")),
            failed=Count("status", filter=Q(status="failed")),
        )
        .order_by()
    )
    buckets = {
        start + datetime.timedelta(hours=h): {"delivered": 0, "failed": 0} for h in range(HOURS)
    }
    for row in rows:
        hour = datetime.datetime.strptime(row["hour"], "%Y-%m-%d %H").replace(tzinfo=datetime.UTC)
        if hour in buckets:
            buckets[hour] = {"delivered": row["delivered"], "failed": row["failed"]}
    peak = nice_ceiling(max([b["delivered"] + b["failed"] for b in buckets.values()] + [1]))
    width, height, gap, left = 24, 120, 4, 40
    bars = []
    for i, (hour, b) in enumerate(sorted(buckets.items())):
        ok_h = round(height * b["delivered"] / peak)
        bad_h = round(height * b["failed"] / peak)
        x = left + i * (width + gap)
        bars.append(
            {
                "x": x,
                "hour": hour,
                "delivered": b["delivered"],
                "failed": b["failed"],
                "ok_y": height - ok_h,
                "ok_h": ok_h,
                "bad_y": height - ok_h - bad_h,
                "bad_h": bad_h,
                "label": i % 3 == 0,
            }
        )
    # Grid lines at whole numbers only.
    parts = 4 if peak % 4 == 0 else 2 if peak % 2 == 0 else 1
    ticks = [
        {"value": peak * n // parts, "y": height - height * n // parts} for n in range(parts + 1)
    ]
    return {
        "bars": bars,
        "peak": peak,
        "ticks": ticks,
        "left": left,
        "width": left + HOURS * (width + gap),
        "height": height,
        "bar_width": width,
    }


def nice_ceiling(value: int) -> int:
    """The y axis' top: 1, 2 or 5 times a power of ten, divisible by 4 where it can be."""
    scale = 1
    while True:
        for step in (1, 2, 4, 5, 8, 10):
            if step * scale >= value:
                return step * scale
        scale *= 10


def failing_targets(deliveries, targets, since, breakers, limit=5):
    """The targets with the most failed (24 h) and retrying deliveries, then those
    held by a pause or an open breaker, each with its breaker state."""
    # Two grouped queries, each on an index of its own, rather than one with an
    # OR that reads every delivery.
    failed = dict(
        deliveries.filter(updated_at__gte=since, status="failed")
        .values_list("target")
        .annotate(n=Count("*"))
        .order_by()
    )
    retrying = dict(
        deliveries.filter(status="retrying").values_list("target").annotate(n=Count("*")).order_by()
    )
    ranked = sorted(
        failed.keys() | retrying.keys(), key=lambda t: (-failed.get(t, 0), -retrying.get(t, 0))
    )
    rows = [
        {"target": t, "failed": failed.get(t, 0), "retrying": retrying.get(t, 0)}
        for t in ranked[:limit]
    ]
    ids = [r["target"] for r in rows]
    held = (
        targets.filter(Q(paused=True) | Q(pk__in=list(breakers)))
        .exclude(pk__in=ids)
        .values_list("pk", flat=True)[:limit]
    )
    rows += [{"target": pk, "failed": 0, "retrying": 0} for pk in held]
    # The ids come from `deliveries` and `targets`, limited to what the user may see.
    found = Target.objects.select_related("webhook").in_bulk([r["target"] for r in rows])
    return [
        {**row, "target": found[row["target"]], "breaker": breakers.get(row["target"])}
        for row in rows
        if row["target"] in found
    ]


def slowest_targets(targets, since, limit=5):
    """The targets whose attempts took longest on average over the window."""
    rows = (
        # The ids as a list: PostgreSQL turned a subquery into a scan of every
        # result; a list reads result_target_created_idx per target.
        DeliveryResult.objects.filter(
            target__in=list(targets.values_list("pk", flat=True)), created_at__gte=since
        )
        .values("target")
        .annotate(avg_ms=Avg("duration_ms"), attempts=Count("id"))
        .order_by("-avg_ms")[:limit]
    )
    rows = list(rows)
    found = Target.objects.select_related("webhook").in_bulk([r["target"] for r in rows])
    return [
        {**row, "avg_ms": round(row["avg_ms"]), "target": found[row["target"]]}
        for row in rows
        if row["target"] in found
    ]


def ago(seconds: float | None) -> str:
    """ "45 s", "12 min", "3 h", "2 days": never "0 minutes"."""
    if seconds is None:
        return "–"
    seconds = max(0, int(seconds))
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    if seconds < 36 * 3600:
        return f"{round(seconds / 3600)} h"
    return f"{round(seconds / 86400)} days"


def engines(now):
    """Every engine heard from in the last day, the live ones first, each with
    its state in words."""
    rows = list(
        EngineStatus.objects.exclude(heartbeat_at=None)
        .filter(heartbeat_at__gte=now - datetime.timedelta(days=1))
        .order_by("-heartbeat_at")[:20]
    )
    found = []
    for engine in rows:
        alive = engine.alive(now)
        age = engine.heartbeat_age(now)
        if alive:
            state = "running"
        elif engine.stopped_at:
            state = f"stopped {ago((now - engine.stopped_at).total_seconds())} ago"
        else:
            state = f"not responding for {ago(age)}"
        uptime = ago((now - engine.started_at).total_seconds()) if engine.started_at else "–"
        found.append(
            {"row": engine, "alive": alive, "state": state, "age": ago(age), "uptime": uptime}
        )
    found.sort(key=lambda e: not e["alive"])
    return found


# How far back the dashboard looks for alerts that reached nobody.
UNSENT_WINDOW = datetime.timedelta(days=7)
# The end of the outcome alerts.py records for an owner without an address.
NO_ADDRESS = "has no email address"


def unsent_alerts(user, now, limit=50):
    """Whose alerts of the last UNSENT_WINDOW went nowhere, per owner: recorded as
    not emailed for lack of an address and not posted either, the owner still
    without an address and the webhook without an alert URL. [{owner, alerts,
    webhooks, account}], `account` the owner's page where this user may edit it."""
    alerts = (
        Alert.objects.visible_to(user)
        .filter(
            created_at__gte=now - UNSENT_WINDOW,
            email__endswith=NO_ADDRESS,
            target__webhook__owner__email="",
            target__webhook__alert_url="",
        )
        .exclude(slack=alerting.SENT)
        .select_related("target__webhook__owner")
        .order_by("-created_at")[:limit]
    )
    may_edit = user.has_perm("auth.change_user")
    found = {}
    for alert in alerts:
        webhook = alert.target.webhook
        owner = found.setdefault(
            webhook.owner_id,
            {
                "owner": webhook.owner,
                "alerts": 0,
                "webhooks": {},
                "account": reverse("admin:auth_user_change", args=[webhook.owner_id])
                if may_edit
                else None,
            },
        )
        owner["alerts"] += 1
        owner["webhooks"][webhook.pk] = webhook
    return [{**owner, "webhooks": list(owner["webhooks"].values())} for owner in found.values()]


def context(user, now=None):
    now = now or timezone.now()
    since = now - datetime.timedelta(hours=HOURS)
    coverage = EngineStatus.objects.coverage(now)
    deliveries = Delivery.objects.visible_to(user)
    targets = Target.objects.visible_to(user)
    breakers = health.breakers(now, coverage.engines)
    return {
        # Live engines first, then those gone within the day, with how long ago.
        "engines": engines(now),
        "coverage": coverage,
        # Every partition held by a live engine: everything is being delivered.
        "engine_alive": coverage.complete,
        "status_counts": status_counts(deliveries, since),
        "failed_by_fault": failed_by_fault(deliveries, since),
        "chart": hourly(deliveries, now),
        "failing_targets": failing_targets(deliveries, targets, since, breakers),
        "slowest_targets": slowest_targets(targets, since),
        "paused_targets": list(
            targets.filter(paused=True).select_related("webhook").order_by("-paused_at")[:10]
        ),
        "unsent_alerts": unsent_alerts(user, now),
        "unsent_days": UNSENT_WINDOW.days,
        "alerts": list(
            Alert.objects.visible_to(user)
            .select_related("target__webhook")
            .order_by("-created_at")[:5]
        ),
        "now": now,
        "refresh_ms": settings.WEBHOOKER_CONSOLE_REFRESH * 1000,
    }


def live(request):
    """The dashboard's figures alone, for the page to refresh itself (admin.js)."""
    return TemplateResponse(request, "admin/deliveries/dashboard.html", context(request.user))

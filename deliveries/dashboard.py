"""Figures for the admin index: the engine's heartbeat and the last 24 hours."""

import datetime

from django.db.models import Count, Q
from django.db.models.functions import TruncHour
from django.utils import timezone

from deliveries import health
from deliveries.models import Delivery, EngineStatus, Target

HOURS = 24


def status_counts(deliveries, since):
    rows = deliveries.filter(updated_at__gte=since).values("status").annotate(n=Count("id"))
    counts = {status: 0 for status in Delivery.Status.values}
    counts.update({row["status"]: row["n"] for row in rows})
    return counts


def hourly(deliveries, now):
    """Delivered and failed deliveries per hour, oldest first, as SVG bar geometry."""
    start = (now - datetime.timedelta(hours=HOURS - 1)).replace(minute=0, second=0, microsecond=0)
    rows = (
        deliveries.filter(updated_at__gte=start, status__in=Delivery.FINISHED)
        .annotate(hour=TruncHour("updated_at"))
        .values("hour", "status")
        .annotate(n=Count("id"))
    )
    buckets = {
        start + datetime.timedelta(hours=h): {"delivered": 0, "failed": 0} for h in range(HOURS)
    }
    for row in rows:
        hour = row["hour"]
        if hour in buckets:
            buckets[hour][row["status"]] = row["n"]
    peak = max([b["delivered"] + b["failed"] for b in buckets.values()] + [1])
    width, height, gap = 24, 120, 4
    bars = []
    for i, (hour, b) in enumerate(sorted(buckets.items())):
        ok_h = round(height * b["delivered"] / peak)
        bad_h = round(height * b["failed"] / peak)
        x = i * (width + gap)
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
    return {
        "bars": bars,
        "peak": peak,
        "width": HOURS * (width + gap),
        "height": height,
        "bar_width": width,
    }


def failing_targets(deliveries, targets, since, breakers, limit=5):
    """The targets with the most failed (24 h) and retrying deliveries, then those
    held by a pause or an open breaker, each with its breaker state."""
    rows = list(
        deliveries.filter(Q(status="failed", updated_at__gte=since) | Q(status="retrying"))
        .values("target")
        .annotate(
            failed=Count("id", filter=Q(status="failed")),
            retrying=Count("id", filter=Q(status="retrying")),
        )
        .order_by("-failed", "-retrying")[:limit]
    )
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


def context(user, now=None):
    now = now or timezone.now()
    since = now - datetime.timedelta(hours=HOURS)
    coverage = EngineStatus.objects.coverage(now)
    deliveries = Delivery.objects.visible_to(user)
    breakers = health.breakers(now, coverage.engines)
    return {
        # The last engine heard from, shown while none is alive.
        "engine": EngineStatus.objects.current(),
        "engines": coverage.engines,
        "coverage": coverage,
        # Every partition held by a live engine: everything is being delivered.
        "engine_alive": coverage.complete,
        "status_counts": status_counts(deliveries, since),
        "chart": hourly(deliveries, now),
        "failing_targets": failing_targets(
            deliveries, Target.objects.visible_to(user), since, breakers
        ),
    }

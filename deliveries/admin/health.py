"""How a target is doing: the figures the admin shows on the target list, the
webhook page and the dashboard; and a webhook's grade (healthy, degraded, failing)
on the webhook list.

Attempts are read from DeliveryResult by (target, created_at), one index range per
target over the last WINDOW. A list of targets costs a constant number of queries
(annotate()); the percentiles and the run of failures cost a few more per target
and are shown only where a page holds a handful of targets (detail()). Breaker
states come from the engine's heartbeat row, so they are at most a heartbeat old,
and unknown while the engine is not running.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass

from django.db.models import (
    Case,
    CharField,
    Count,
    ExpressionWrapper,
    F,
    FloatField,
    Func,
    IntegerField,
    OuterRef,
    Q,
    Subquery,
    Value,
    When,
)
from django.db.models.lookups import GreaterThan, GreaterThanOrEqual
from django.utils import timezone

from deliveries.models import DeliveryResult, EngineStatus, Target

WINDOW = datetime.timedelta(hours=24)
# The run of failures is counted over at most this many of the latest attempts.
RUN_LIMIT = 1000

# A webhook's grade, by the share of its deliveries finished within WINDOW that
# failed (every retry spent): at least DEGRADED_SHARE, or any delivery waiting for a
# retry now, is degraded; at least FAILING_SHARE is failing.
HEALTHY, DEGRADED, FAILING = "healthy", "degraded", "failing"
GRADES = [HEALTHY, DEGRADED, FAILING]
DEGRADED_SHARE = 0.01
FAILING_SHARE = 0.20


@dataclass(frozen=True)
class Breaker:
    state: str  # "open" or "half-open"
    since: datetime.datetime | None
    # When the next probe may go.
    until: datetime.datetime | None


@dataclass(frozen=True)
class Health:
    attempts: int
    successes: int
    last_error: str
    breaker: Breaker | None
    paused: bool
    paused_reason: str
    # Only from detail():
    p50_ms: int | None = None
    p95_ms: int | None = None
    # Failed attempts since the last success; at least this many if run_capped.
    consecutive_failures: int | None = None
    run_capped: bool = False

    @property
    def success_rate(self) -> float | None:
        """Successful attempts of the window in percent, None without attempts."""
        if not self.attempts:
            return None
        return 100.0 * self.successes / self.attempts


def _parse_time(value) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return None


def breakers(now=None, engines: list | None = None) -> dict[int, Breaker]:
    """Every breaker that is not closed, by target id, from every live engine (a
    target's breaker lives in the one engine holding its partition; a stopped
    engine's breakers are gone with it). `engines`: the live rows, if already read."""
    now = now or timezone.now()
    engines = EngineStatus.objects.live(now) if engines is None else engines
    found = {}
    for engine in engines:
        found.update(_engine_breakers(engine))
    return found


def _engine_breakers(engine: EngineStatus) -> dict[int, Breaker]:
    if not isinstance(engine.breakers, dict):
        return {}
    found = {}
    for key, value in engine.breakers.items():
        if not (isinstance(value, dict) and str(key).isdigit()):
            continue
        found[int(key)] = Breaker(
            state=str(value.get("state", "open")),
            since=_parse_time(value.get("since")),
            until=_parse_time(value.get("until")),
        )
    return found


def _count(queryset):
    counted = queryset.order_by().annotate(n=Func(F("pk"), function="COUNT")).values("n")
    return Subquery(counted[:1], output_field=IntegerField())


def annotate(targets, now=None):
    """Add the window's attempts_24h, successes_24h and last_error_24h to a Target
    queryset: correlated subqueries, so one query for a page of any length."""
    since = (now or timezone.now()) - WINDOW
    results = DeliveryResult.objects.filter(target=OuterRef("pk"), created_at__gte=since)
    last_error = results.filter(success=False).order_by("-created_at", "-id").values("error")
    return targets.annotate(
        attempts_24h=_count(results),
        successes_24h=_count(results.filter(success=True)),
        last_error_24h=Subquery(last_error[:1]),
    )


def summary(target: Target, breakers_by_target: dict[int, Breaker]) -> Health:
    """The health of a target from annotate()'s figures; no query."""
    return Health(
        attempts=target.attempts_24h or 0,
        successes=target.successes_24h or 0,
        last_error=target.last_error_24h or "",
        breaker=breakers_by_target.get(target.pk),
        paused=target.paused,
        paused_reason=target.paused_reason,
    )


def detail(
    target: Target, breakers_by_target: dict[int, Breaker] | None = None, now=None
) -> Health:
    """Everything, percentiles and the run of failures included: five queries, and
    one more for the breakers unless given."""
    now = now or timezone.now()
    if breakers_by_target is None:
        breakers_by_target = breakers(now)
    results = DeliveryResult.objects.filter(target=target.pk, created_at__gte=now - WINDOW)
    counts = results.aggregate(attempts=Count("id"), successes=Count("id", filter=Q(success=True)))
    attempts = counts["attempts"]
    last_error = (
        results.filter(success=False).order_by("-created_at", "-id").values_list("error", flat=True)
    ).first()
    latest = list(
        DeliveryResult.objects.filter(target=target.pk)
        .order_by("-created_at", "-id")
        .values_list("success", flat=True)[:RUN_LIMIT]
    )
    run = next((n for n, success in enumerate(latest) if success), len(latest))
    return Health(
        attempts=attempts,
        successes=counts["successes"],
        last_error=last_error or "",
        breaker=breakers_by_target.get(target.pk),
        paused=target.paused,
        paused_reason=target.paused_reason,
        p50_ms=_percentile(results, attempts, 0.50),
        p95_ms=_percentile(results, attempts, 0.95),
        consecutive_failures=run,
        run_capped=run == RUN_LIMIT,
    )


def _percentile(results, count: int, fraction: float) -> int | None:
    """The nearest-rank percentile of duration_ms: ORDER BY ... LIMIT 1 OFFSET k,
    the same SQL on SQLite and PostgreSQL."""
    if not count:
        return None
    rank = max(1, math.ceil(fraction * count))
    ranked = results.order_by("duration_ms").values_list("duration_ms", flat=True)
    # A slice, not an index: rows pruned since the count make it come back empty.
    return next(iter(ranked[rank - 1 : rank]), None)


def grade(failed, delivered, retrying) -> Case:
    """The grade (HEALTHY, DEGRADED, FAILING) as SQL, from three integer
    expressions: the window's failed and delivered deliveries, those retrying now.
    One expression for the column, its filter and its sort alike."""

    def share_at_least(share):
        floor = ExpressionWrapper(Value(share) * (failed + delivered), output_field=FloatField())
        return Q(GreaterThan(failed, 0), GreaterThanOrEqual(failed, floor))

    return Case(
        When(share_at_least(FAILING_SHARE), then=Value(FAILING)),
        When(share_at_least(DEGRADED_SHARE) | Q(GreaterThan(retrying, 0)), then=Value(DEGRADED)),
        default=Value(HEALTHY),
        output_field=CharField(),
    )

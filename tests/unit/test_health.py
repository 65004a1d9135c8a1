"""Target health: the figures against known attempts."""

import datetime

import pytest
from django.utils import timezone

from deliveries.admin import health
from deliveries.models import Delivery, DeliveryResult, EngineStatus, Target
from tests.support.engines import store

pytestmark = pytest.mark.django_db


def attempts(target, entrypoint, outcomes, *, start):
    """One result per (success, duration_ms, error), a second apart from `start`."""
    [event] = store(entrypoint)
    delivery = Delivery.objects.get(event=event, target=target)
    DeliveryResult.objects.bulk_create(
        DeliveryResult(
            delivery=delivery,
            target=target,
            attempt=n,
            success=success,
            duration_ms=duration,
            error=error,
            created_at=start + datetime.timedelta(seconds=n),
        )
        for n, (success, duration, error) in enumerate(outcomes, 1)
    )


@pytest.fixture
def target(make_target):
    return make_target("log", name="known")


def test_health_figures_against_known_attempts(target, entrypoint, make_target):
    now = timezone.now()
    # Outside the window: counted by nobody but the run of failures.
    attempts(target, entrypoint, [(True, 5000, "")], start=now - datetime.timedelta(days=2))
    outcomes = [(True, ms, "") for ms in range(10, 170, 10)]  # 16 successes, 10..160 ms
    outcomes += [(False, 1000, "HTTP 500"), (False, 2000, "connection refused")]
    outcomes += [(True, 170, ""), (False, 3000, "HTTP 502"), (False, 4000, "timed out after 10 s")]
    attempts(target, entrypoint, outcomes, start=now - datetime.timedelta(hours=1))
    other = make_target("log", name="other")
    attempts(other, entrypoint, [(False, 1, "elsewhere")], start=now - datetime.timedelta(hours=1))

    figures = health.detail(Target.objects.get(pk=target.pk), now=now)
    assert (figures.attempts, figures.successes) == (21, 17)
    assert figures.success_rate == pytest.approx(100 * 17 / 21)
    # Nearest rank over 21 durations: the 11th (110 ms) and the 20th (3 000 ms).
    assert (figures.p50_ms, figures.p95_ms) == (110, 3000)
    assert figures.consecutive_failures == 2 and not figures.run_capped
    assert figures.last_error == "timed out after 10 s"
    assert figures.breaker is None and not figures.paused

    [row] = health.annotate(Target.objects.filter(pk=target.pk), now=now)
    listed = health.summary(row, {})
    assert (listed.attempts, listed.successes, listed.last_error) == (
        21,
        17,
        "timed out after 10 s",
    )
    assert listed.p50_ms is None  # the list does not pay for percentiles


def test_a_target_without_attempts(target):
    figures = health.detail(target)
    assert (figures.attempts, figures.success_rate, figures.p50_ms) == (0, None, None)
    assert figures.consecutive_failures == 0 and figures.last_error == ""


def test_the_run_of_failures_is_bounded(target, entrypoint, monkeypatch):
    monkeypatch.setattr(health, "RUN_LIMIT", 5)
    attempts(target, entrypoint, [(False, 1, "x")] * 7, start=timezone.now())
    figures = health.detail(target)
    assert figures.consecutive_failures == 5 and figures.run_capped


def test_breaker_and_pause_come_from_the_engine_and_the_target(target):
    now = timezone.now()
    until = now + datetime.timedelta(seconds=30)
    EngineStatus.objects.create(
        heartbeat_at=now,
        started_at=now,
        breakers={
            str(target.pk): {"state": "open", "since": now.isoformat(), "until": until.isoformat()},
            "junk": "ignored",
        },
    )
    Target.objects.filter(pk=target.pk).pause("ordered delivery: event x failed")
    figures = health.detail(Target.objects.get(pk=target.pk), now=now)
    assert figures.breaker == health.Breaker(state="open", since=now, until=until)
    assert figures.paused and figures.paused_reason == "ordered delivery: event x failed"
    # A stopped engine's breakers are gone with it.
    EngineStatus.objects.update(heartbeat_at=now - datetime.timedelta(minutes=5))
    assert health.breakers(now) == {}


def test_a_list_of_targets_costs_a_constant_number_of_queries(
    target, entrypoint, make_target, django_assert_num_queries
):
    for n in range(5):
        attempts(
            make_target("log", name=f"t{n}"), entrypoint, [(False, 1, "x")], start=timezone.now()
        )
    with django_assert_num_queries(2):
        found = health.breakers()
        rows = list(health.annotate(Target.objects.all()))
        figures = [health.summary(row, found) for row in rows]
    assert len(figures) == 6 and sum(f.attempts for f in figures) == 5

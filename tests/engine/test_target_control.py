"""Target control in the engine: live target rows, holds, breakers, order, rate
limits, filters, retry now, auto-disable. Steps driven on the test's thread, and
the whole engine on real threads against a real sink."""

import datetime
import time

import pytest
from django.utils import timezone

from deliveries.models import Alert, Delivery, DeliveryResult, EngineStatus, Event, Target
from tests.support.clock import FakeClock
from tests.support.engines import RunningEngine, pump, started_engine, store
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def fail_once_then_retrying(entrypoint, target, sink, path, clock):
    """One delivery attempted once (500), now waiting in the scheduler for its retry."""
    sink.respond(path, 500)
    engine = started_engine(clock=clock, backoff_base=5, backoff_cap=5)
    store(entrypoint)
    engine.intake_once()
    engine.process_one()
    assert Delivery.objects.get().status == "retrying"
    return engine


# --- defect 1: the target as it is now ------------------------------------------------


def test_a_retry_goes_to_the_url_the_target_has_now(entrypoint, make_target, sink):
    target = make_target(url=sink.url("/old"), max_retries=3)
    clock = FakeClock()
    engine = fail_once_then_retrying(entrypoint, target, sink, "/old", clock)
    target.config = {"url": sink.url("/new")}
    target.save()
    clock.now += 10
    engine.refresh_targets(force=True)
    engine.scheduler.release_due()
    engine.process_one()
    assert len(sink.requests("/old")) == 1
    assert len(sink.requests("/new")) == 1
    assert Delivery.objects.get().status == "delivered"


def test_a_deactivated_targets_retry_is_held_not_sent(entrypoint, make_target, sink):
    target = make_target(url=sink.url("/t"), max_retries=3)
    clock = FakeClock()
    engine = fail_once_then_retrying(entrypoint, target, sink, "/t", clock)
    target.active = False
    target.save()
    engine.refresh_targets(force=True)
    assert engine.scheduler.pending() == 0  # dropped from memory at once
    assert engine.inflight.held() == 0
    clock.now += 60
    pump(engine, lambda: True)
    assert len(sink.requests("/t")) == 1
    assert Delivery.objects.get().status == "retrying"  # waits in the database


def test_a_deleted_targets_deliveries_leave_memory(entrypoint, make_target, sink):
    target = make_target(url=sink.url("/gone"), max_retries=3)
    clock = FakeClock()
    engine = fail_once_then_retrying(entrypoint, target, sink, "/gone", clock)
    target.delete()
    engine.refresh_targets(force=True)
    assert engine.scheduler.pending() == 0
    assert engine.inflight.held() == 0
    assert len(sink.requests("/gone")) == 1


def test_pause_drops_queued_work_and_resume_sends_it_in_order(entrypoint, make_target, sink):
    target = make_target(url=sink.url("/p"))
    engine = started_engine()
    events = store(entrypoint, n=5)
    engine.intake_once()
    Target.objects.filter(id=target.id).pause("maintenance")
    engine.refresh_targets(force=True)
    while engine.process_one():
        pass
    assert sink.requests("/p") == []
    assert set(Delivery.objects.values_list("status", flat=True)) == {"pending"}
    more = store(entrypoint, n=2)  # created while paused, and held
    assert engine.intake_once() == 0
    Target.objects.filter(id=target.id).resume()
    engine.refresh_targets(force=True)
    pump(engine, lambda: set(Delivery.objects.values_list("status", flat=True)) == {"delivered"})
    got = [r.headers["X-Webhooker-Event"] for r in sink.requests("/p")]
    assert got == [str(e.code) for e in events + more]
    assert engine.inflight.held() == 0


# --- defects 2 and 3: the breaker --------------------------------------------------------


def open_breaker(entrypoint, make_target, sink, clock, n=8):
    make_target(url=sink.url("/down"), max_retries=10)
    sink.always("/down", 500)
    engine = started_engine(clock=clock, backoff_base=0.001, backoff_cap=0.001)
    store(entrypoint, n=n)
    engine.intake_once()
    for _ in range(5):  # five failures open the breaker
        engine.process_one()
    while engine.process_one():  # the rest meet it and are deferred
        pass
    return engine


def test_a_probe_that_succeeds_sends_the_waiting_deliveries_at_once(entrypoint, make_target, sink):
    clock = FakeClock()
    engine = open_breaker(entrypoint, make_target, sink, clock)
    assert len(engine.targets.not_closed()) == 1
    waiting = engine.scheduler.pending()
    assert waiting == 8
    sink.always("/down", 200)
    clock.now += 30  # the cooldown: the first due task is the probe
    engine.scheduler.release_due()
    pump(engine, lambda: not Delivery.objects.unfinished().exists(), timeout=10)
    # Nothing waited for another cooldown: the clock never moved again.
    assert clock.now == 1030.0
    assert Delivery.objects.filter(status="delivered").count() == 8


def test_an_open_breaker_is_published_and_next_attempt_tells_the_truth(
    entrypoint, make_target, sink
):
    clock = FakeClock()
    engine = open_breaker(entrypoint, make_target, sink, clock)
    [(target_id, state)] = engine.targets.breaker_states().items()
    assert state["state"] == "open"
    until = datetime.datetime.fromisoformat(state["until"])
    assert 25 < (until - timezone.now()).total_seconds() <= 30
    for delivery in Delivery.objects.all():
        assert delivery.next_attempt_at >= until - datetime.timedelta(seconds=1)
    from deliveries.engine.runner import Runner

    Runner(engine).beat()
    assert EngineStatus.objects.current().breakers[target_id]["state"] == "open"


# --- ordered delivery ----------------------------------------------------------------------


def test_ordered_head_that_fails_twice_then_succeeds_keeps_order(entrypoint, make_target, sink):
    make_target(url=sink.url("/o"), ordered=True, max_retries=5)
    sink.respond("/o", 500, 500)  # the first event's first two attempts
    events = store(entrypoint, n=6)
    with RunningEngine(backoff_base=0.05, backoff_cap=0.1):
        wait_until(lambda: Delivery.objects.filter(status="delivered").count() == 6)
    got = [r.headers["X-Webhooker-Event"] for r in sink.requests("/o")]
    expected = [str(e.code) for e in events]
    assert got == [expected[0]] * 3 + expected[1:]


def test_an_ordered_target_never_has_two_heads_in_flight(entrypoint, make_target, sink):
    """Heads are read by the intake thread and, once a head's result commits, by the
    writer's: a read while the target's head is in flight claims nothing, even when
    an older delivery was set back to pending meanwhile (a redeliver)."""
    make_target(url=sink.url("/o"), ordered=True)
    events = store(entrypoint, n=3)
    engine = started_engine()
    engine.intake_once()
    engine.process_one()  # the first event's delivery: delivered, then the second's claimed
    first, _, _ = (Delivery.objects.get(event=e) for e in events)
    assert first.status == "delivered"
    assert engine.inflight.held() == 1  # the second, the head now
    Delivery.objects.filter(id=first.id).update(status="pending")
    target_id = first.target_id
    assert engine.intake.head(target_id) == 0
    assert engine.inflight.held() == 1
    assert engine.targets.waiting_lanes() == []


def test_ordered_head_that_finally_fails_pauses_the_target(entrypoint, make_target, sink):
    target = make_target(url=sink.url("/o"), ordered=True, max_retries=1)
    sink.respond("/o", 500, 500)
    first, *rest = store(entrypoint, n=4)
    with RunningEngine(backoff_base=0.05, backoff_cap=0.1) as runner:
        wait_until(lambda: Target.objects.get(id=target.id).paused, message="the pause")
        time.sleep(0.5)  # give the engine the chance to send something it must not
        assert runner.engine.alert_once() >= 0
    target.refresh_from_db()
    assert target.paused_reason == f"ordered delivery: event {first.code} failed"
    assert len(sink.requests("/o")) == 2  # the head, twice; nothing after it
    assert Delivery.objects.filter(status="pending").count() == 3
    assert Alert.objects.filter(target=target, kind="paused").count() == 1
    Target.objects.filter(id=target.id).resume()
    with RunningEngine():
        wait_until(lambda: Delivery.objects.filter(status="delivered").count() == 3)
    assert [r.headers["X-Webhooker-Event"] for r in sink.requests("/o")][2:] == [
        str(e.code) for e in rest
    ]


# --- rate limit ----------------------------------------------------------------------------


def test_a_rate_limit_of_5_per_second_holds_and_spares_other_targets(entrypoint, make_target, sink):
    """On the engine's clock (a fake one): the limited target's attempts are
    reserved 1/5 s apart, and the other target's go at once meanwhile."""
    make_target(url=sink.url("/slow"), name="slow", rate_limit=5)
    make_target(url=sink.url("/free"), name="free")
    clock = FakeClock()
    engine = started_engine(clock=clock, workers=2)
    store(entrypoint, n=20)
    while engine.intake_once():
        pass
    while engine.process_one():
        pass
    assert len(sink.requests("/free")) == 20  # not held back by the other's limit
    assert len(sink.requests("/slow")) == 1
    due = [at for at, _ in engine.scheduler.scheduled()]
    assert due == pytest.approx([1000.0 + n / 5 for n in range(1, 20)])
    for n, at in enumerate(due, start=1):
        clock.now = at
        assert engine.scheduler.release_due() == 1
        while engine.process_one():
            pass
        assert len(sink.requests("/slow")) == n + 1
    assert Delivery.objects.filter(status="delivered").count() == 40


def test_rate_limited_tasks_wait_owned_without_workers(entrypoint, make_target, sink):
    make_target(url=sink.url("/r"), rate_limit=1)
    clock = FakeClock()
    engine = started_engine(clock=clock)
    store(entrypoint, n=3)
    engine.intake_once()
    while engine.process_one():
        pass
    assert len(sink.requests("/r")) == 1
    assert [due for due, _ in engine.scheduler.scheduled()] == [1001.0, 1002.0]
    clock.now = 1002.0
    assert engine.scheduler.release_due() == 2
    while engine.process_one():
        pass
    assert len(sink.requests("/r")) == 3


# --- filters -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "body", "delivered"),
    [
        ([["X-GitHub-Event", "push"]], b'{"ref": "main"}', True),
        ([["X-GitHub-Event", "issues"]], b'{"ref": "main"}', False),
        ([["X-GitHub-Event", "push"]], b'{"ref": "dev"}', False),
        ([["X-GitHub-Event", "push"]], b'{"ref": ', False),  # malformed JSON
        ([["X-GitHub-Event", "push"]], b"\xff\xfe\x00binary", False),
    ],
)
def test_filters_on_header_and_json_path(entrypoint, make_target, sink, headers, body, delivered):
    make_target(
        url=sink.url("/f"),
        filters=[
            {"source": "header", "name": "x-github-event", "op": "equals", "value": "push"},
            {"source": "json", "name": "ref", "op": "one_of", "value": ["main", "master"]},
        ],
    )
    engine = started_engine()
    store(entrypoint, body=body, headers=headers)
    engine.intake_once()
    engine.process_one()
    delivery = Delivery.objects.get()
    if delivered:
        assert delivery.status == "delivered"
        assert len(sink.requests("/f")) == 1
    else:
        assert (delivery.status, delivery.attempts) == ("filtered", 0)
        assert not DeliveryResult.objects.exists()
        assert sink.requests("/f") == []
    assert engine.inflight.held() == 0


@pytest.mark.parametrize(
    ("event_type", "delivered"), [("push", True), ("issues", False), ("", False)]
)
def test_a_filter_on_the_events_type(entrypoint, make_target, sink, event_type, delivered):
    make_target(
        url=sink.url("/t"),
        filters=[{"source": "event", "name": "type", "op": "one_of", "value": ["push", "release"]}],
    )
    engine = started_engine()
    [event] = store(entrypoint)
    Event.objects.filter(pk=event.pk).update(event_type=event_type)
    engine.intake_once()
    engine.process_one()
    delivery = Delivery.objects.get()
    assert delivery.status == ("delivered" if delivered else "filtered")
    assert delivery.reason == ("" if delivered else "the target's filters did not match")


@pytest.mark.parametrize(
    ("rule", "error"),
    [
        ({"source": "event", "name": "colour", "op": "exists"}, "an event rule's name is type"),
        ({"source": "event", "name": "type", "op": "equals", "value": 3}, "event values are text"),
        ({"source": "body", "name": "x", "op": "exists"}, "source must be one of"),
    ],
)
def test_bad_event_rules_are_refused_in_words(rule, error):
    from django.core.exceptions import ValidationError

    from deliveries.filters import clean_filters

    with pytest.raises(ValidationError, match=error):
        clean_filters([rule])


# --- retry schedules -----------------------------------------------------------------------


def test_a_retry_schedule_sets_each_delay_and_the_number_of_retries(entrypoint, make_target, sink):
    make_target(url=sink.url("/s"), max_retries=10, retry_schedule=[7, 30])
    sink.always("/s", 500)
    clock = FakeClock()
    engine = started_engine(clock=clock, backoff_base=1, backoff_cap=3600)
    store(entrypoint)
    engine.intake_once()
    engine.process_one()
    waits = []
    while Delivery.objects.get().status == "retrying":
        ((due, _),) = engine.scheduler.scheduled()
        waits.append(due - clock.now)
        clock.now = due
        engine.scheduler.release_due()
        engine.process_one()
    assert waits == [7, 30]  # as scheduled, no jitter, then no third retry
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("failed", 3)
    assert len(sink.requests("/s")) == 3


def test_retry_after_longer_than_the_schedule_wins():
    from deliveries.engine.backoff import scheduled_delay

    assert scheduled_delay([5, 60], 1, None, cap=3600) == 5
    assert scheduled_delay([5, 60], 1, 120, cap=3600) == 120
    assert scheduled_delay([5, 60], 2, 10, cap=3600) == 60
    assert scheduled_delay([5], 1, 99_999, cap=3600) == 3600


@pytest.mark.parametrize(
    ("schedule", "error"),
    [
        ("5, 60", "a list of delays"),
        ([5, "60"], "Retry 2"),
        ([0], "above 0"),
        ([True], "Retry 1"),
        ([10**7], "a week"),
        ([1] * 51, "At most 50"),
    ],
)
def test_a_bad_retry_schedule_is_a_field_error(make_target, schedule, error):
    from django.core.exceptions import ValidationError

    target = make_target(url="http://example.com/x")
    target.retry_schedule = schedule
    with pytest.raises(ValidationError) as caught:
        target.full_clean()
    assert error in caught.value.message_dict["retry_schedule"][0]


def test_the_form_reads_a_retry_schedule_as_typed():
    from deliveries.forms import RetryScheduleField

    field = RetryScheduleField(required=False)
    assert field.clean("5, 60  600,3600") == [5, 60, 600, 3600]
    assert field.clean("0.5") == [0.5]
    assert field.clean("") == []
    assert field.prepare_value([5, 60, 0.5]) == "5, 60, 0.5"
    with pytest.raises(Exception, match="not a number"):
        field.clean("5, soon")


# --- retry now -----------------------------------------------------------------------------


def test_retry_now_skips_the_rest_of_the_backoff(entrypoint, make_target, sink):
    target = make_target(url=sink.url("/later"), max_retries=3)
    clock = FakeClock()
    engine = fail_once_then_retrying(entrypoint, target, sink, "/later", clock)
    assert Delivery.objects.all().retry_now() == 1
    engine.intake_once()  # the sweep of requeued rows finds it held here
    assert engine.process_one()  # now, not in 5 s: the clock never moved
    assert len(sink.requests("/later")) == 2
    assert Delivery.objects.get().status == "delivered"
    assert engine.inflight.held() == 0


# --- auto-disable --------------------------------------------------------------------------


def test_410_pauses_the_target_and_raises_an_alert(entrypoint, make_target, sink, mailoutbox):
    target = make_target(url=sink.url("/gone"), max_retries=3)
    sink.always("/gone", 410)
    engine = started_engine()
    store(entrypoint, n=3)
    engine.intake_once()
    pump(engine, lambda: Target.objects.get(id=target.id).paused)
    while engine.process_one():
        pass
    target.refresh_from_db()
    assert target.paused_reason == "the receiver answered 410 Gone"
    assert len(sink.requests("/gone")) == 1  # the rest are held
    assert Delivery.objects.filter(status="pending").count() == 2
    engine.alert_once()
    [alert] = Alert.objects.filter(target=target)
    assert alert.kind == "paused" and "410" in alert.message
    # Whose fault, in the alert's own words.
    assert "(the receiver's fault: answered an error status)" in alert.message


def test_a_target_failing_for_disable_after_is_paused(entrypoint, make_target, sink):
    target = make_target(url=sink.url("/bad"))
    sink.always("/bad", 500)
    engine = started_engine(disable_after=3600)
    store(entrypoint)
    engine.intake_once()
    engine.process_one()
    target.refresh_from_db()
    assert target.failing_since is not None and not target.paused
    target.failing_since = timezone.now() - datetime.timedelta(hours=2)
    target.save()  # as if failing for two hours; its version moves, the engine re-reads it
    engine.refresh_targets(force=True)
    store(entrypoint)
    engine.intake_once()
    engine.process_one()
    target.refresh_from_db()
    assert target.paused
    assert target.paused_reason.startswith("every attempt failed since")


def test_a_success_ends_the_failing_run(entrypoint, make_target, sink):
    target = make_target(url=sink.url("/flaky"))
    sink.respond("/flaky", 500)
    engine = started_engine()
    store(entrypoint, n=2)
    engine.intake_once()
    engine.process_one()
    assert Target.objects.get(id=target.id).failing_since is not None
    engine.process_one()
    assert Target.objects.get(id=target.id).failing_since is None
    assert Event.objects.count() == 2


def test_a_paused_backlog_does_not_hide_stranded_rows_from_the_tick(
    entrypoint, make_target, sink, monkeypatch
):
    from deliveries.engine import recovery
    from tests.support.engines import make_engine

    monkeypatch.setattr(recovery, "PAGE", 2)
    monkeypatch.setattr(recovery, "MAX_TICK_PAGES", 2)
    paused = make_target(url=sink.url("/p"), name="paused")
    first, *_ = store(entrypoint, n=6)
    Target.objects.filter(id=paused.id).pause("held")
    other = make_target(url=sink.url("/o"), name="other")
    stranded = Delivery.objects.create(event=first, target=other)
    hour = datetime.timedelta(hours=1)
    Delivery.objects.filter(target=paused).update(updated_at=timezone.now() - 2 * hour)
    Delivery.objects.filter(id=stranded.id).update(updated_at=timezone.now() - hour)
    engine = make_engine(stale_after=60)
    assert engine.recover_once() == 1  # a tick: it reaches past the held rows
    assert [t.delivery_id for t in engine.channel.drain()] == [stranded.id]


def test_a_probe_that_must_wait_for_its_rate_limit_slot_is_given_back(
    entrypoint, make_target, sink
):
    """A half-open breaker's probe taken by a task whose rate-limit slot lies
    ahead: the probe goes back, so the breaker does not wait forever on a probe
    nobody sends (review finding)."""
    target = make_target(url=sink.url("/r"), rate_limit=1, max_retries=5)
    clock = FakeClock()
    engine = started_engine(clock=clock)
    store(entrypoint, n=2)
    engine.intake_once()
    engine.process_one()  # the first: sent, the next slot reserved a second on
    assert len(sink.requests("/r")) == 1
    breaker = engine.targets.get(target.pk).circuit_breaker()
    breaker.state, breaker.opened_until = breaker.OPEN, clock.now  # cooldown over
    engine.process_one()  # takes the probe, then must wait for its slot
    assert len(sink.requests("/r")) == 1
    clock.now += 1.0
    assert engine.scheduler.release_due() == 1
    while engine.process_one():
        pass
    assert len(sink.requests("/r")) == 2  # the probe went
    assert breaker.state == breaker.CLOSED

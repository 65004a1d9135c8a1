"""One object per target in the engine (deliveries/engine/targets.py): its row,
gate, overflow, lane, breaker and rate limit; one `admit`, one `forget`."""

from types import SimpleNamespace

import pytest

from deliveries.engine.targets import GONE, HELD, REORDERED, REPOINTED, RESUMED, Targets
from deliveries.models import Target
from tests.support.clock import FakeClock

pytestmark = pytest.mark.django_db


def task(target_id, delivery_id=1):
    return SimpleNamespace(
        target_id=target_id,
        delivery_id=delivery_id,
        breaker=None,
        probing=False,
        deferred=False,
        slotted=False,
    )


def loaded(*targets, clock=None, **options):
    registry = Targets(clock=clock or FakeClock(), **options)
    registry.load([t.pk for t in targets])
    return registry


def test_breakers_are_per_target_and_only_open_ones_are_listed(make_target):
    a, b = make_target(max_retries=3, name="a"), make_target(max_retries=3, name="b")
    targets = loaded(a, b)
    for _ in range(5):
        targets.get(a.pk).circuit_breaker().record(False)
    targets.get(b.pk).circuit_breaker().record(False)
    assert list(targets.not_closed()) == [a.pk]


def test_admit_defers_to_the_breaker_and_hands_out_one_probe(make_target):
    target = make_target(max_retries=3)
    clock = FakeClock()
    targets = loaded(target, clock=clock, breaker_cooldown=30)
    state = targets.get(target.pk)
    for _ in range(5):
        state.circuit_breaker().record(False)
    first = task(target.pk)
    assert state.admit(first, clock()) == clock.now + 30
    assert first.deferred and not first.probing

    clock.now += 30
    probe, other = task(target.pk, 1), task(target.pk, 2)
    assert state.admit(probe, clock()) is None
    assert probe.probing and probe.breaker is state.breaker and not probe.deferred
    assert state.admit(other, clock()) == clock.now + 30  # the probe is out
    assert other.deferred


def test_admit_reserves_rate_limit_slots_a_period_apart(make_target):
    target = make_target(rate_limit=4)
    clock = FakeClock()
    targets = loaded(target, clock=clock)
    state = targets.get(target.pk)
    tasks = [task(target.pk, n) for n in range(3)]
    assert state.admit(tasks[0], clock()) is None
    assert state.admit(tasks[1], clock()) == clock.now + 0.25
    assert tasks[1].slotted
    assert state.admit(tasks[2], clock()) == clock.now + 0.5
    # A slotted task that comes back when its slot is due goes, taking no new slot.
    clock.now += 0.25
    assert state.admit(tasks[1], clock()) is None
    assert not tasks[1].slotted
    assert state.next_slot == clock.now + 0.5


def test_a_probe_not_sent_for_a_rate_limit_slot_goes_back(make_target):
    target = make_target(max_retries=3, rate_limit=1)
    clock = FakeClock()
    state = loaded(target, clock=clock, breaker_cooldown=30).get(target.pk)
    assert state.admit(task(target.pk, 1), clock()) is None  # takes the slot now
    breaker = state.circuit_breaker()
    breaker.state, breaker.opened_until = breaker.OPEN, clock.now
    waiting = task(target.pk, 2)
    assert state.admit(waiting, clock()) == clock.now + 1.0  # probe taken, then its slot
    assert not waiting.probing
    assert breaker.state == breaker.OPEN  # the next attempt probes instead


def test_the_gate_parks_past_the_concurrency_and_hands_slots_on(make_target):
    target = make_target()
    targets = loaded(target, concurrency=2)
    one, two, three = (task(target.pk, n) for n in range(3))
    assert targets.enter(one) and targets.enter(two)
    assert not targets.enter(three)  # parked
    assert targets.leave(target.pk) is three  # the worker takes it next, slot and all
    assert targets.vacate(target.pk) is None
    assert targets.get(target.pk).running == 1


def test_hold_caps_what_the_engine_keeps_in_memory(make_target):
    target = make_target()
    targets = loaded(target)
    state = targets.get(target.pk)
    assert state.hold(2) and state.hold(2)
    assert not state.hold(2)
    targets.discharge(target.pk)
    assert targets.held(target.pk) == 1 and targets.held_targets() == [target.pk]


def test_forget_drops_what_was_learnt_and_returns_the_parked(make_target):
    target = make_target(max_retries=3, rate_limit=1, ordered=True)
    clock = FakeClock()
    targets = loaded(target, clock=clock, concurrency=1)
    state = targets.get(target.pk)
    state.hold(10)
    state.admit(task(target.pk), clock())
    targets.note_overflow(target.pk, 5)
    assert targets.begin_head(target.pk)
    targets.start_head(target.pk, 41)
    targets.note_lane(target.pk)
    running, parked = task(target.pk, 41), task(target.pk, 42)
    assert targets.enter(running) and not targets.enter(parked)

    assert state.forget() == [parked]
    assert state.breaker is None and state.next_slot is None
    assert not targets.overflowing(target.pk) and targets.overflowed() == []
    assert targets.waiting_lanes() == []
    # What runs still finishes and leaves: the head, the hold, the slot.
    assert state.head == 41 and targets.held(target.pk) == 1 and state.running == 1
    assert targets.head_done(target.pk, 41)


def test_forget_where_forgets_the_targets_it_accepts(make_target):
    a, b = make_target(name="a"), make_target(name="b")
    targets = loaded(a, b, concurrency=0)
    targets.note_overflow(a.pk, 1)
    targets.note_overflow(b.pk, 1)
    parked = task(a.pk)
    assert not targets.enter(parked)
    assert targets.forget_where(lambda target_id: target_id == a.pk) == [parked]
    assert targets.overflowed() == [(b.pk, 1)]


def test_refresh_says_what_changed_and_resets_what_a_change_makes_stale(make_target):
    moved = make_target(max_retries=3, rate_limit=2, url="http://127.0.0.1:9/a", name="m")
    paused = make_target(name="p")
    gone = make_target(name="g")
    resumed = make_target(name="r", paused=True)
    clock = FakeClock()
    targets = loaded(moved, paused, gone, resumed, clock=clock)
    state = targets.get(moved.pk)
    state.admit(task(moved.pk), clock())
    assert state.breaker is not None and state.next_slot is not None

    moved.config = {"url": "http://127.0.0.1:9/b"}
    moved.rate_limit = 3
    moved.ordered = True
    moved.save()
    Target.objects.filter(pk=paused.pk).pause("by hand")
    Target.objects.filter(pk=resumed.pk).resume()
    Target.objects.filter(pk=gone.pk).delete()

    found = {(t.id, what) for t, what in targets.refresh(force=True)}
    assert found == {
        (moved.pk, REPOINTED),
        (moved.pk, REORDERED),
        (paused.pk, HELD),
        (resumed.pk, RESUMED),
        (gone.pk, GONE),
    }
    assert state.breaker is None and state.next_slot is None
    assert state.row.ordered and state.row.rate_limit == 3
    assert targets.get(gone.pk) is None
    targets.discharge(gone.pk)  # a deleted target's last task leaves quietly
    assert targets.refresh(force=True) == []


def test_refresh_if_stale_checks_once_within_the_freshness(make_target, django_assert_num_queries):
    target = make_target()
    clock = FakeClock()
    targets = loaded(target, clock=clock)
    with django_assert_num_queries(1):
        targets.refresh(if_stale=True)
    with django_assert_num_queries(0):
        targets.refresh(if_stale=True)  # checked a moment ago (by another worker, say)
    clock.now += Targets.FRESH + 0.01
    assert targets.stale()
    with django_assert_num_queries(1):
        targets.refresh(if_stale=True)

"""Replay jobs (deliveries/replays.py): planned once, queued a window at a time by
the engine, counted as they end; paused, resumed and cancelled."""

import datetime
import io
from collections import Counter

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from deliveries import replays
from deliveries.models import Delivery, Event, ReplayItem, ReplayJob, Target, Webhook
from tests.support.engines import RunningEngine
from tests.support.history import HOUR, OUTAGE_END, OUTAGE_START, analyzed, history, outage
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def criteria(webhook, **fields):
    return replays.Criteria(webhook, OUTAGE_START, OUTAGE_END, **fields)


def run_steps(job, window=100, finish_as="delivered", limit=10_000):
    """Step the job as one engine would, finishing each queued delivery the way an
    engine would (`finish_as`); return the job's progress after each step."""
    seen = []
    for _ in range(limit):
        if not replays.step({0}, 1, window=window):
            break
        Delivery.objects.filter(status="pending").update(status=finish_as)
        job.refresh_from_db()
        seen.append((job.state, job.queued, job.delivered))
    job.refresh_from_db()
    return seen


def test_a_job_sends_the_outage_again_exactly_and_nothing_around_it(webhook, make_target):
    a = make_target(name="a")
    events = outage(webhook, [a], n=2_000)
    before = dict(Delivery.objects.values_list("pk", "updated_at"))
    wanted = criteria(webhook, target=a, statuses=("failed",))
    assert wanted.count() == 2_000  # the dry run

    job = replays.start(wanted)
    assert (job.state, job.matched) == ("planning", 0)
    progress = run_steps(job, window=100)

    assert (job.state, job.matched, job.queued, job.delivered, job.failed) == (
        "done",
        2_000,
        2_000,
        2_000,
        0,
    )
    assert job.finished_at is not None
    queued = [q for _, q, _ in progress]
    assert queued == sorted(queued) and len(set(queued)) > 10  # it moved, a window at a time
    assert max(b - a for a, b in zip([0, *queued], queued, strict=False)) <= 100
    changed = {
        pk for pk, at in Delivery.objects.values_list("pk", "updated_at") if before[pk] != at
    }
    assert changed == set(Delivery.objects.filter(event__in=events).values_list("pk", flat=True))
    assert not ReplayItem.objects.exists()  # a finished job keeps its counts only


def test_to_a_new_target_each_event_gets_a_delivery(webhook, make_target):
    old, new = make_target(name="old"), make_target(name="new")
    events = outage(webhook, [old], n=2_000)
    wanted = criteria(webhook, target=old, to_target=new)
    assert wanted.count() == 2_000
    job = replays.start(wanted)
    run_steps(job, window=100)
    assert (job.matched, job.queued, job.delivered, job.skipped) == (2_000, 2_000, 2_000, 0)
    sent = Delivery.objects.filter(target=new)
    assert set(sent.values_list("event", flat=True)) == {e.pk for e in events}
    assert set(
        Delivery.objects.filter(target=old, event__in=events).values_list("status", flat=True)
    ) == {"failed"}


def test_to_a_new_target_each_events_delivery_is_found_by_the_event(webhook, make_target):
    """A replay makes deliveries to its target faster than the database's statistics
    follow them: finding an event's delivery to the target goes by the (event,
    target) key, never by a scan of the target's deliveries (which PostgreSQL chose
    while it counted none, and read every one made so far for each event)."""
    old, new = make_target(name="old"), make_target(name="new")
    events = outage(webhook, [old], n=2000, outside=0)
    with analyzed(Event, Delivery):  # the outage, as a past one would be
        Delivery.objects.bulk_create(
            Delivery(event=e, target=new, status="failed", attempts=1) for e in events[:1500]
        )
        plan = criteria(webhook, target=old, to_target=new).rows()[:500].explain()
    job = replays.start(criteria(webhook, target=old, to_target=new))
    # SQLite names the unique constraint's index itself.
    by_key = {"postgresql": "delivery_event_target_uniq", "sqlite": "sqlite_autoindex"}
    assert by_key[connection.vendor] in plan, plan
    assert "delivery_target_" not in plan, plan
    run_steps(job, window=500)
    assert (job.matched, job.queued, job.skipped, job.delivered) == (2000, 2000, 0, 2000)
    assert set(Delivery.objects.filter(target=new).values_list("event", "status")) == {
        (e.pk, "delivered") for e in events
    }


def test_to_a_target_an_event_already_on_its_way_there_is_skipped(webhook, make_target):
    old, new = make_target(name="old"), make_target(name="new")
    events = outage(webhook, [old], n=10, outside=0)
    Delivery.objects.create(event=events[0], target=new, status="retrying", attempts=1)
    Delivery.objects.create(event=events[1], target=new, status="failed", attempts=3)
    job = replays.start(criteria(webhook, to_target=new))
    run_steps(job)
    assert (job.matched, job.queued, job.skipped, job.delivered) == (10, 9, 1, 9)
    assert Delivery.objects.get(event=events[0], target=new).status == "retrying"
    assert Delivery.objects.get(event=events[1], target=new).attempts == 3  # set back, kept


def test_without_a_target_every_targets_failures_and_the_counts_say_how_they_ended(
    webhook, make_target
):
    a, b = make_target(name="a"), make_target(name="b")
    outage(webhook, [a, b], n=100, outside=10)
    job = replays.start(criteria(webhook, statuses=("failed",)))
    run_steps(job, window=30, finish_as="failed")
    assert (job.matched, job.queued, job.failed, job.delivered) == (200, 200, 200, 0)


def test_the_dry_run_counts_what_the_job_plans(webhook, make_target):
    a, b = make_target(name="a"), make_target(name="b")
    outage(webhook, [a, b], n=300, outside=20)
    for fields in ({}, {"target": a}, {"statuses": ("delivered",)}, {"to_target": b}):
        wanted = criteria(webhook, **fields)
        dry = wanted.count()
        job = replays.start(wanted)
        replays.plan(job.pk)
        job.refresh_from_db()
        assert job.matched == dry == job.items.count(), fields
        replays.cancel(job)


def test_pause_stops_queuing_within_one_window_and_resume_goes_on(webhook, make_target):
    a = make_target(name="a")
    outage(webhook, [a], n=500, outside=0)
    job = replays.start(criteria(webhook))
    replays.step({0}, 1, window=50)
    job.refresh_from_db()
    assert job.queued == 50
    assert replays.pause(job)
    Delivery.objects.filter(status="pending").update(status="delivered")
    for _ in range(3):
        replays.step({0}, 1, window=50)
    job.refresh_from_db()
    assert (job.state, job.queued, job.delivered) == ("paused", 50, 50)  # settled, not topped up
    assert replays.resume(job)
    run_steps(job, window=50)
    assert (job.state, job.queued, job.delivered) == ("done", 500, 500)


def test_cancel_sends_nothing_more_and_counts_what_was_on_its_way(webhook, make_target):
    a = make_target(name="a")
    outage(webhook, [a], n=500, outside=0)
    job = replays.start(criteria(webhook))
    replays.step({0}, 1, window=40)
    assert replays.cancel(job)
    assert not replays.cancel(job) and not replays.resume(job) and not replays.pause(job)
    replays.step({0}, 1, window=40)
    assert Delivery.objects.filter(status="pending").count() == 40
    assert not job.is_over()  # 40 still on their way
    Delivery.objects.filter(status="pending").update(status="delivered")
    replays.step({0}, 1, window=40)
    job.refresh_from_db()
    assert (job.state, job.matched, job.queued, job.delivered) == ("cancelled", 500, 40, 40)
    assert job.queued == job.delivered and job.is_over()
    assert not ReplayItem.objects.exists()
    assert not replays.step({0}, 1, window=40)  # nothing left to look at


def test_a_job_cancelled_with_nothing_on_its_way_is_over_at_once(webhook, make_target):
    a = make_target(name="a")
    outage(webhook, [a], n=30, outside=0)
    job = replays.start(criteria(webhook))
    replays.step({0}, 1, window=20)  # planned, 20 queued
    replays.pause(job)
    Delivery.objects.filter(status="pending").update(status="delivered")
    replays.step({0}, 1, window=20)  # settled; 10 waiting, none on its way
    assert ReplayItem.objects.filter(state=ReplayItem.State.DONE).count() == 20
    replays.cancel(job)
    job.refresh_from_db()
    assert job.state == "cancelled" and job.is_over()
    replays.step({0}, 1, window=20)  # its items tidied away
    assert not ReplayItem.objects.exists()


def test_a_job_paused_before_it_was_planned_is_planned_when_resumed(webhook, make_target):
    a = make_target(name="a")
    outage(webhook, [a], n=10, outside=0)
    job = replays.start(criteria(webhook))
    replays.pause(job)
    assert not replays.step({0}, 1)
    replays.resume(job)
    job.refresh_from_db()
    assert job.state == "planning"
    run_steps(job)
    assert (job.state, job.delivered) == ("done", 10)


def test_an_engine_plans_its_partitions_jobs_and_queues_its_partitions_targets(
    webhook, make_target
):
    a, b = make_target(name="a"), make_target(name="b")
    outage(webhook, [a, b], n=20, outside=0)
    job = replays.start(criteria(webhook))
    assert not replays.step({(job.pk + 1) % 2}, 2)  # another engine's job to plan
    replays.plan(job.pk)
    assert replays.step({a.pk % 2}, 2)
    assert set(Delivery.objects.filter(status="pending").values_list("target", flat=True)) == {a.pk}


def test_a_step_costs_a_few_queries_whatever_the_jobs_size(webhook, make_target):
    a = make_target(name="a")
    outage(webhook, [a], n=3_000, outside=0)
    job = replays.start(criteria(webhook))
    for _ in range(2):  # planned (two batches), 2 000 queued, 1 000 delivered
        replays.step({0}, 1, window=1_000)
        Delivery.objects.filter(status="pending").update(status="delivered")
    with CaptureQueriesContext(connection) as queries:
        replays.step({0}, 1, window=1_000)
    assert len(queries) <= 25, [q["sql"] for q in queries]
    job.refresh_from_db()
    assert (job.state, job.queued, job.delivered) == ("running", 3_000, 2_000)


def test_criteria_are_checked(webhook, make_target, user):
    a = make_target(name="a")
    other = Webhook.objects.create(name="other", owner=user)
    foreign = make_target(name="x", hook=other)
    cases = [
        ({"target": foreign}, "target"),
        ({"to_target": foreign}, "to_target"),
        ({"statuses": ("pending",)}, "statuses"),
        ({"statuses": ("lost",)}, "statuses"),
    ]
    for fields, field in cases:
        with pytest.raises(ValidationError) as raised:
            replays.start(criteria(webhook, **fields))
        assert field in raised.value.message_dict, fields
    with pytest.raises(ValidationError):
        replays.start(replays.Criteria(webhook, OUTAGE_END, OUTAGE_START))
    a.active = False
    a.save()
    with pytest.raises(ValidationError):
        replays.start(criteria(webhook, to_target=a))
    replays.start(criteria(webhook, to_target=make_target(name="b"), statuses=("retrying",)))
    assert not ReplayItem.objects.exists()


def test_the_engine_runs_a_job_against_a_receiver_and_holds_its_rate_limit(
    webhook, make_target, sink
):
    target = make_target(url=sink.url("/a"), name="a", rate_limit=100)
    events = outage(webhook, [target], n=400, outside=50)
    printed = io.StringIO()
    with RunningEngine():
        # As the on-call engineer would: the command starts the job and follows it.
        call_command(
            "replay",
            *("--webhook", str(webhook.pk), "--status", "failed", "--wait"),
            *("--since", OUTAGE_START.isoformat(), "--until", OUTAGE_END.isoformat()),
            stdout=printed,
        )
    job = ReplayJob.objects.get()
    assert (job.state, job.matched, job.queued, job.delivered) == ("done", 400, 400, 400)
    lines = printed.getvalue().splitlines()
    assert lines[0] == f"Replay job {job.pk} started (400 deliveries to send); the engines run it."
    assert lines[-1] == "done: matched 400, queued 400, delivered 400, failed 0"
    bodies = Counter(r.body for r in sink.requests())
    assert set(bodies) == {bytes(e.body) for e in events} and set(bodies.values()) == {1}
    at = sorted(r.at for r in sink.requests())
    # Never more than the limit (and its burst) within any second.
    assert max(sum(1 for t in at[i:] if t < start + 1.0) for i, start in enumerate(at)) <= 150


def test_an_inactive_target_is_left_out_and_one_deactivated_mid_job_is_skipped(
    webhook, make_target
):
    a, b, off = make_target(name="a"), make_target(name="b"), make_target(name="off")
    outage(webhook, [a, b, off], n=100, outside=0)
    Target.objects.filter(pk=off.pk).update(active=False)
    wanted = criteria(webhook)
    assert wanted.count() == 200  # nothing would send the inactive one's
    job = replays.start(wanted)
    replays.step({0}, 1, window=30)
    Target.objects.filter(pk=b.pk).update(active=False)
    run_steps(job, window=30)
    assert (job.state, job.matched, job.queued, job.skipped) == ("done", 200, 130, 70)
    assert job.is_over() and job.queued == job.delivered + job.failed + job.filtered


def test_a_paused_targets_items_wait_and_a_cancel_is_over_without_them(webhook, make_target):
    a = make_target(name="a")
    outage(webhook, [a], n=50, outside=0)
    job = replays.start(criteria(webhook))
    replays.step({0}, 1, window=20)  # 20 queued
    Delivery.objects.filter(status="pending").update(status="delivered")
    Target.objects.filter(pk=a.pk).update(paused=True)
    replays.step({0}, 1, window=20)
    job.refresh_from_db()
    assert (job.queued, job.delivered) == (20, 20)  # settled; nothing more queued
    replays.cancel(job)
    job.refresh_from_db()
    assert job.is_over()


def test_a_delivery_deleted_mid_job_does_not_keep_the_job_going(webhook, make_target):
    a = make_target(name="a")
    events = outage(webhook, [a], n=10, outside=0)
    job = replays.start(criteria(webhook))
    replays.step({0}, 1, window=5)
    Event.objects.filter(pk=events[0].pk).delete()  # retention, say: queued, then gone
    Event.objects.filter(pk=events[-1].pk).delete()  # waiting, then gone
    run_steps(job, window=5)
    assert job.state == "done" and job.is_over()
    assert not replays.step({0}, 1, window=5)  # not looked at again


def test_filtered_deliveries_replayed_are_sent_without_waiting_for_recovery(
    webhook, make_target, sink
):
    target = make_target(url=sink.url("/f"), name="f")
    history(webhook, [target], 30, start=OUTAGE_START, span=HOUR, status="filtered")
    Delivery.objects.update(attempts=0)  # never attempted, as filtering leaves them
    job = replays.start(criteria(webhook, statuses=("filtered",)))
    with RunningEngine():
        wait_until(
            lambda: ReplayJob.objects.get(pk=job.pk).state == "done",
            timeout=30,
            message="the job to finish (recovery would take DELIVERY_STALE_AFTER)",
        )
    assert len(sink.requests("/f")) == 30


def test_planning_goes_in_batches_that_resume_where_they_stopped(webhook, make_target, monkeypatch):
    a, b = make_target(name="a"), make_target(name="b")
    outage(webhook, [a, b], n=250, outside=20)
    monkeypatch.setattr(replays, "PLAN_BATCH", 100)
    job = replays.start(criteria(webhook))
    assert replays.plan(job.pk) == 100
    job.refresh_from_db()
    assert (job.state, job.matched) == ("planning", 100)
    replays.pause(job)
    assert replays.plan(job.pk) == 0  # paused: no batch
    replays.resume(job)
    job.refresh_from_db()
    assert job.state == "planning"  # its plan was not complete
    # Another engine's batch commits while this one reads its own: this one is
    # not written (its key moved), and nothing is planned twice.
    real_rows = replays.Criteria.rows

    def rows_then_a_crossing_batch(self, after=(0, 0)):
        rows = list(real_rows(self, after)[: replays.PLAN_BATCH])
        monkeypatch.setattr(replays.Criteria, "rows", real_rows)
        assert replays.plan(job.pk) == 100  # the other engine's
        return rows

    monkeypatch.setattr(replays.Criteria, "rows", rows_then_a_crossing_batch)
    assert replays.plan(job.pk) == 0
    while replays.plan(job.pk):
        pass
    job.refresh_from_db()
    assert (job.state, job.matched) == ("running", 500)
    items = list(ReplayItem.objects.order_by("id").values_list("event_id", "target_id"))
    assert len(set(items)) == 500 and items == sorted(items)  # each once, in order
    assert job.planned_at is not None


def test_events_received_while_a_job_is_planned_are_not_in_it(webhook, make_target, monkeypatch):
    a = make_target(name="a")
    outage(webhook, [a], n=300, outside=0)
    monkeypatch.setattr(replays, "PLAN_BATCH", 100)
    later = timezone.now() + datetime.timedelta(hours=1)
    job = replays.start(replays.Criteria(webhook, OUTAGE_START, later))
    assert job.until <= timezone.now()  # the window ends when the job starts
    replays.plan(job.pk)
    live = Event.objects.create(webhook=webhook, method="POST", body=b"{}")
    Delivery.objects.create(event=live, target=a, status="delivered", attempts=1)
    while replays.plan(job.pk):
        pass
    job.refresh_from_db()
    assert job.matched == 300
    assert not ReplayItem.objects.filter(event=live).exists()


def test_a_row_deleted_while_its_batch_is_read_is_left_out_not_an_error(
    webhook, make_target, monkeypatch
):
    a = make_target(name="a")
    events = outage(webhook, [a], n=50, outside=0)
    job = replays.start(criteria(webhook))
    real_rows = replays.Criteria.rows

    def rows_then_retention(self, after=(0, 0)):
        rows = list(real_rows(self, after))
        monkeypatch.setattr(replays.Criteria, "rows", real_rows)
        Event.objects.filter(pk=events[0].pk).delete()  # its delivery goes with it
        return rows

    monkeypatch.setattr(replays.Criteria, "rows", rows_then_retention)
    assert replays.plan(job.pk) == 0  # nothing written
    job.refresh_from_db()
    assert (job.state, job.matched) == ("planning", 0)
    assert replays.plan(job.pk) == 49
    job.refresh_from_db()
    assert (job.state, job.matched) == ("running", 49)

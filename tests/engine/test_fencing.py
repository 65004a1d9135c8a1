"""Fenced ownership (DESIGN §13): a lease checked before every send, and epochs
checked by every result's write. Steps on this thread; the lock manager on a real
PostgreSQL; whole processes under faults in tests/e2e/test_faults.py."""

import asyncio
import threading
import time

import pytest
from django.db import connection
from django.utils import timezone

from deliveries.engine.handover import Handover
from deliveries.engine.lease import Lease
from deliveries.engine.lock import open_raw_connection
from deliveries.engine.partition_manager import PartitionManager
from deliveries.engine.partitions import LOCK_NAMESPACE, Partitions
from deliveries.engine.writer import Written
from deliveries.models import Delivery, DeliveryResult, EngineStatus, Partition, Target
from tests.support.clock import FakeClock
from tests.support.engines import make_engine, store
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("fencing guards PostgreSQL's many engines; SQLite has one, by flock")


def fenced_engine(partitions=1, lease=None, **options):
    """An engine holding every partition under epoch 1, as a manager's take leaves it."""
    for p in range(partitions):
        Partition.objects.update_or_create(number=p, defaults={"epoch": 1, "holder": "me"})
    held = Partitions(partitions, held=(), lease=lease)
    engine = make_engine(partitions=held, **options)
    Handover(engine).take(dict.fromkeys(range(partitions), 1))
    return engine


def claimed(entrypoint, target):
    """A fenced engine and the task of one event to `target`, claimed under epoch 1."""
    engine = fenced_engine()
    store(entrypoint)
    assert engine.intake_once() == 1
    task = engine.channel.get(0)
    assert task.fence == (0, 1) and task.target_id == target.pk
    return engine, task


def test_a_late_result_never_sets_back_what_the_new_owner_delivered(entrypoint, make_target, sink):
    postgresql_only()
    target = make_target(url=sink.url("/a"), max_retries=5)
    sink.always("/a", 500)
    engine, task = claimed(entrypoint, target)

    # Meanwhile this engine was cut off; another took the partition and delivered.
    Partition.objects.filter(number=0).update(epoch=2, holder="other")
    delivery = Delivery.objects.get(target=target)
    Delivery.objects.filter(id=delivery.id).update(status="delivered", attempts=1)
    DeliveryResult.objects.create(delivery=delivery, target=target, attempt=1, success=True)

    written = []
    engine.writer.on_written = lambda result, how: written.append(how)
    engine.partitions.epochs[0] = 1  # the cut-off engine still believes in epoch 1
    engine.process(task)  # sent (its lease is valid), answered 500: a retry
    assert written == [Written.STALE]
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == ("delivered", 1)
    assert list(DeliveryResult.objects.values_list("attempt", "success")) == [(1, True)]


def test_a_refused_write_stops_the_engine_claiming_in_that_partition(entrypoint, make_target, sink):
    """A write refused under the epoch the engine still believes in proves the
    partition was taken from it. Reading the row again then claimed it under that
    same epoch and sent it again, within the lease: a duplicate the new owner's
    attempt would add to (found from outside in the 300-fault run)."""
    postgresql_only()
    target = make_target(url=sink.url("/a"), max_retries=5)
    sink.always("/a", 500)
    engine, task = claimed(entrypoint, target)
    # Another engine took the partition; the delivery waits there, unattempted yet.
    Partition.objects.filter(number=0).update(epoch=2, holder="other")

    engine.process(task)  # sent (its lease is valid), answered 500: its write refused
    assert engine.channel.depth() == 0
    assert not engine.partitions.may_claim(target.pk)
    engine.intake_once()
    engine.recover_once()
    assert engine.channel.depth() == 0
    assert len(sink.requests("/a")) == 1
    assert Delivery.objects.get(target=target).attempts == 0  # the new owner's to make


def test_a_take_waits_for_a_write_in_progress_and_then_fences_it_off(entrypoint, make_target, sink):
    """The take's epoch bump and a result's write are ordered by the partition row's
    lock: a write holding it finishes first (the taker's recovery sees it); a write
    after the bump changes nothing."""
    postgresql_only()
    engine, task = claimed(entrypoint, make_target(url=sink.url("/a")))
    holder = open_raw_connection()
    taker = open_raw_connection()
    try:
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM deliveries_partition WHERE number = 0 FOR SHARE")
        bumped = threading.Event()

        def take():
            taker.execute("UPDATE deliveries_partition SET epoch = epoch + 1 WHERE number = 0")
            bumped.set()

        thread = threading.Thread(target=take)
        thread.start()
        assert not bumped.wait(0.5)  # the take waits for the share lock
        holder.execute("COMMIT")
        thread.join(10)
        assert bumped.is_set()
    finally:
        holder.close()
        taker.close()
    written = []
    engine.writer.on_written = lambda result, how: written.append(how)
    engine.process(task)
    assert written == [Written.STALE]
    assert Delivery.objects.get().status == "pending"
    assert not DeliveryResult.objects.exists()


def test_an_engine_whose_lease_ran_out_sends_nothing_until_it_is_renewed(
    entrypoint, make_target, sink
):
    make_target(url=sink.url("/a"))
    clock = FakeClock()
    lease = Lease(2.0, clock=clock)
    lease.confirm(clock())
    engine = make_engine(partitions=Partitions(1, lease=lease))
    engine.recover_once(at_start=True)
    store(entrypoint, n=2)
    engine.intake_once()
    engine.process_one()
    assert len(sink.requests("/a")) == 1

    clock.now += 2.5  # frozen, or the lock connection silent: the lease ran out
    engine.process_one()
    assert sink.requests("/a")[1:] == []
    assert engine.scheduler.pending() == 1 and engine.inflight.held() == 1  # still owned

    lease.confirm(clock())  # a round trip came back: the locks stand
    (task,) = engine.scheduler.take(lambda t: True)
    engine.inflight.release(task.delivery_id)  # the scheduler's reference
    engine.process(task)
    assert len(sink.requests("/a")) == 2
    assert sorted(Delivery.objects.values_list("status", flat=True)) == ["delivered"] * 2


def test_an_attempt_the_loop_starts_after_the_lease_ran_out_is_not_sent(
    entrypoint, make_target, sink
):
    """The lease is checked when the HTTP client's loop starts the request, not only
    when a worker hands it over: a loop that stalled (the process frozen, say) past
    the lease must not send what waited on it, the partition perhaps another
    engine's by then. The attempt is not counted; it waits for a renewed lease."""
    from deliveries.targets import transport

    target = make_target(url=sink.url("/late"))
    clock = FakeClock()
    lease = Lease(2.0, clock=clock)
    lease.confirm(clock())
    engine = make_engine(partitions=Partitions(1, lease=lease))
    engine.sender.running = True
    completer = threading.Thread(target=engine.sender.run)
    completer.start()
    engine.recover_once(at_start=True)
    store(entrypoint)
    engine.intake_once()
    stall = threading.Event()
    transport.client.submit(asyncio.sleep(0))  # the loop runs
    transport.client._running_loop().call_soon_threadsafe(stall.wait)  # and stalls
    try:
        assert engine.process_one() is True  # handed to the loop, which is busy
        clock.now += 2.5  # the lease runs out meanwhile
    finally:
        stall.set()
    wait_until(lambda: engine.scheduler.pending() == 1, timeout=10, message="held back")
    engine.sender.stop()
    completer.join(10)

    assert sink.requests("/late") == []
    delivery = Delivery.objects.get(target=target)
    assert (delivery.status, delivery.attempts) == ("pending", 0)
    assert not DeliveryResult.objects.exists()


def test_a_stale_task_is_read_again_when_the_engine_took_its_partition_back(
    entrypoint, make_target, sink
):
    """Lost and taken again while a task of the old tenure was still held: the
    take's recovery skipped it, so letting it go reads it again, under the new epoch."""
    postgresql_only()
    engine, task = claimed(entrypoint, make_target(url=sink.url("/a")))
    handover = Handover(engine)
    handover.drop_all()
    Partition.objects.filter(number=0).update(epoch=2)
    assert handover.take({0: 2}) == 0  # the old task is still held: skipped
    engine.process(task)  # claimed under epoch 1: not sent, read again under 2
    assert sink.requests("/a") == []
    again = engine.channel.get(0)
    assert again.fence == (0, 2)
    engine.process(again)
    assert len(sink.requests("/a")) == 1
    assert Delivery.objects.get().status == "delivered"


def sent_but_unwritten(entrypoint, make_target, sink, monkeypatch):
    """A fenced engine whose one attempt was sent and answered 200, and whose result's
    write failed (PostgreSQL restarting): the result kept, to be written again."""
    from django.db import OperationalError

    from deliveries.engine import writer

    engine, task = claimed(entrypoint, make_target(url=sink.url("/a")))
    real = writer.write_results

    def restarting(batch):
        monkeypatch.setattr(writer, "write_results", real)
        raise OperationalError("the database system is shutting down")

    monkeypatch.setattr(writer, "write_results", restarting)
    engine.process(task)
    assert len(sink.requests("/a")) == 1 and task.unwritten is not None
    return engine


@pytest.mark.parametrize(
    ("taken_again_at", "requests"),
    [
        # By this engine alone: nobody else claimed the row, the result is written.
        (2, 1),
        # Another engine held the partition at epoch 2 meanwhile: the result is
        # refused, and the event is read again and sent again, as at-least-once asks.
        (3, 2),
    ],
)
def test_a_result_whose_write_failed_survives_the_lock_connection_going(
    entrypoint, make_target, sink, monkeypatch, taken_again_at, requests
):
    """PostgreSQL restarted with a result on its way: its write failed, and the lock
    connection went with every partition. A fault run found such deliveries sent
    again about 19 s later: dropped from memory with the partitions, then read
    again by the take's recovery, though the engine had the result."""
    postgresql_only()
    engine = sent_but_unwritten(entrypoint, make_target, sink, monkeypatch)
    handover = Handover(engine)
    handover.drop_all()
    Partition.objects.filter(number=0).update(epoch=taken_again_at)
    assert handover.take({0: taken_again_at}) == 0  # the kept task is held: skipped

    (kept,) = engine.scheduler.take(lambda t: True)
    engine.process(kept)
    if requests > 1:
        engine.process(engine.channel.get(0))  # read again under the new epoch

    assert len(sink.requests("/a")) == requests
    assert Delivery.objects.get().status == "delivered"
    assert DeliveryResult.objects.count() == 1
    assert engine.inflight.held() == 0


@pytest.mark.parametrize("takes", [[2], [2, 3]])
def test_a_kept_result_is_written_under_this_engines_take_before_the_take_is_used(
    entrypoint, make_target, sink, monkeypatch, takes
):
    """The take's epoch commits before the engine puts the partition to use (its
    recovery runs later in the step, or after a previous holder's lease): a kept
    result retried in between is refused by the fence, yet every take since its
    epoch was this engine's, so it is written under the latest, and the take's
    recovery then finds the delivery done. Also across two takes of this engine's
    with none of another's between."""
    postgresql_only()
    engine = sent_but_unwritten(entrypoint, make_target, sink, monkeypatch)
    handover = Handover(engine)
    handover.drop_all()
    for epoch in takes:  # what the partition manager records as each TAKE commits
        Partition.objects.filter(number=0).update(epoch=epoch)
        engine.partitions.took(0, epoch)

    (kept,) = engine.scheduler.take(lambda t: True)
    engine.process(kept)
    assert Delivery.objects.get().status == "delivered"
    assert handover.take({0: takes[-1]}) == 0

    assert len(sink.requests("/a")) == 1
    assert DeliveryResult.objects.count() == 1
    assert engine.inflight.held() == 0


def test_a_kept_result_outlives_its_target_being_made_ordered(
    entrypoint, make_target, sink, monkeypatch
):
    """A target whose order changes has its waiting tasks dropped and its rows read
    again from the oldest. A task holding a result not written yet stays (held,
    so the new read skips its row) and writes it: the event is sent once."""
    postgresql_only()
    engine = sent_but_unwritten(entrypoint, make_target, sink, monkeypatch)
    Target.objects.update(ordered=True, updated_at=timezone.now())
    engine.refresh_targets(force=True)

    (kept,) = engine.scheduler.take(lambda t: True)
    engine.process(kept)
    while engine.process_one():
        pass

    assert len(sink.requests("/a")) == 1
    assert Delivery.objects.get().status == "delivered"
    assert engine.inflight.held() == 0


def test_a_kept_result_is_written_before_anyone_takes_the_partition_again(
    entrypoint, make_target, sink, monkeypatch
):
    """No engine holds the partition yet: its epoch is still the task's, so the write
    is fenced as it would be under the lock, and whoever takes the partition next
    finds the delivery done."""
    postgresql_only()
    engine = sent_but_unwritten(entrypoint, make_target, sink, monkeypatch)
    Handover(engine).drop_all()

    (kept,) = engine.scheduler.take(lambda t: True)
    engine.process(kept)

    assert Delivery.objects.get().status == "delivered"
    assert DeliveryResult.objects.count() == 1
    assert engine.inflight.held() == 0
    Partition.objects.filter(number=0).update(epoch=2)
    assert Handover(engine).take({0: 2}) == 0
    assert len(sink.requests("/a")) == 1


def test_an_attempt_held_back_by_its_lease_leaves_the_breakers_probe_for_later(
    entrypoint, make_target, sink
):
    target = make_target(url=sink.url("/a"), max_retries=5)
    clock = FakeClock()
    lease = Lease(2.0, clock=clock)
    lease.confirm(clock())
    engine = make_engine(partitions=Partitions(1, lease=lease))
    engine.recover_once(at_start=True)
    store(entrypoint)
    engine.intake_once()
    breaker = engine.targets.get(target.pk).circuit_breaker()
    breaker.state, breaker.opened_until = breaker.OPEN, 0.0  # the next attempt probes

    clock.now += 2.5  # the lease ran out
    engine.process_one()
    assert sink.requests("/a") == []

    lease.confirm(clock())
    (task,) = engine.scheduler.take(lambda t: True)
    engine.inflight.release(task.delivery_id)
    engine.process(task)
    assert len(sink.requests("/a")) == 1  # the probe, not deferred by a phantom one
    assert breaker.state == breaker.CLOSED


def manager(name, partitions=8, **options):
    engine = make_engine(partitions=Partitions(partitions, held=(), lease=Lease(2.0)))
    EngineStatus.objects.create(name=name)
    return PartitionManager(
        Handover(engine),
        name=name,
        interval=0.0,
        evict_after=options.pop("evict_after", 10.0),
        connect=lambda: open_raw_connection(deadline=2.0),
        **options,
    )


def test_every_take_raises_the_epoch_and_a_clean_hand_over_needs_no_wait():
    postgresql_only()
    first = manager("first")
    try:
        first.step()
        assert first.partitions.held == set(range(8))
        assert first.lease.valid()
        epochs = dict(Partition.objects.values_list("number", "epoch"))
        assert epochs == dict.fromkeys(range(8), 1) == first.partitions.epochs
        first.leave(timeout=5)
        assert first.partitions.held == set()
        assert set(Partition.objects.values_list("holder", flat=True)) == {""}
    finally:
        first.close()
    second = manager("second")
    try:
        second.step()  # no previous holder's lease to wait out: in use at once
        assert second.partitions.held == set(range(8))
        assert set(Partition.objects.values_list("epoch", flat=True)) == {2}
    finally:
        second.close()


def test_a_partition_lost_uncleanly_is_used_only_once_the_holders_lease_is_over():
    postgresql_only()
    first, second = manager("first"), manager("second")
    try:
        first.step()
        with connection.cursor() as cursor:  # what a middlebox's reset does
            cursor.execute("SELECT pg_terminate_backend(%s)", [first.backend_pid])
        second.step()
        assert len(second._taken) == 8 and second.partitions.held == set()
        wait = min(at for _, at in second._taken.values()) - second.clock()
        assert 0.5 < wait <= 2.0  # what is left of first's lease
        first.step()  # the loss noticed
        assert first.partitions.held == set() and not first.lease.valid()
    finally:
        first.close()
        second.close()


def test_an_engine_whose_lease_is_stale_is_evicted():
    postgresql_only()
    first, second = manager("first", evict_after=1.0), manager("second", evict_after=1.0)
    try:
        first.step()
        pid = first.backend_pid

        def gone():  # first renews no more, as if frozen: evicted a second on
            second.step()
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
                return cursor.fetchone()[0] == 0

        wait_until(gone, timeout=10, message="first evicted")
        second.step()
        assert len(second.partitions.held) + len(second._taken) == 8
    finally:
        first.close()
        second.close()


def test_the_first_engine_back_after_a_blip_takes_only_its_share():
    postgresql_only()
    engines = [manager(f"e{n}") for n in range(4)]
    try:
        for m in engines:
            m.step()
        for m in engines:
            m.step()
        assert sorted(len(m.partitions.held) for m in engines) == [2, 2, 2, 2]
        with connection.cursor() as cursor:  # the database restarts: every session ends
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name LIKE 'webhooker engine %%' "
                "AND datname = current_database()"
            )
        for m in engines:
            m.step()  # each notices
        engines[0]._retry_at = 0.0
        engines[0].step()  # the first back
        assert len(engines[0]._taken) + len(engines[0].partitions.held) == 2
    finally:
        for m in engines:
            m.close()


def test_a_stuck_engine_lets_every_partition_go():
    postgresql_only()
    stuck = manager("stuck")
    try:
        stuck.step()
        assert stuck.partitions.held == set(range(8))
        stuck.healthy = lambda: False
        stuck.step()
        assert stuck.partitions.held == set() and stuck.conn is None
        assert not stuck.lease.valid()
        stuck._retry_at = 0.0
        stuck.step()
        assert stuck.conn is None  # no reconnecting while stuck
    finally:
        stuck.close()


def test_the_healthcheck_gives_a_partition_between_owners_a_short_grace():
    import datetime

    from django.utils import timezone

    from deliveries.models import EngineCluster

    now = timezone.now()
    EngineCluster.objects.create(partitions=2)
    EngineStatus.objects.create(name="a", heartbeat_at=now, partitions=[0])
    assert EngineStatus.objects.coverage(now).unheld == [1]
    # Handed over a second ago: on its way to the next owner.
    Partition.objects.create(number=1, epoch=3, changed_at=now - datetime.timedelta(seconds=1))
    assert EngineStatus.objects.coverage(now).unheld == []
    later = now + datetime.timedelta(seconds=Partition.HANDOVER_GRACE)
    assert EngineStatus.objects.coverage(later).unheld == [1]


def test_a_take_waiting_on_a_writers_fence_gives_up_that_partition_alone():
    """A result writer holds a partition's row while its batch commits; a take that
    waits on it past the lock timeout skips it, and keeps the connection and every
    other partition."""
    postgresql_only()
    Partition.objects.create(number=0, epoch=1)
    first = manager("first", partitions=2)
    writer = open_raw_connection()
    try:
        writer.execute("BEGIN")
        writer.execute("SELECT 1 FROM deliveries_partition WHERE number = 0 FOR SHARE")
        first.step()
        assert first.conn is not None and first.lease.valid()
        assert 0 not in first.partitions.held
        writer.execute("COMMIT")
        first.step()
        assert first.partitions.held == {0, 1}
    finally:
        writer.close()
        first.close()


def test_leaving_lets_go_of_partitions_locked_but_not_in_use_yet():
    postgresql_only()
    first, second = manager("first"), manager("second")
    try:
        first.step()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [first.backend_pid])
        second.step()
        assert len(second._taken) == 8  # waiting out first's lease
        second.leave(timeout=1)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s "
                "AND classid = %s",
                [second.backend_pid, LOCK_NAMESPACE],
            )
            assert cursor.fetchone()[0] == 0
    finally:
        first.close()
        second.close()


def test_a_long_take_keeps_the_lease_renewed():
    postgresql_only()
    first = manager("first", partitions=2)
    take = first.handover.take

    def slow_take(epochs):
        time.sleep(2.5)  # an at-start recovery reading a large backlog
        return take(epochs)

    first.handover.take = slow_take
    try:
        first.step()
        assert first.partitions.held == {0, 1}
        assert first.lease.valid()
    finally:
        first.close()


def test_a_reconnecting_engine_ends_only_its_own_earlier_session():
    """Application names are cut at 63 characters, so two engines' may read the
    same: a reconnect ends its own previous session by pid, never a namesake's."""
    postgresql_only()
    first = manager("first")
    namesake = open_raw_connection()
    try:
        namesake.execute(
            "SELECT set_config('application_name', %s, false)", (first.application_name,)
        )
        first.step()
        old = first.backend_pid
        first.lost()
        first._retry_at = 0.0
        first.step()  # reconnects
        assert first.backend_pid != old
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [old])
            assert cursor.fetchone()[0] == 0  # its own old session: ended (or gone)
        assert namesake.execute("SELECT 1").fetchone() == (1,)  # the namesake: untouched
    finally:
        namesake.close()
        first.close()


def test_a_result_written_again_is_not_a_second_result_of_its_attempt(entrypoint, make_target):
    """A write whose COMMIT's answer was lost did commit; the kept result is then
    written again (drop_all keeps it): the attempt still has one result."""
    postgresql_only()
    from deliveries.engine.attempts import AttemptResult
    from deliveries.engine.claims import load_tasks
    from deliveries.engine.writer import write_results
    from deliveries.targets.base import Outcome

    make_target(url="http://127.0.0.1:9/x")
    store(entrypoint)
    [task] = load_tasks(Delivery.objects.values_list("id", flat=True))
    result = AttemptResult(task, Outcome(success=True, status_code=200), "delivered", None, 3)
    write_results([result])
    write_results([result])
    assert DeliveryResult.objects.count() == 1

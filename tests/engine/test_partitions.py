"""Partitioned ownership: the arithmetic, the engine's steps (take, drain, drop) and
the lock manager; real processes on PostgreSQL in tests/e2e/test_scaleout.py."""

import threading

import pytest
from django.db import connection

from deliveries.engine.handover import Handover
from deliveries.engine.lock import open_raw_connection
from deliveries.engine.partition_manager import (
    PartitionManager,
    check_session,
    record_partition_count,
    warn_without_autovacuum,
)
from deliveries.engine.partitions import (
    PartitionMismatch,
    Partitions,
    SessionUnsupported,
    fair_share,
    lock_holders,
    plan,
)
from deliveries.models import Delivery, EngineCluster
from tests.support.engines import make_engine, pump, store

pytestmark = pytest.mark.django_db(transaction=True)


def postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("partition locks are PostgreSQL session advisory locks; SQLite has one")


@pytest.mark.parametrize("live", range(1, 12))
def test_fair_shares_cover_every_partition(live):
    share = fair_share(64, live)
    assert share * live >= 64 > (share - 1) * live


def test_plan_hands_over_the_excess_and_takes_up_to_the_share():
    assert plan(64, set(range(64)), 1) == (0, [])
    assert plan(64, set(range(64)), 3) == (0, list(range(22, 64)))
    assert plan(64, set(range(22)), 4) == (0, [16, 17, 18, 19, 20, 21])
    assert plan(64, set(), 4) == (16, [])
    assert plan(64, {1, 2}, 2) == (30, [])


def two_targets(make_target, sink):
    """Two targets in different partitions of two (consecutive ids)."""
    a = make_target(url=sink.url("/a"), name="a", max_retries=3)
    b = make_target(url=sink.url("/b"), name="b", max_retries=3)
    return a, b


def take_one(engine, target):
    """One of the target's tasks off the channel, as a worker would get it."""
    first, *rest = engine.channel.take(lambda t: t.target_id == target.pk)
    for task in rest:
        engine.channel.put(task)
    return first


def statuses(target):
    return sorted(Delivery.objects.filter(target=target).values_list("status", flat=True))


def test_an_engine_claims_and_attempts_only_in_its_partitions(entrypoint, make_target, sink):
    a, b = two_targets(make_target, sink)
    partitions = Partitions(2, held={a.pk % 2})
    engine = make_engine(partitions=partitions)
    engine.recover_once(at_start=True)
    store(entrypoint, n=3)
    pump(engine, until=lambda: statuses(a) == ["delivered"] * 3)
    engine.recover_once()
    assert engine.intake_once() == 0
    assert sink.requests("/b") == [] and statuses(b) == ["pending"] * 3
    assert engine.inflight.held() == 0

    # Taking a partition runs the at-start recovery over it.
    assert Handover(engine).take({b.pk % 2: None}) == 3
    pump(engine, until=lambda: statuses(b) == ["delivered"] * 3)
    assert len(sink.requests("/b")) == 3 and engine.inflight.held() == 0


def test_a_taken_partitions_backlog_past_the_channels_room_is_read_later(
    entrypoint, make_target, sink
):
    a, b = two_targets(make_target, sink)
    engine = make_engine(partitions=Partitions(2, held={a.pk % 2}), channel_size=2)
    engine.recover_once(at_start=True)
    store(entrypoint, n=6)
    pump(engine, until=lambda: statuses(a) == ["delivered"] * 6)
    assert Handover(engine).take({b.pk % 2: None}) == 2  # the channel's room
    assert engine.targets.overflowing(b.pk)
    pump(engine, until=lambda: statuses(b) == ["delivered"] * 6)
    assert len(sink.requests("/b")) == 6 and engine.inflight.held() == 0


def test_draining_lets_go_of_waiting_work_and_waits_for_the_running_attempt(
    entrypoint, make_target, sink
):
    a, b = two_targets(make_target, sink)
    pa, pb = a.pk % 2, b.pk % 2
    sink.always("/b", 500)
    sink.delays["/a"] = 0.5
    engine = make_engine(partitions=Partitions(2))
    engine.recover_once(at_start=True)
    store(entrypoint, n=2)
    assert engine.intake_once() == 4
    # b: one attempt fails and waits in the scheduler for its retry, one waits in
    # the channel.
    engine.process(take_one(engine, b))
    assert engine.scheduler.pending() == 1

    handover = Handover(engine)
    handover.start_drain([pb])
    assert handover.drained([pb]) == [pb]  # nothing of b is held any more
    assert sorted(Delivery.objects.filter(target=b).values_list("status", "attempts")) == [
        ("pending", 0),
        ("retrying", 1),
    ]
    assert Delivery.objects.get(target=b, status="retrying").next_attempt_at is not None
    assert not engine.partitions.may_claim(b.pk)

    # a: one attempt running (the sink answers after 0.5 s) when the drain starts.
    running = threading.Thread(target=engine.process, args=(take_one(engine, a),))
    running.start()
    sink.wait_for(1, "/a")
    handover.start_drain([pa])
    assert handover.drained([pa]) == []  # its result is not committed yet
    running.join(10)
    assert handover.drained([pa]) == [pa]
    assert engine.inflight.held() == 0 and engine.channel.depth() == 0
    assert sorted(Delivery.objects.filter(target=a).values_list("status", "attempts")) == [
        ("delivered", 1),
        ("pending", 0),
    ]
    assert len(sink.requests("/a")) == 1 and len(sink.requests("/b")) == 1


def test_a_lost_lock_drops_every_partition_at_once_and_writes_nothing(
    entrypoint, make_target, sink
):
    _, b = two_targets(make_target, sink)
    sink.always("/b", 500)
    engine = make_engine(partitions=Partitions(2))
    engine.recover_once(at_start=True)
    store(entrypoint, n=2)
    engine.intake_once()
    engine.process(take_one(engine, b))  # its retry waits in the scheduler
    before = list(Delivery.objects.order_by("id").values_list("status", "attempts", "updated_at"))

    assert Handover(engine).drop_all() == {0, 1}
    assert engine.inflight.held() == 0 and engine.channel.depth() == 0
    assert engine.scheduler.pending() == 0
    assert engine.intake_once() == 0 and engine.recover_once() == 0
    after = list(Delivery.objects.order_by("id").values_list("status", "attempts", "updated_at"))
    assert after == before
    assert len(sink.requests()) == 1


def test_the_partition_count_is_recorded_once_and_a_mismatch_refuses():
    assert record_partition_count(64) == 64
    assert record_partition_count(64) == 64
    with pytest.raises(PartitionMismatch, match=r"use 64 partitions.*DELIVERY_PARTITIONS is 16"):
        record_partition_count(16)
    assert EngineCluster.objects.get().partitions == 64


def test_an_engine_warns_when_the_server_does_not_autovacuum(caplog):
    postgresql_only()
    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        off = cursor.fetchone()[0] == "off"
        with caplog.at_level("WARNING", logger="deliveries.engine"):
            assert warn_without_autovacuum(cursor) is off
    warned = [r.getMessage() for r in caplog.records if "autovacuum off" in r.getMessage()]
    assert len(warned) == int(off)


class Pooled:
    """A connection behind a transaction-mode pooler: every statement may land on
    another server session, so a session lock is not there afterwards."""

    def __init__(self):
        self.pids = iter([101, 202, 303])

    def execute(self, sql, params=None):
        pid = next(self.pids, 404) if "pg_backend_pid" in sql else 0
        return type("Result", (), {"fetchone": lambda self: (pid,)})()


def test_a_connection_that_keeps_no_session_is_refused():
    with pytest.raises(SessionUnsupported, match="PgBouncer"):
        check_session(Pooled(), member=7)


def held_by_pid():
    with connection.cursor() as cursor:
        found = {}
        for partition, pids in lock_holders(cursor).items():
            for pid in pids:
                found.setdefault(pid, set()).add(partition)
        return found


def test_managers_share_the_partitions_and_a_lost_connection_is_survived():
    postgresql_only()

    def manager():
        engine = make_engine(partitions=Partitions(8, held=()))
        return PartitionManager(
            Handover(engine),
            name=f"test-{id(engine)}",
            interval=0.0,
            evict_after=10.0,
            connect=open_raw_connection,
        )

    first, second = manager(), manager()
    try:
        first.step()
        assert first.partitions.held == set(range(8))
        second.connect()
        first.step()  # two members now: hands four over (nothing running: at once)
        second.step()
        held = held_by_pid()
        assert {len(p) for p in held.values()} == {4}
        assert held[first.backend_pid] | held[second.backend_pid] == set(range(8))
        assert first.partitions.held == held[first.backend_pid]

        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [first.backend_pid])
        first.step()  # notices, drops everything, reconnects later
        assert first.partitions.held == set() and first.conn is None
        second.step()  # one member left: takes all
        assert second.partitions.held == set(range(8))
        first._retry_at = 0.0
        first.step()  # back: two members again
        second.step()
        first.step()
        assert len(first.partitions.held) == 4 and len(second.partitions.held) == 4
    finally:
        first.close()
        second.close()


def test_a_lock_session_ended_mid_step_is_a_lost_connection_not_a_traceback(caplog):
    """The server ends the lock session between the step's renewal and its next
    statement on that connection (seen in tests/e2e/test_scaleout.py's terminated
    session): the partitions are dropped as for any lost connection, logged
    without a traceback, and the loop goes on."""
    postgresql_only()
    engine = make_engine(partitions=Partitions(4, held=()))
    manager = PartitionManager(
        Handover(engine),
        name=f"test-{id(engine)}",
        interval=0.0,
        evict_after=10.0,
        connect=open_raw_connection,
    )
    stop = threading.Event()
    renew = manager.renew

    def renew_then_end_the_session():
        renewed = renew()
        if manager.partitions.held:  # the first step took them: end it in the next
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [manager.backend_pid])
            stop.set()
        return renewed

    try:
        manager.step()
        assert manager.partitions.held == set(range(4))
        manager.renew = renew_then_end_the_session
        manager.wait = lambda timeout, stop_event: None
        manager.run(stop)
        assert manager.conn is None and manager.partitions.held == set()
        assert not [r for r in caplog.records if r.exc_info], caplog.text
        assert "lock connection lost" in caplog.text
    finally:
        manager.close()


def test_serve_refuses_several_engines_on_sqlite():
    from django.core.management import CommandError, call_command

    if connection.vendor != "sqlite":
        pytest.skip("several engines are PostgreSQL's")
    with pytest.raises(CommandError, match="SQLite takes one engine per data directory"):
        call_command("serve", engines=2)


def test_health_dashboard_and_metrics_show_every_engine_and_the_unheld_partitions(
    admin_client, client
):
    from django.urls import reverse
    from django.utils import timezone

    from deliveries.metrics import render
    from deliveries.models import EngineStatus

    now = timezone.now()
    EngineCluster.objects.create(partitions=4)
    for n, held in enumerate(([0], [1], [2])):
        EngineStatus.objects.create(
            name=f"host-{n}:{100 + n}:abc",
            hostname=f"host-{n}",
            pid=100 + n,
            started_at=now,
            heartbeat_at=now,
            partitions=held,
            busy_workers=n,
            workers=10,
        )
    response = client.get("/.well-known/healthcheck")
    assert response.status_code == 503
    engine = response.json()["engine"]
    assert engine["unheld_partitions"] == [3] and engine["partitions"] == 4
    assert [(e["host"], e["pid"], e["partitions"]) for e in engine["engines"]] == [
        ("host-0", 100, [0]),
        ("host-1", 101, [1]),
        ("host-2", 102, [2]),
    ]
    body = admin_client.get(reverse("admin:index")).content.decode()
    assert "PID 100 on host-0" in body and "PID 102 on host-2" in body and "2 of 10" in body
    assert "1 of 4 partitions held by no engine: 3" in body and "not running" in body
    text = render().decode()
    assert "webhooker_engines 3.0" in text and "webhooker_partitions_unheld 1.0" in text
    assert "webhooker_engine_up 0.0" in text
    assert 'webhooker_engine_partitions_held_by_engine{engine="host-1:101:abc"} 1.0' in text

    EngineStatus.objects.filter(pid=102).update(partitions=[2, 3])
    assert client.get("/.well-known/healthcheck").status_code == 200
    assert "webhooker_engine_up 1.0" in render().decode()

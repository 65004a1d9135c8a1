"""The engine on real threads against real local HTTP servers."""

import threading
import time
from collections import Counter

import pytest

from deliveries.engine.core import Engine
from deliveries.engine.runner import Runner
from deliveries.models import Delivery, DeliveryResult
from tests.support.engines import RunningEngine, store
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def all_finished():
    return not Delivery.objects.unfinished().exists()


def test_every_event_reaches_every_target_exactly_once(entrypoint, make_target, sink):
    paths = ["/a", "/b", "/c"]
    for path in paths:
        make_target(url=sink.url(path), name=path)
    events = store(entrypoint, n=500)
    with RunningEngine() as runner:
        wait_until(all_finished, timeout=120, message="all deliveries to finish")
    assert runner.engine.inflight.held() == 0
    assert set(Delivery.objects.values_list("status", flat=True)) == {"delivered"}
    seen = Counter((r.path, r.headers["X-Webhooker-Event"]) for r in sink.requests())
    expected = {(path, str(e.code)) for path in paths for e in events}
    assert set(seen) == expected
    assert set(seen.values()) == {1}
    assert DeliveryResult.objects.count() == 1500


def test_a_hung_target_does_not_stall_a_healthy_one(entrypoint, make_target, sink):
    sink.hanging.add("/hung")
    hung = make_target(config={"url": sink.url("/hung"), "timeout": 30}, name="hung")
    healthy = make_target(url=sink.url("/ok"), name="ok")
    store(entrypoint, n=40)
    with RunningEngine(workers=4, target_concurrency=2) as runner:
        wait_until(
            lambda: Delivery.objects.filter(target=healthy, status="delivered").count() == 40,
            timeout=60,
            message="the healthy target's deliveries",
        )
        # The hung target's deliveries are all still outstanding, and owned.
        assert Delivery.objects.filter(target=hung, status="pending").count() == 40
        # Two attempts in flight (its share), and no worker waiting on them.
        assert runner.engine.sender.in_flight() == 2
        assert runner.workers.busy() == 0
        sink.hang.set()  # let the hung requests go so shutdown is quick
    assert runner.engine.inflight.held() == 0


def test_no_duplicates_with_intake_retries_and_ticks_racing(entrypoint, make_target, sink):
    """Recovery ticks every 10 ms with a zero stale threshold race intake and retries."""
    make_target(url=sink.url("/flaky"), name="flaky", max_retries=5)
    make_target(url=sink.url("/fast"), name="fast")
    for _ in range(60):
        sink.respond("/flaky", 500, 503)
    store(entrypoint, n=100)
    with RunningEngine(
        recovery_interval=0.01,
        stale_after=0,
        backoff_base=0.01,
        backoff_cap=0.05,
        breaker_cooldown=0.05,
    ) as runner:
        store(entrypoint, n=100)  # while it runs, through intake
        wait_until(all_finished, timeout=120, message="all deliveries to finish")
    assert runner.engine.inflight.held() == 0
    # Failures are scripted in a row, not per delivery: a few may run out of retries.
    assert Delivery.objects.filter(status="delivered").count() >= 350
    # Every request the sink saw is one recorded attempt, and vice versa.
    sent = Counter((r.path, r.headers["X-Webhooker-Delivery"]) for r in sink.requests())
    recorded = Counter(
        ("/" + t, str(d))
        for d, t in DeliveryResult.objects.values_list("delivery_id", "delivery__target__name")
    )
    assert sent == recorded
    fast = [n for (path, _), n in sent.items() if path == "/fast"]
    assert len(fast) == 200 and set(fast) == {1}


def test_stop_finishes_running_attempts_and_releases_everything(entrypoint, make_target, sink):
    make_target(url=sink.url("/slowish"), name="slow", max_retries=3)
    sink.always("/slowish", 500)
    store(entrypoint, n=30)
    with RunningEngine(workers=2, backoff_base=30) as runner:
        wait_until(lambda: runner.engine.scheduler.pending() >= 2, message="retries scheduled")
    assert runner.engine.inflight.held() == 0
    retrying = Delivery.objects.filter(status="retrying")
    assert retrying.count() >= 2
    assert all(d.next_attempt_at is not None for d in retrying)
    # Every attempt that started was recorded: none is left half-done.
    assert DeliveryResult.objects.count() == len(sink.requests("/slowish"))


def test_the_running_engine_prunes_old_events(entrypoint, make_target):
    import datetime

    from django.utils import timezone

    from deliveries.models import Event

    make_target("log")
    old, young = store(entrypoint, n=2)
    Delivery.objects.update(status="delivered", attempts=1)
    Event.objects.filter(pk=old.pk).update(received_at=timezone.now() - datetime.timedelta(days=31))
    running = RunningEngine()
    running.runner.housekeeping.first = 0.05  # instead of a minute after start
    with running:
        wait_until(lambda: not Event.objects.filter(pk=old.pk).exists(), message="retention to run")
    assert Event.objects.filter(pk=young.pk).exists()


def test_the_writer_outlives_a_failure_after_its_commit(entrypoint, make_target, sink):
    """A database error in what follows a committed result (the target's control
    state, with the connection gone) once ended the writer's thread, and with it
    every later result of the engine (found under injected faults)."""
    import threading

    from deliveries.engine.writer import ResultWriter, Written
    from tests.support.engines import make_engine as build

    make_target(url=sink.url("/a"))
    engine = build()
    engine.recover_once(at_start=True)
    store(entrypoint, n=2)
    engine.intake_once()
    told = []

    def on_written(result, written):
        told.append(written)
        if len(told) == 1:
            raise RuntimeError("after the commit")

    writer = ResultWriter(on_written=on_written)
    engine.writer = writer
    stop = threading.Event()
    thread = threading.Thread(target=writer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        engine.process_one()
        engine.process_one()
        deadline = time.monotonic() + 30
        while len(told) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert told == [Written.COMMITTED, Written.COMMITTED]
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join(10)


def test_intake_waits_for_room_in_a_full_channel_instead_of_spinning(entrypoint, make_target):
    """A full channel means the workers are the bottleneck: the rows wait in the
    database, and intake looks again a little later. Looking again at once only
    took the engine's CPU from the workers (a third of it, measured with slow
    transforms)."""
    import threading

    from deliveries.engine.runner import IntakeLoop
    from tests.support.engines import started_engine

    make_target(url="http://127.0.0.1:9/x")
    engine = started_engine(channel_size=2)
    store(entrypoint, n=5)
    passes = Counter()
    intake_once = engine.intake_once

    def counted():
        passes["n"] += 1
        return intake_once()

    engine.intake_once = counted
    loop = threading.Thread(target=IntakeLoop(engine).run)
    loop.start()
    wait_until(lambda: engine.channel.depth() == 2, timeout=10, message="a full channel")
    time.sleep(IntakeLoop.FULL_WAIT * 4)
    engine.stop_event.set()
    engine.wake_event.set()
    loop.join(10)
    assert engine.channel.depth() == 2
    assert passes["n"] <= 10


@pytest.mark.django_db(transaction=True)
def test_an_alert_stuck_in_its_channel_does_not_hold_the_engines_stop(entrypoint, monkeypatch):
    # The alerts thread waiting on a mail server that never answers: the engine's
    # stop waits for it a moment, not its whole drain time (310 s).
    stuck = threading.Event()

    def alert_stuck(engine):
        stuck.set()
        threading.Event().wait(600)

    monkeypatch.setattr(Engine, "alert_once", alert_stuck)
    running = RunningEngine()
    monkeypatch.setattr(Runner, "AUXILIARY_JOIN", 0.5)
    with running as runner:
        assert stuck.wait(10)
        started = time.monotonic()
        runner.stop()
        running.thread.join(30)
        assert not running.thread.is_alive()
        assert time.monotonic() - started < 10


def test_the_wake_socket_wakes_the_engine_once_bound(tmp_path):
    """A hint sent before the engine binds its socket is lost (no one listens yet),
    and the engine's first intake pass may have run before that event was stored:
    without a wake once bound, the event would wait for the next poll
    (DELIVERY_POLL_INTERVAL). PostgreSQL's listener wakes once LISTEN holds."""
    from deliveries.engine.wakeup import SocketListener

    woken = threading.Event()
    listener = SocketListener(str(tmp_path / "wake.sock"), woken)
    try:
        assert listener.start()
        assert woken.is_set()
    finally:
        listener.stop()

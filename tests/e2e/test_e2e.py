"""End to end with real processes: gunicorn, rundelivery and a local sink."""

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import requests
from django.conf import settings
from django.db import connection

from deliveries.models import Delivery, EngineStatus, Event
from tests.support.processes import (
    Process,
    children,
    free_port,
    post_events,
    process_env,
    rundelivery_command,
    start_engine,
    start_web,
    wait_answering,
    wait_until,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]

FAST = {"DELIVERY_POLL_INTERVAL": "0.2", "DELIVERY_BACKOFF_BASE": "0.05"}


def unfinished():
    return Delivery.objects.unfinished().count()


def test_kill_9_loses_nothing_and_duplicates_only_what_was_in_flight(
    entrypoint, make_target, sink, data_dir
):
    make_target(url=sink.url("/a"), name="a", max_retries=3)
    make_target(url=sink.url("/b"), name="b", max_retries=3)
    sink.delays["/a"] = sink.delays["/b"] = 0.01
    web, base = start_web(data_dir, **FAST)
    engine = start_engine(data_dir, **FAST)
    try:
        codes = post_events(base, entrypoint, 300)
        wait_until(lambda: len(sink.requests()) >= 150, timeout=120, message="half delivered")
        engine.send(signal.SIGKILL)
        assert engine.wait() == -signal.SIGKILL

        # Let requests already on the wire land, then see which were sent but
        # never recorded: exactly the attempts in flight at the kill.
        def settled(previous=[-1]):
            now = len(sink.requests())
            done, previous[0] = now == previous[0], now
            return done

        wait_until(settled, timeout=10, interval=0.3, message="sink to settle")
        received = {(r.path, r.headers["X-Webhooker-Event"]) for r in sink.requests()}
        pending = {
            ("/" + name, str(code))
            for name, code in Delivery.objects.unfinished().values_list(
                "target__name", "event__code"
            )
        }
        in_flight = len(received & pending)
        assert unfinished() > 0, "the kill came too late to test anything"

        engine = start_engine(data_dir, **FAST)
        wait_until(lambda: unfinished() == 0, timeout=120, message="every delivery finished")

        if connection.vendor == "sqlite":  # on PostgreSQL engines share partitions
            second = start_engine(data_dir)
            assert second.wait(30) != 0
            assert f"pid {engine.pid}" in second.log()

        assert engine.stop(signal.SIGTERM) == 0
    finally:
        web.stop()
        engine.stop(signal.SIGKILL)

    assert set(Delivery.objects.values_list("status", flat=True)) == {"delivered"}
    seen = Counter((r.path, r.headers["X-Webhooker-Event"]) for r in sink.requests())
    assert set(seen) == {(path, code) for path in ("/a", "/b") for code in codes}
    duplicates = sum(seen.values()) - len(seen)
    assert duplicates <= in_flight
    assert "Traceback" not in engine.log()


def test_sigterm_lets_the_running_attempt_finish_and_exits_0(
    entrypoint, make_target, sink, data_dir
):
    make_target(url=sink.url("/slow"), name="slow")
    sink.delays["/slow"] = 1.5
    web, base = start_web(data_dir, workers=1, **FAST)
    engine = start_engine(data_dir, **FAST)
    try:
        post_events(base, entrypoint, 1)
        sink.wait_for(1, "/slow", timeout=30)
        engine.send(signal.SIGTERM)
        assert engine.wait(30) == 0
    finally:
        web.stop()
        engine.stop(signal.SIGKILL)
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("delivered", 1)
    status = EngineStatus.objects.get()
    assert status.stopped_at is not None and status.inflight == 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_taken_by_any_of_the_engines_threads_stops_it(data_dir, signum):
    """The kernel hands a process's signal to any of its threads that does not block
    it, not always the main one (a CI run saw it: one engine of three ran on 60 s
    after its SIGTERM, until killed). Python runs its handler only in the main
    thread, which must not then sleep on, unaware, until something wakes it. Here
    each of three engines gets it through a thread other than the main one, from a
    different third of its threads (kill(2) with a thread's id picks that thread
    first)."""
    for n in range(3):
        engine = start_engine(data_dir, **FAST)
        try:
            wait_until(
                lambda: EngineStatus.objects.filter(stopped_at=None).exists(),
                message="engine heartbeat",
            )
            threads = sorted(
                int(tid) for tid in os.listdir(f"/proc/{engine.pid}/task") if int(tid) != engine.pid
            )
            # From the n-th third of the list on, the first thread still there.
            for tid in threads[n * len(threads) // 3 :] + threads:
                try:
                    os.kill(tid, signum)
                    break
                except ProcessLookupError:
                    continue
            try:
                code = engine.wait(30)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the engine ran on after its signal:\n{engine.log()[-3000:]}")
            assert code == 0, engine.log()[-3000:]
        finally:
            engine.stop(signal.SIGKILL)
        assert not EngineStatus.objects.filter(stopped_at=None).exists()


@contextlib.contextmanager
def engine_under_ulimit(data_dir, option: str, name: str):
    """An engine started under `ulimit <option>`, once it has written its heartbeat;
    stopped with SIGTERM, which it must obey."""
    argv = shlex.join(rundelivery_command("-v", "1"))
    engine = Process(
        ["bash", "-c", f"ulimit {option} && exec {argv}"],
        process_env(data_dir),
        data_dir / f"rundelivery-{name}.log",
    )
    try:
        wait_until(
            lambda: EngineStatus.objects.filter(stopped_at=None).exists(),
            message="engine heartbeat",
        )
        yield engine
    finally:
        assert engine.stop(signal.SIGTERM) == 0


def test_the_engine_raises_its_open_files_limit_for_its_attempts_in_flight(data_dir):
    """A soft limit of 1 024 open files (a common default) is below the default
    DELIVERY_INFLIGHT: the engine raises it as far as the hard limit allows."""
    with engine_under_ulimit(data_dir, "-Sn 1024", "nofile") as engine:
        limits = Path(f"/proc/{engine.popen.pid}/limits").read_text()
        soft, hard = re.search(r"Max open files\s+(\S+)\s+(\S+)", limits).groups()
        assert int(soft) == min(int(hard), settings.DELIVERY_INFLIGHT + 1024)


def test_an_engine_whose_hard_limit_is_short_keeps_fewer_attempts_in_flight(data_dir):
    """Attempts past the open-files limit would fail as "connection failed" against
    their receivers: under a hard limit of 1 536 the engine keeps what fits beside
    its other files (1 024 of them: 512, and at least half the limit) and says so."""
    with engine_under_ulimit(data_dir, "-n 1536", "short-nofile") as engine:
        assert (
            "open files are limited to 1536 (the hard limit): 768 attempts in flight at most, "
            f"not DELIVERY_INFLIGHT={settings.DELIVERY_INFLIGHT}"
        ) in engine.log()


def test_wake_hint_carries_new_deliveries_not_the_poll(entrypoint, make_target, sink, data_dir):
    """With the poll at 30 s, only the hint can deliver within the test's time."""
    make_target(url=sink.url("/w"), name="w")
    slow_poll = {"DELIVERY_POLL_INTERVAL": "30"}
    web, base = start_web(data_dir, workers=1, **slow_poll)
    engine = start_engine(data_dir, **slow_poll)
    try:
        wait_until(
            lambda: EngineStatus.objects.filter(stopped_at=None).exists(),
            message="engine heartbeat",
        )
        post_events(base, entrypoint, 3)
        sink.wait_for(3, "/w", timeout=15)
    finally:
        web.stop()
        assert engine.stop(signal.SIGTERM) == 0


def stop_serve(data_dir, signals: int) -> tuple[Process, int, list[str]]:
    """Start `manage.py serve`, wait for its web side and engine, send it `signals`
    SIGINTs; return it, its exit code and the children it had."""
    port = free_port()
    env = process_env(data_dir, WEBHOOKER_BIND=f"127.0.0.1:{port}", WEB_CONCURRENCY=1)
    serve = Process([sys.executable, "manage.py", "serve"], env, data_dir / "serve.log")
    try:
        wait_answering(f"http://127.0.0.1:{port}/admin/login/", serve)
        wait_until(
            lambda: EngineStatus.objects.filter(stopped_at=None).exists(), message="serve's engine"
        )
        started = children(serve.pid)
        for _ in range(signals):
            serve.send(signal.SIGINT)
        returncode = serve.wait(60)
    finally:
        serve.stop(signal.SIGKILL)
    for pid in started:
        assert not os.path.exists(f"/proc/{pid}") or _zombie(pid), f"{pid} left running"
    return serve, returncode, started


def test_serve_runs_both_and_ctrl_c_stops_both(entrypoint, data_dir):
    serve, returncode, children = stop_serve(data_dir, signals=1)
    assert len(children) == 2
    assert returncode == 0, serve.log()
    assert re.search(r"finishing running attempts", serve.log())


def test_serve_survives_a_burst_of_signals_and_stops_everything(entrypoint, data_dir):
    """Ctrl-C pressed again and again (issue 30: a second signal could deadlock in
    serve's handler, leaving gunicorn and the engine running): serve passes them
    on and exits (a forced engine exit is a non-zero code), and nothing it started
    is left."""
    serve, returncode, children = stop_serve(data_dir, signals=20)
    assert len(children) == 2
    assert returncode in (0, 1), serve.log()


def _zombie(pid):
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split()[2] == "Z"


def test_once_delivers_what_is_outstanding_and_exits(entrypoint, make_target, sink, data_dir):
    from tests.support.engines import store

    make_target(url=sink.url("/once"), name="once")
    store(entrypoint, n=25)
    engine = start_engine(data_dir, "--once")
    assert engine.wait(60) == 0, engine.log()
    engine.stop()
    assert set(Delivery.objects.values_list("status", flat=True)) == {"delivered"}
    assert len(sink.requests("/once")) == 25


def test_serve_restarts_an_engine_that_dies_and_keeps_the_web_side(entrypoint, data_dir):
    port = free_port()
    env = process_env(data_dir, WEBHOOKER_BIND=f"127.0.0.1:{port}", WEB_CONCURRENCY=1)
    serve = Process([sys.executable, "manage.py", "serve"], env, data_dir / "serve.log")
    url = f"http://127.0.0.1:{port}/webhook/{entrypoint.code}"
    try:
        wait_answering(f"http://127.0.0.1:{port}/admin/login/", serve)
        wait_until(
            lambda: EngineStatus.objects.filter(stopped_at=None).exists(), message="serve's engine"
        )
        first = EngineStatus.objects.get(stopped_at=None).pid
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: "engine-0 started again" in serve.log(), message="the restart")
        assert f"engine-0 exited with code -{int(signal.SIGKILL)}" in serve.log()
        wait_until(
            lambda: EngineStatus.objects.exclude(pid=first).filter(stopped_at=None).exists(),
            message="the new engine's heartbeat",
        )
        answer = requests.post(url, json={}, headers={"X-Request-Id": "e2e-1"}, timeout=30)
        assert answer.status_code == 200
        # Through gunicorn's edge worker as well: the id comes back, and is kept.
        assert answer.headers["X-Request-Id"] == "e2e-1"
        assert Event.objects.filter(request_id="e2e-1").exists()
        assert serve.popen.poll() is None
        serve.send(signal.SIGINT)
        assert serve.wait(60) == 0, serve.log()
    finally:
        serve.stop(signal.SIGKILL)

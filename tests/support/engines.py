import time

from deliveries import ingest
from deliveries.engine.config import EngineConfig
from deliveries.engine.core import Engine
from deliveries.engine.runner import Runner
from deliveries.models import Event


def store(entrypoint, body=b'{"ok": true}', n=1, headers=None, content_type="application/json"):
    inbound = ingest.find_entrypoint(entrypoint.code, fresh=True)
    stored = [
        ingest.store_event(
            inbound,
            method="POST",
            headers=headers or [["Content-Type", content_type]],
            body=body,
            content_type=content_type,
            remote_addr="127.0.0.1",
        ).event_id
        for _ in range(n)
    ]
    events = Event.objects.in_bulk(stored)
    return [events[i] for i in stored]


def make_engine(clock=None, partitions=None, **options):
    """An engine with fast test timings; `options` are EngineConfig fields,
    `partitions` a partitions.Partitions (default: the one partition, held)."""
    defaults = {"workers": 1, "poll_interval": 0.05, "backoff_base": 0.01, "backoff_cap": 1.0}
    config = EngineConfig(**{**defaults, **options})
    return Engine(config, clock=clock or time.monotonic, partitions=partitions)


def started_engine(**options):
    """An engine past its at-start recovery, as rundelivery has it before intake."""
    engine = make_engine(**options)
    engine.recover_once(at_start=True)
    return engine


def attempt_one(entrypoint, engine=None, **store_kwargs):
    """Store one event and run its first attempt through the engine's steps."""
    engine = engine or make_engine()
    engine.recover_once(at_start=True)
    store(entrypoint, **store_kwargs)
    engine.intake_once()
    engine.process_one()
    return engine


def pump(engine, until, timeout=30.0):
    """Run the engine's steps on this thread until `until()` is true."""
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            raise AssertionError("engine did not get there in time")
        engine.intake_once()
        engine.scheduler.release_due()
        if not engine.process_one(timeout=0.01):
            time.sleep(0.005)


class RunningEngine:
    """The whole engine on its own threads, as rundelivery runs it; `with` gives
    the runner (its engine is `runner.engine`)."""

    def __init__(self, **options):
        import threading

        options.setdefault("workers", 10)
        self.runner = Runner(make_engine(**options))
        self.engine = self.runner.engine
        self.thread = threading.Thread(target=self.runner.run, name="engine", daemon=True)

    def __enter__(self):
        self.thread.start()
        return self.runner

    def __exit__(self, *exc):
        self.runner.stop()
        self.thread.join(60)
        assert not self.thread.is_alive(), "engine did not stop"

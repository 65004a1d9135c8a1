"""Prometheus metrics (GET /metrics).

Counters and histograms are written by whichever process counts them: gunicorn
workers count events, the engine counts attempts. prometheus-client's multiprocess
mode keeps them in files under PROMETHEUS_MULTIPROC_DIR (DATA_DIR/metrics), and a
scrape adds every process's files up, so the numbers are right however many
workers serve the scrape. The engine's gauges come from its heartbeat row.
"""

import functools
import logging
import os

from django.utils import timezone
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, multiprocess
from prometheus_client.core import GaugeMetricFamily

from deliveries.models import EngineStatus

EVENTS = Counter("webhooker_events_received_total", "Events received and stored.", ["webhook"])
EVENT_BYTES = Histogram(
    "webhooker_event_body_bytes",
    "Size of received event bodies in bytes.",
    ["webhook"],
    buckets=(256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 10485760),
)
REJECTIONS = Counter(
    "webhooker_events_rejected_total",
    "Requests refused with 401 because they failed their entrypoint's verification.",
    ["entrypoint"],
)
DUPLICATES = Counter(
    "webhooker_events_duplicate_total",
    "Repeats of a kept event's provider id, answered without storing anything.",
    ["webhook"],
)
ATTEMPTS = Counter(
    "webhooker_delivery_attempts_total",
    "Delivery attempts by target type and the delivery's status after the attempt "
    "(delivered, retrying, failed).",
    ["target_type", "outcome"],
)
ATTEMPT_SECONDS = Histogram(
    "webhooker_delivery_attempt_duration_seconds",
    "Duration of delivery attempts.",
    ["target_type"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)


logger = logging.getLogger(__name__)

# Bytes given to each of a process's metric files before it counts: room for
# about 5 000 series (a webhook's histogram is 15 of them) before prometheus-client
# grows the file, sparse again.
ALLOCATED = 1 << 20
_allocated_for = {"pid": None, "counting": True}


def counting() -> bool:
    """Whether this process counts: its metric files have their disk blocks.

    prometheus-client maps sparse files; a counter written into a page with no
    block behind it on a full disk is a SIGBUS, which killed a web worker after
    its event was committed and before the 200 (the sender, seeing the connection
    reset, sends a duplicate). So each process allocates its files' blocks first,
    and counts nothing if the disk has none to give: metrics are worth less than
    the answer.
    """
    pid = os.getpid()
    if _allocated_for["pid"] != pid:
        _allocated_for["pid"] = pid
        _allocated_for["counting"] = _allocate(pid)
    return _allocated_for["counting"]


def _allocate(pid: int) -> bool:
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:
        return True
    try:
        # prometheus-client's names for a process's counter and histogram files.
        for kind in ("counter", "histogram"):
            fd = os.open(os.path.join(directory, f"{kind}_{pid}.db"), os.O_RDWR | os.O_CREAT)
            try:
                os.posix_fallocate(fd, 0, ALLOCATED)
            finally:
                os.close(fd)
    except OSError as exc:
        logger.warning("metrics off in this process, their files have no room: %s", exc)
        return False
    return True


def event_received(webhook_code, size: int) -> None:
    if counting():
        events, sizes = _event_series(webhook_code)
        events.inc()
        sizes.observe(size)


@functools.lru_cache(maxsize=4096)
def _event_series(webhook_code):
    """A webhook's event counter and size histogram series, looked up once per
    process rather than on every inbound event (prometheus-client keeps every
    series it has made anyway)."""
    label = str(webhook_code)
    return EVENTS.labels(webhook=label), EVENT_BYTES.labels(webhook=label)


def event_rejected(entrypoint_code) -> None:
    if counting():
        REJECTIONS.labels(entrypoint=str(entrypoint_code)).inc()


def event_duplicate(webhook_code) -> None:
    if counting():
        DUPLICATES.labels(webhook=str(webhook_code)).inc()


def attempt_made(target_type: str, outcome: str, duration_ms: int) -> None:
    if counting():
        attempts, seconds = _attempt_series(target_type, outcome)
        attempts.inc()
        seconds.observe(duration_ms / 1000)


@functools.cache
def _attempt_series(target_type: str, outcome: str):
    """The attempt's counter and histogram series: an engine counts every attempt,
    and the few label values' series are looked up once, not per attempt."""
    return (
        ATTEMPTS.labels(target_type=target_type, outcome=outcome),
        ATTEMPT_SECONDS.labels(target_type=target_type),
    )


class EngineCollector:
    """The engines' gauges, read from their heartbeat rows at scrape time: totals
    over the live engines, and each engine's with an `engine` label (its row name)."""

    GAUGES = (
        ("channel_depth", "Tasks waiting in the channel."),
        ("inflight", "Deliveries the engine owns."),
        ("busy_workers", "Workers attempting a delivery."),
        ("open_breakers", "Targets whose circuit breaker is open."),
    )

    def collect(self):
        now = timezone.now()
        coverage = EngineStatus.objects.coverage(now)  # one read of the heartbeat rows
        running = GaugeMetricFamily(
            "webhooker_engine_up",
            "1 while every partition is held by an engine whose heartbeat is fresh.",
        )
        running.add_metric([], 1 if coverage.complete else 0)
        yield running
        for name, value, doc in (
            ("engines", len(coverage.engines), "Engines whose heartbeat is fresh."),
            ("partitions", coverage.partitions, "Partitions the deliveries are spread over."),
            ("partitions_unheld", len(coverage.unheld), "Partitions no live engine holds."),
        ):
            gauge = GaugeMetricFamily(f"webhooker_{name}", doc)
            gauge.add_metric([], value)
            yield gauge
        status = EngineStatus.objects.current()
        age = status.heartbeat_age(now)
        if age is None:
            return
        age_gauge = GaugeMetricFamily(
            "webhooker_engine_heartbeat_age_seconds", "Seconds since the last heartbeat."
        )
        age_gauge.add_metric([], age)
        yield age_gauge
        for name, doc in self.GAUGES:
            gauge = GaugeMetricFamily(f"webhooker_engine_{name}", doc + " All engines.")
            gauge.add_metric([], sum(getattr(e, name) for e in coverage.engines))
            yield gauge
            each = GaugeMetricFamily(f"webhooker_engine_{name}_by_engine", doc, labels=["engine"])
            for engine in coverage.engines:
                each.add_metric([engine.name], getattr(engine, name))
            yield each
        held = GaugeMetricFamily(
            "webhooker_engine_partitions_held_by_engine",
            "Partitions the engine holds (all of them: SQLite's one engine).",
            labels=["engine"],
        )
        for engine in coverage.engines:
            count = coverage.partitions if engine.partitions is None else len(engine.partitions)
            held.add_metric([engine.name], count)
        yield held


def render() -> bytes:
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    registry.register(EngineCollector())
    return generate_latest(registry)

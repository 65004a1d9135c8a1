"""The engine's heartbeat row, read by the admin, /metrics and the healthcheck
(EngineStatus decides from it whether the engine is alive)."""

import os
import socket

from django.utils import timezone

from deliveries.models import EngineStatus


def beat(name: str, gauges: dict, *, starting=False, stopped=False) -> None:
    """Record that the engine `name` is alive now, with its `gauges`
    (runner.Runner.gauges: channel depth, inflight, busy workers, partitions, ...).
    Each engine process has a row of its own (rundelivery names it); a start also
    deletes the rows of engines gone for a day."""
    now = timezone.now()
    values = {
        "pid": os.getpid(),
        "hostname": socket.gethostname()[:255],
        "heartbeat_at": now,
        "stopped_at": now if stopped else None,
        **gauges,
    }
    if starting:
        values["started_at"] = now
        EngineStatus.objects.forgotten(now).delete()
    EngineStatus.objects.update_or_create(name=name, defaults=values)

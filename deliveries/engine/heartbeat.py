"""The engine's heartbeat row, read by the admin and /.well-known/healthcheck."""

import os
import socket

from django.utils import timezone

from deliveries.models import EngineStatus


def beat(engine, *, starting=False, stopped=False) -> None:
    now = timezone.now()
    values = {
        "pid": os.getpid(),
        "hostname": socket.gethostname()[:255],
        "heartbeat_at": now,
        "channel_depth": engine.channel.depth(),
        "inflight": engine.inflight.held(),
        "busy_workers": engine.busy_workers(),
        "workers": engine.workers,
        "open_breakers": engine.breakers.open_count(),
        "stopped_at": now if stopped else None,
    }
    if starting:
        values["started_at"] = now
    EngineStatus.objects.update_or_create(name=engine.name, defaults=values)

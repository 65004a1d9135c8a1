"""The engine's settings, in one object.

Built from Django settings by `rundelivery` (`EngineConfig.from_settings()`), or
directly by tests with only the values they care about.
"""

from __future__ import annotations

import dataclasses

from django.conf import settings

from deliveries.engine.breaker import CircuitBreaker


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineConfig:
    # Threads that prepare attempts (and run the database and log targets).
    workers: int = 4
    # HTTP attempts one engine keeps in flight at once (sender.py).
    inflight: int = 5000
    channel_size: int = 10_000
    # Seconds between intake passes when no wake hint arrives.
    poll_interval: float = 1.0
    recovery_interval: float = 60.0
    # A pending delivery untouched this long is taken by the recovery tick.
    stale_after: float = 900.0
    recovery_batch: int = 500
    # Attempts one target may have running at once (invariant 7).
    target_concurrency: int = 15
    backoff_base: float = 1.0
    backoff_cap: float = 3600.0
    breaker_cooldown: float = CircuitBreaker.COOLDOWN
    # A target failing every attempt this long is paused (auto-disable).
    disable_after: float = 5 * 86_400.0
    # A breaker open this long raises an alert.
    alert_breaker_after: float = 600.0
    # The heartbeat row's name.
    name: str = "default"

    @classmethod
    def from_settings(cls, **overrides) -> EngineConfig:
        """The DELIVERY_* settings, with `overrides` (None values ignored) on top."""
        values = {
            "workers": settings.DELIVERY_WORKERS,
            "inflight": settings.DELIVERY_INFLIGHT,
            "channel_size": settings.DELIVERY_CHANNEL_SIZE,
            "poll_interval": settings.DELIVERY_POLL_INTERVAL,
            "recovery_interval": settings.DELIVERY_RECOVERY_INTERVAL,
            "stale_after": settings.DELIVERY_STALE_AFTER,
            "recovery_batch": settings.DELIVERY_RECOVERY_BATCH,
            "target_concurrency": settings.DELIVERY_TARGET_CONCURRENCY,
            "backoff_base": settings.DELIVERY_BACKOFF_BASE,
            "backoff_cap": settings.DELIVERY_BACKOFF_CAP,
            "disable_after": settings.DELIVERY_DISABLE_AFTER,
            "alert_breaker_after": settings.ALERT_BREAKER_AFTER,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

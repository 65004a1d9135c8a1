"""The plain object a delivery travels as through the engine.

Workers never share model instances between threads: a Task holds ids and values
read once by the claimant. Small bodies ride along; large ones are read by the
worker at attempt time, so the channel's memory stays bounded however big events
are (the Go original's 16 KiB threshold).
"""

from __future__ import annotations

import datetime
import uuid
from dataclasses import dataclass, field

INLINE_BODY_LIMIT = 16 * 1024


@dataclass(slots=True)
class Task:
    delivery_id: int
    status: str
    next_attempt_at: datetime.datetime | None
    event_id: int
    event_code: uuid.UUID
    webhook_id: int
    target_id: int
    target_type: str
    target_active: bool
    config: dict
    max_retries: int
    attempts: int
    method: str
    headers: list
    content_type: str
    body_size: int
    received_at: datetime.datetime
    body: bytes | None = field(default=None, repr=False)
    # (outcome, status, delay, duration_ms) of an attempt whose result could not
    # be written yet; the next turn writes it instead of attempting again.
    unwritten: tuple | None = field(default=None, repr=False)

    def load_body(self) -> bytes:
        if self.body is not None:
            return self.body
        from deliveries.models import Event

        body = Event.objects.filter(id=self.event_id).values_list("body", flat=True).first()
        return bytes(body) if body is not None else b""

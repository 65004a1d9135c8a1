"""The plain object a delivery travels as through the engine.

Workers never share model instances between threads: a Task holds ids and values
read once by the claimant. Small bodies ride along; large ones are read by the
engine just before the attempt, so the channel's memory stays bounded however big
events are (the Go original's 16 KiB threshold).
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
    attempts: int
    method: str
    headers: list
    content_type: str
    body_size: int
    received_at: datetime.datetime
    # The body when it is at most INLINE_BODY_LIMIT bytes; None: the engine reads
    # it at attempt time (claims.read_body).
    body: bytes | None = field(default=None, repr=False)
    # An attempt whose result could not be written yet (attempts.AttemptResult);
    # the next turn writes it instead of attempting again.
    unwritten: object | None = field(default=None, repr=False)
    # The target as it is in the database for this attempt (targets.TargetState),
    # set by the engine just before each attempt: never kept from an earlier one.
    target: object | None = field(default=None, repr=False)
    # As received by the inbound view, without the "?" (http targets forward it).
    query_string: str = ""
    # Waiting for the target's circuit breaker, not for a backoff: a probe that
    # succeeds sends it at once.
    deferred: bool = False
    # Holds a slot of the target's rate limit: attempted when it comes due.
    slotted: bool = False
    # Holds its target's half-open breaker probe: it is sent next, or given back.
    probing: bool = False
    # The breaker its attempt answers to (targets.EngineTarget.admit); None for a
    # target that does not retry.
    breaker: object | None = field(default=None, repr=False)
    # (partition, epoch) when it was claimed: its result is written only while that
    # epoch is the partition's current one (writer.py). None: nothing to fence
    # (SQLite's one engine, or an engine driven without a partition manager).
    fence: tuple[int, int] | None = None
    # The event's, for a target's transform (deliveries/transforms/).
    event_type: str = ""
    provider_id: str = ""
    entrypoint_id: int | None = None
    # A copy shaped by the target's transform (transforms.for_task), sent in place
    # of the event as received.
    transformed: bool = False
    # (task as sent, body) from its transform, for the attempt that goes on with it
    # (Turns.attempt takes it, once).
    shaped: tuple | None = field(default=None, repr=False)
    # The event's trace context (Event.traceparent), and the span of the attempt
    # being made (tracing.Attempt), ended with its result.
    traceparent: str = ""
    span: object | None = field(default=None, repr=False)

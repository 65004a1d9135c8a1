"""What a target would be sent for a stored event: the console's and the API's
"Run on an event", for the saved transform or one being edited.

It goes the engine's way (filters, then the transform in the worker pool, then the
target type's request) and sends nothing.
"""

from __future__ import annotations

from deliveries import transforms
from deliveries.engine.attempts import FILTERS_DID_NOT_MATCH
from deliveries.engine.targets import FIELDS, TargetState
from deliveries.engine.task import Task
from deliveries.filters import matches
from deliveries.targets import TARGET_TYPES
from deliveries.targets.base import masked_headers


def preview(target, event, program: str | None = None, filters: list | None = None) -> dict:
    """{"dropped": true, "reason"} or {"dropped": false, "body", "headers", "query"},
    with "input" and "output" (the program's, when it has one). `program` and
    `filters` in place of the saved ones; they must be valid
    (transforms.validate_program, filters.clean_filters). Raises
    transforms.TransformError."""
    unsaved = {
        "transform": target.transform if program is None else program,
        "filters": target.filters if filters is None else filters,
    }
    program = unsaved["transform"]
    state = TargetState(
        {name: unsaved[name] if name in unsaved else getattr(target, name) for name in FIELDS}
    )
    body = event.read_body()
    task = _task(event, state, body)
    # What a program reads, also when there is none yet: to write one from.
    shown, out = transforms.run(task, body, program or "empty", show=True)
    answer = {"input": shown, "output": out if program else None}
    if state.filters and not matches(state.filters, task.headers, body, event_type=task.event_type):
        return {**answer, "dropped": True, "reason": FILTERS_DID_NOT_MATCH}
    sent = task
    if program:
        shaped = transforms.shaped(task, body, out)
        if shaped is None:
            return {**answer, "dropped": True, "reason": transforms.DROPPED}
        sent, body = shaped
    headers, query = _sent_lines(sent, body)
    return {
        **answer,
        "dropped": False,
        "body": body.decode("utf-8", "replace"),
        "headers": headers,
        "query": query,
    }


def _sent_lines(sent: Task, body: bytes) -> tuple[list, str]:
    kind = TARGET_TYPES.get(sent.target.type)
    req = kind.request(sent, body) if kind is not None else None
    if req is None:  # a kind that delivers by itself: the event's lines as shaped
        return [list(line) for line in sent.headers], sent.query_string
    lines = req.shown.get("request_headers") or masked_headers(req.headers.items())
    query = req.url.raw_query_string if req.url is not None else ""
    return [list(line) for line in lines], query


def _task(event, state: TargetState, body: bytes) -> Task:
    return Task(
        delivery_id=0,
        status="pending",
        next_attempt_at=None,
        event_id=event.id,
        event_code=event.code,
        webhook_id=event.webhook_id,
        target_id=state.id,
        attempts=0,
        method=event.method,
        headers=event.headers or [],
        content_type=event.content_type,
        body_size=event.body_size,
        received_at=event.received_at,
        body=body,
        target=state,
        query_string=event.query_string,
        event_type=event.event_type,
        provider_id=event.provider_id,
        entrypoint_id=event.entrypoint_id,
    )

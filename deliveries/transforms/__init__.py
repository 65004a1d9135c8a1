"""Target transforms: a jq program that reshapes what a target receives, or drops it.

The program reads one JSON object (document()):

    {"body": <the body parsed as JSON, or null>,
     "text": <the body as text when it is UTF-8, or null>,
     "headers": {<lower-cased name>: <value; repeated lines joined by ", ">},
     "query": <the query string, without "?">,
     "event": {"code", "type", "provider_id", "received_at", "webhook", "entrypoint"}}

and yields `null` (or nothing, as `select(...)` does when it does not match): the
delivery ends `filtered`, "dropped by transform", with no attempt; or one object
with any of `body` (a JSON value, sent as JSON; a string is sent as it is),
`headers` (header lines to set, or with null to remove) and `query` (the query
string to forward). Anything else fails the delivery with the reason in words,
as does an error of the program or a limit it hits (pool.py): the same input
would give the same answer, so it is not retried.

Filters run first; then the transform, as the target is configured at each attempt
(a changed program applies to the next attempt). Signing covers the bytes sent.
"""

from __future__ import annotations

import dataclasses
import json

from django.core.exceptions import ValidationError

from deliveries.transforms.pool import SHOW, TransformError, workers
from deliveries.transforms.worker import wrapped

# Characters of a program: a transform is a few lines, not a library.
MAX_PROGRAM = 10_000
KEYS = ("body", "headers", "query")
DROPPED = "dropped by transform"

__all__ = ["DROPPED", "TransformError", "for_task", "run", "shaped", "submit", "validate_program"]


def validate_program(program: str) -> None:
    """A field validator: the program compiles, or jq's message as the error."""
    if not program:
        return
    if len(program) > MAX_PROGRAM:
        raise ValidationError(f"A transform is at most {MAX_PROGRAM} characters.")
    import jq  # compiling runs none of the program: safe in the web process

    try:
        jq.compile(program)
    except ValueError as exc:
        raise ValidationError(str(exc).strip()) from None
    try:
        jq.compile(wrapped(program))
    except ValueError:
        raise ValidationError(
            "A transform is one jq expression (definitions first are fine); it cannot "
            "import or include modules."
        ) from None


def document(*, body: bytes, headers: list, query: str, event: dict) -> bytes:
    """The program's input as JSON text, but for `body`, which the worker fills in
    from `text` (jq parses it there, outside the engine)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    joined: dict[str, str] = {}
    for name, value in headers:
        key = name.lower()
        joined[key] = f"{joined[key]}, {value}" if key in joined else value
    return json.dumps(
        {"body": None, "text": text, "headers": joined, "query": query, "event": event}
    ).encode()


def task_document(task, body: bytes) -> bytes:
    """The program's input for the event a Task carries."""
    event = {
        "code": str(task.event_code),
        "type": task.event_type,
        "provider_id": task.provider_id,
        "received_at": task.received_at.isoformat(),
        "webhook": task.webhook_id,
        "entrypoint": task.entrypoint_id,
    }
    return document(body=body, headers=task.headers, query=task.query_string, event=event)


def run(task, body: bytes, program: str, *, show: bool = False):
    """(input, output) of `program` for the task's event: the input only when
    `show` (a preview), else None; the output None when the program drops the
    event. Raises TransformError."""
    answer = workers().run(SHOW + program if show else program, task_document(task, body))
    shown, values = answer if show else (None, answer)
    return shown, _one(values)


def for_task(task, body: bytes):
    """The engine's call: (task as sent, body sent), or None when the program drops
    the event; raises TransformError."""
    return shaped(task, body, run(task, body, task.target.transform)[1])


def submit(task, body: bytes, then) -> None:
    """for_task() without waiting: `then` is called on a transform reader thread with
    (task as sent, body sent), None (dropped), or the TransformError."""

    def answered(values):
        try:
            if isinstance(values, TransformError):
                raise values
            result = shaped(task, body, _one(values))
        except TransformError as exc:
            result = exc
        except Exception as exc:  # its caller is answered whatever happens
            result = TransformError(f"the transform's output could not be used: {exc!r}")
        then(result)

    workers().submit(task.target.transform, task_document(task, body), answered)


def _one(values: list):
    if len(values) > 1:
        raise TransformError("the transform yielded more than one value: yield one object")
    return values[0] if values else None


def shaped(task, body: bytes, out):
    """(task as sent, body sent) for a program's output, or None for null. The task
    returned is a copy for building the request; the original's result is written."""
    if out is None:
        return None
    shape = _shape(
        out,
        body=body,
        headers=task.headers,
        query=task.query_string,
        content_type=task.content_type,
    )
    sent = dataclasses.replace(
        task,
        headers=shape.headers,
        content_type=shape.content_type,
        query_string=shape.query,
        body=shape.body,
        body_size=len(shape.body),
        transformed=True,
    )
    return sent, shape.body


@dataclasses.dataclass(frozen=True, slots=True)
class Shaped:
    """What the target is sent in place of the event's own body and lines."""

    body: bytes
    headers: list
    content_type: str
    query: str


def _shape(out, *, body: bytes, headers: list, query: str, content_type: str) -> Shaped:
    if not isinstance(out, dict):
        raise TransformError(
            f"the transform yielded {_kind(out)}: yield an object with body, headers "
            "or query, or null to drop the event"
        )
    unknown = sorted(set(out) - set(KEYS))
    if unknown:
        raise TransformError(
            f"the transform's output has unknown keys {', '.join(unknown)}: "
            "only body, headers and query"
        )
    lines = list(headers)
    if "body" in out:
        sent = out["body"]
        if isinstance(sent, str):
            body = sent.encode("utf-8")
        else:
            try:
                body = json.dumps(sent, ensure_ascii=False, allow_nan=False).encode("utf-8")
            except ValueError:
                raise TransformError("the transform's body holds NaN or infinity") from None
            content_type = "application/json"
            lines = _set(lines, "Content-Type", content_type)
    if "headers" in out:
        lines, content_type = _headers(out["headers"], lines, content_type)
    if "query" in out:
        query = out["query"]
        if not isinstance(query, str) or any(c in query for c in "\r\n\0#"):
            raise TransformError("the transform's query must be text without '#' or newlines")
        query = query.removeprefix("?")
    return Shaped(body=body, headers=lines, content_type=content_type, query=query)


def _headers(changes, lines: list, content_type: str):
    from deliveries.targets.http import DROPPED_HEADERS, valid_header

    if not isinstance(changes, dict):
        raise TransformError("the transform's headers must be an object of names to values")
    for name, value in changes.items():
        lowered = name.lower()
        if lowered in DROPPED_HEADERS or lowered.startswith("x-webhooker-"):
            raise TransformError(f"the transform cannot set {name}: webhooker sets it")
        if value is None:
            lines = [line for line in lines if line[0].lower() != lowered]
            if lowered == "content-type":
                content_type = ""
            continue
        if not isinstance(value, str) or not valid_header(name, value):
            raise TransformError(f"the transform's header {name!r} is not a valid name and text")
        lines = _set(lines, name, value)
        if lowered == "content-type":
            content_type = value
    return lines, content_type


def _set(lines: list, name: str, value: str) -> list:
    lowered = name.lower()
    return [line for line in lines if line[0].lower() != lowered] + [[name, value]]


def _kind(value) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "a value"

"""The event and delivery lists as filtered, streamed as CSV or JSON Lines, from the
console and the API (issue 28). Rows are read in chunks along the primary key,
newest first, and written as they come: memory does not grow with the export."""

import csv
import json

from django.db.models import F
from django.http import StreamingHttpResponse

FORMATS = {"csv": "text/csv; charset=utf-8", "jsonl": "application/jsonl; charset=utf-8"}
CHUNK = 2000

# Column name -> what it is read from.
EVENT_COLUMNS = {
    "id": "id",
    "code": "code",
    "webhook": "webhook_id",
    "entrypoint": "entrypoint_id",
    "method": "method",
    "content_type": "content_type",
    "body_size": "body_size",
    "remote_addr": "remote_addr",
    "received_at": "received_at",
    "event_type": "event_type",
    "provider_id": "provider_id",
    "request_id": "request_id",
    "duplicates": "duplicates",
}
DELIVERY_COLUMNS = {
    "id": "id",
    "event": "event_id",
    "event_code": "export_event_code",
    "target": "target_id",
    "webhook": "export_webhook_id",
    "status": "status",
    "attempts": "attempts",
    "failure": "failure",
    "reason": "reason",
    "next_attempt_at": "next_attempt_at",
    "created_at": "created_at",
    "updated_at": "updated_at",
}


def deliveries_for_export(queryset):
    """The delivery columns that live on the event and the target, joined once."""
    return queryset.annotate(
        export_event_code=F("event__code"), export_webhook_id=F("target__webhook_id")
    )


def stream(queryset, columns: dict, kind: str, filename: str) -> StreamingHttpResponse:
    """`queryset` as `kind` (csv or jsonl), a download named `filename`.<kind>."""
    rows = queryset.order_by("-id").values_list(*columns.values()).iterator(chunk_size=CHUNK)
    lines = _csv(columns, rows) if kind == "csv" else _jsonl(columns, rows)
    response = StreamingHttpResponse(_joined(lines, CHUNK), content_type=FORMATS[kind])
    response["Content-Disposition"] = f'attachment; filename="{filename}.{kind}"'
    return response


def _joined(lines, size: int):
    """`lines` handed on `size` at a time, as one piece: a write to the client per
    chunk of rows read, not one per row."""
    batch = []
    for line in lines:
        batch.append(line)
        if len(batch) == size:
            yield "".join(batch)
            batch.clear()
    if batch:
        yield "".join(batch)


class _Line:
    """csv.writer's file: hands back what it is given."""

    def write(self, text):
        return text


def _csv(columns, rows):
    writer = csv.writer(_Line())
    yield writer.writerow(list(columns))
    for row in rows:
        yield writer.writerow(["" if value is None else value for value in row])


def _jsonl(columns, rows):
    names = list(columns)
    for row in rows:
        yield json.dumps(dict(zip(names, row, strict=True)), default=str) + "\n"

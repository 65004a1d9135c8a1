"""Log lines as JSON objects, one per line (LOG_FORMAT=json), for log collectors.

Every field passed with `extra=` becomes a field of its own: an attempt's line
carries "delivery" and "event", so a collector can follow one event through the
engine without parsing messages.
"""

import datetime
import json
import logging

from webhooker import request_context

# The attributes every LogRecord has; anything else on a record came from `extra`.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "request_id"}


def stamp_request_ids() -> None:
    """Give every log record the id of the request its thread serves (None outside
    one), whatever handler writes it: installed once, at start (apps.py)."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "stamps_request_ids", False):
        return

    def factory(*args, **kwargs):
        record = previous(*args, **kwargs)
        record.request_id = request_context.request_id.get()
        return record

    factory.stamps_request_ids = True
    logging.setLogRecordFactory(factory)


class PlainFormatter(logging.Formatter):
    """The plain line, and " request_id=..." when it was written serving a request."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        request_id = getattr(record, "request_id", None)
        return f"{line} request_id={request_id}" if request_id else line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if getattr(record, "request_id", None):
            entry["request_id"] = record.request_id
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_") and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)

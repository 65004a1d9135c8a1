"""Log lines as JSON objects, one per line (LOG_FORMAT=json), for log collectors.

Every field passed with `extra=` becomes a field of its own: an attempt's line
carries "delivery" and "event", so a collector can follow one event through the
engine without parsing messages.
"""

import datetime
import json
import logging

# The attributes every LogRecord has; anything else on a record came from `extra`.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


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
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_") and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)

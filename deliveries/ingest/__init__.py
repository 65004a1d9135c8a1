"""The inbound path's storage: what the inbound view calls, and nothing else.

- `entrypoints`: the entrypoint a request names, remembered per process and
  re-checked by the very statement that stores the event;
- `statements`: every statement, named and built once per database vendor;
- `store`: `store_event`, one statement on PostgreSQL, a group-committed
  transaction on SQLite (webhooker.db.sqlite.group_commit).

What a sender's request says about itself (its event type, its event id) is read
by the verification presets (deliveries.verification).
"""

from deliveries.ingest.entrypoints import Inbound, find_entrypoint
from deliveries.ingest.store import (
    EntrypointChanged,
    SenderGone,
    Stored,
    ip_or_none,
    store_event,
)

__all__ = [
    "EntrypointChanged",
    "Inbound",
    "SenderGone",
    "Stored",
    "find_entrypoint",
    "ip_or_none",
    "store_event",
]

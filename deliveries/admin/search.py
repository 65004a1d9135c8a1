"""Finding events among millions (docs/architecture.md, HTTP surface: the admin).

Two kinds of search. By code prefix or provider event id: answered from an index
(the code's unique index as a range, event_provider_id_idx), however many events
there are. By header value or payload text: no index can answer those, so they
scan a bounded window instead, the SCAN_ROWS newest events of the list as
filtered (the date range chosen, the webhook...), and say how far back that
window reached.
"""

from __future__ import annotations

import datetime
import re
import uuid
from dataclasses import dataclass

from django.db.models import Lookup, Q, TextField
from django.db.models.functions import Cast

from deliveries.models import Event

# How many events a header or payload search reads at most.
SCAN_ROWS = 20_000
_HEX = re.compile(r"[0-9a-f]{4,32}\Z")


class BytesContains(Lookup):
    """body__bytes_contains=b"...": the bytes occur in the stored body."""

    lookup_name = "bytes_contains"

    def as_sql(self, compiler, connection):
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self.process_rhs(compiler, connection)
        if connection.vendor == "postgresql":
            return f"position({rhs} in {lhs}) > 0", [*rhs_params, *lhs_params]
        return f"instr({lhs}, {rhs}) > 0", [*lhs_params, *rhs_params]


Event._meta.get_field("body").register_lookup(BytesContains)


def code_range(term: str) -> tuple[uuid.UUID, uuid.UUID] | None:
    """The codes starting with `term` (at least 4 hex digits, dashes ignored) as
    an inclusive range: a range reads the unique index on both databases, where
    a LIKE on a PostgreSQL uuid could not."""
    digits = term.strip().lower().replace("-", "")
    if not _HEX.match(digits):
        return None
    low = uuid.UUID(digits.ljust(32, "0"))
    high = uuid.UUID(digits.ljust(32, "f"))
    return low, high


def find(events, term: str):
    """Events whose code starts with `term` or whose provider id is `term`."""
    term = term.strip()
    # The partial index's own condition is repeated so that SQLite uses it too.
    condition = Q(~Q(provider_id=""), provider_id=term)
    found = code_range(term)
    if found:
        condition |= Q(code__range=found)
    return events.filter(condition)


@dataclass(frozen=True)
class Scan:
    """How far a bounded search looked."""

    looked: int
    oldest: datetime.datetime | None
    newest: datetime.datetime | None
    limit: int

    @property
    def capped(self) -> bool:
        """Whether older events were left unread."""
        return self.looked >= self.limit


def scan(events, term: str, where: str, limit: int | None = None):
    """(matching events, Scan) among the `limit` (SCAN_ROWS) newest of `events`;
    `where` is "payload" (the body's bytes) or "headers" (names and values, any case)."""
    limit = limit or SCAN_ROWS
    # The window's times, read from the received index: how far it reaches.
    times = list(
        events.order_by("-received_at", "-id").values_list("received_at", flat=True)[:limit]
    )
    if not times:
        return events.none(), Scan(0, None, None, limit)
    newest, oldest = times[0], times[-1]
    # The window as a time range of the same filters: an index range that the
    # planner reads before testing any row's text. (Given "id IN (the window)",
    # PostgreSQL tested the text of every event first.) Events received at the
    # very instant of the window's oldest may add a few rows beyond `limit`.
    bounded = events.filter(received_at__range=(oldest, newest))
    if where == "payload":
        found = bounded.filter(body__bytes_contains=term.encode())
    else:
        found = bounded.annotate(headers_text=Cast("headers", TextField())).filter(
            headers_text__icontains=term
        )
    return found, Scan(len(times), oldest, newest, limit)

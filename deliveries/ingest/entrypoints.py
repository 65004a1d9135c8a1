"""The entrypoint an inbound request names, as this process remembers it.

Read once per process and kept, never trusted: the statement that stores an event
also checks that the entrypoint is still active and configured exactly as it was
read, and stores nothing if not (store.EntrypointChanged; the view reads it afresh
and decides again). So an entrypoint switched off, deleted or given a new secret a
moment ago is obeyed exactly, with no expiry to wait for.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid

from django.db import connection

from deliveries import verification
from deliveries.ingest.statements import AS_READ, tables
from deliveries.models import Entrypoint


@dataclasses.dataclass(frozen=True, slots=True)
class Inbound:
    """What the view needs of an entrypoint: found by its code in one query."""

    id: int
    webhook_id: int
    webhook_code: uuid.UUID
    active: bool
    code: uuid.UUID | None = None
    verification: str = "none"
    verification_config: dict = dataclasses.field(default_factory=dict, repr=False)
    dedup: bool = False
    # Where provider event ids are read from ("" when nowhere).
    id_source: str = ""
    # The columns as read (verification, config as text, dedup, dedup source): the
    # store statements store only while the row still holds exactly these.
    as_read: tuple = dataclasses.field(default=(), repr=False)
    # Served from this process's memory rather than read for this request.
    remembered: bool = False


# Entrypoints remembered per process; past this many, the oldest are forgotten.
REMEMBERED_ENTRYPOINTS = 4096
_remembered: dict[uuid.UUID, Inbound] = {}
_remembered_lock = threading.Lock()


def find_entrypoint(code: uuid.UUID, *, fresh: bool = False) -> Inbound | None:
    """The active entrypoint with this code as this process remembers it, or as
    read now (`fresh`, and whenever it is not remembered). Inactive and unknown
    codes are read every time: only an entrypoint that stores events is kept, and
    storing checks it (see the module docstring)."""
    if not fresh:
        remembered = _remembered.get(code)
        if remembered is not None:
            return remembered
    inbound = _read_entrypoint(code)
    with _remembered_lock:
        _remembered.pop(code, None)
        if inbound is not None and inbound.active:
            while len(_remembered) >= REMEMBERED_ENTRYPOINTS:
                _remembered.pop(next(iter(_remembered)))
            _remembered[code] = dataclasses.replace(inbound, remembered=True)
    return inbound


# Stored encrypted (deliveries/fields.py): read as the model reads it.
_config = Entrypoint._meta.get_field("verification_config")


def _read_entrypoint(code: uuid.UUID) -> Inbound | None:
    t = tables()
    sql = (
        f"SELECT e.id, e.webhook_id, w.code, e.active, {AS_READ} FROM {t['entrypoint']} e "
        f"JOIN {t['webhook']} w ON w.id = e.webhook_id WHERE e.code = %s"
    )
    prep = Entrypoint._meta.get_field("code").get_db_prep_value(code, connection)
    with connection.cursor() as cursor:
        cursor.execute(sql, [prep])
        row = cursor.fetchone()
    if row is None:
        return None
    webhook_code = row[2] if isinstance(row[2], uuid.UUID) else uuid.UUID(row[2])
    preset, config_text, dedup, dedup_source = row[4:8]
    return Inbound(
        id=row[0],
        webhook_id=row[1],
        webhook_code=webhook_code,
        active=bool(row[3]),
        code=code,
        verification=preset,
        verification_config={}
        if preset == "none"
        else _config.from_db_value(config_text, None, None),
        dedup=bool(dedup),
        id_source=verification.id_source(preset, dedup_source),
        as_read=(preset, config_text, dedup, dedup_source),
    )

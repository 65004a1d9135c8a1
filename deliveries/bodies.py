"""Large event bodies as files beside the SQLite database.

SQLite has one writer. A 10 MiB body written in its event's transaction holds every
other event of every process for as long as its pages take to reach the WAL and
its fsync: twenty at once made small events wait for the writer until they were
refused. So on SQLite a body of WEBHOOKER_BODY_FILE_BYTES or more is written to
DATA_DIR/bodies/<name> first and fsynced (the file, then its directory), and only
then is the event's row, naming the file (`Event.body_file`, `Event.body` empty),
committed: the writer holds a row of a few hundred bytes, and the file's bytes go
to disk on the request's own thread beside the other writers.

A 200 still means stored: the file is durable before the row that names it
commits. A crash in between, or a request that fails after its file was written,
leaves a file no row names: `retention.sweep_body_files` deletes those once they
are ORPHAN_AGE old (no store takes that long), and the files of deleted events.

PostgreSQL keeps every body in its row: its writers do not queue behind one
another, and one `pg_dump` stays the whole backup.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from django.conf import settings
from django.db import OperationalError, connection

# A file no event names is deleted once it is this old (seconds).
ORPHAN_AGE = 3600


class Unreadable(OSError):
    """An event's body file is missing or cannot be read (a restore without it, a
    disk fault): nothing can send or show that body until it is back."""


def directory() -> Path:
    return Path(settings.DATA_DIR) / "bodies"


def spills(size: int) -> bool:
    """Whether a body of `size` bytes is kept as a file (on SQLite, at or over
    WEBHOOKER_BODY_FILE_BYTES; 0 turns files off)."""
    limit = settings.WEBHOOKER_BODY_FILE_BYTES
    return bool(limit) and size >= limit and connection.vendor == "sqlite"


def write(data: bytes) -> str:
    """Write `data` to a new file, durably; return its name."""
    folder = _folder()
    name = uuid.uuid4().hex
    fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    _sync(folder)  # the name itself, before a row can name it
    return name


def write_or_unavailable(data: bytes) -> str:
    """write(), a failure (a full disk) being the database's kind of unavailability:
    the caller answers as when SQLite cannot store the row (503, Retry-After)."""
    try:
        return write(data)
    except OSError as exc:
        raise OperationalError(f"cannot write the body's file: {exc}") from exc


def read(name: str) -> bytes:
    path = directory() / _checked(name)
    try:
        return path.read_bytes()
    except OSError as exc:
        why = exc.strerror or exc.__class__.__name__
        raise Unreadable(f"the event's body file bodies/{name} cannot be read: {why}") from exc


def discard(name: str) -> None:
    """Delete the file (a write no row will name)."""
    (directory() / _checked(name)).unlink(missing_ok=True)


def listing() -> list[tuple[str, float]]:
    """(name, modification time) of every body file."""
    try:
        entries = list(os.scandir(directory()))
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        if not _valid(entry.name):
            continue  # not one of ours
        try:
            found.append((entry.name, entry.stat().st_mtime))
        except FileNotFoundError:
            continue  # deleted meanwhile
    return found


# Folders this process made sure of, their own name synced into their parent: a
# file's name is durable only once every folder on its way is.
_ready: set[Path] = set()


def _folder() -> Path:
    folder = directory()
    if folder not in _ready:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        _sync(folder.parent)
        _ready.add(folder)
    return folder


def _sync(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _valid(name: str) -> bool:
    return len(name) == 32 and all(c in "0123456789abcdef" for c in name)


def _checked(name: str) -> str:
    """A name as write() makes them: never a path out of the directory."""
    if not _valid(name):
        raise ValueError(f"not a body file's name: {name!r}")
    return name

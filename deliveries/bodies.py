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
from django.db import connection

# A file no event names is deleted once it is this old (seconds).
ORPHAN_AGE = 3600


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


def read(name: str) -> bytes:
    return (directory() / _checked(name)).read_bytes()


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


def _folder() -> Path:
    folder = directory()
    if not folder.is_dir():
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        _sync(folder.parent)
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

"""Which SQLite library webhooker's processes link: one, and one without the WAL-reset bug.

SQLite 3.7.0 through 3.51.2 have a race between a checkpoint and a commit that
resets the WAL which can corrupt the database or lose committed transactions
(sqlite.org/wal.html#walresetbug; fixed in 3.51.3, and backported to 3.44.6 and
3.50.7). It needs WAL mode and several connections writing and checkpointing: a
web side's workers and an engine, which is how webhooker runs. Python's `sqlite3`
links the system's library (3.40.1 on Debian 12, unpatched there), so where the
pysqlite3 wheel is installed (pyproject.toml: Linux on x86_64, macOS on Apple
silicon) `sqlite3` names it instead, in every process, before Django's backend is
imported (webhooker/__init__.py). Elsewhere the system's library is kept and
`manage.py check` (and every command that runs the checks) warns when it is one
with the bug.

One library per process matters as much as its version: SQLite's locks are POSIX
locks, which belong to the process, and a second copy of the library closing its
own handle on the file drops the locks the first copy's connections hold
(sqlite.org/howtocorrupt.html, 2.3). Hence the name `sqlite3` itself is replaced,
so Django, webhooker and any code a deployment adds open the file through the same
copy.
"""

from __future__ import annotations

import importlib
import sys

# The releases with the fix: (lowest, below) ranges of affected versions.
_AFFECTED = [((3, 7, 0), (3, 44, 6)), ((3, 45, 0), (3, 50, 7)), ((3, 51, 0), (3, 51, 3))]


def use_bundled() -> None:
    """Make `sqlite3` name pysqlite3's module, if the wheel is installed.

    Called once, when the webhooker package is first imported: the settings
    module is inside it, so this runs before Django loads any database backend.
    """
    if getattr(sys.modules.get("sqlite3"), "__name__", "") == "pysqlite3":
        return
    try:
        bundled = importlib.import_module("pysqlite3")
    except ImportError:
        return
    sys.modules["sqlite3"] = bundled
    sys.modules["sqlite3.dbapi2"] = bundled.dbapi2


def has_wal_reset_bug(version: tuple[int, ...]) -> bool:
    return any(low <= tuple(version) < fixed for low, fixed in _AFFECTED)


def check_library(app_configs=None, **kwargs):
    """A warning when the SQLite library in use has the WAL-reset bug (a Django
    system check, registered by deliveries.apps)."""
    from django.core.checks import Warning
    from django.db import connection

    if connection.vendor != "sqlite":
        return []
    version = connection.Database.sqlite_version_info
    if not has_wal_reset_bug(version):
        return []
    return [
        Warning(
            f"SQLite {'.'.join(map(str, version))} has the WAL-reset bug, which can corrupt "
            "the database when the web side and the engine write at once "
            "(sqlite.org/wal.html#walresetbug).",
            hint="Install pysqlite3 (pip install pysqlite3==0.6.1, where a wheel exists for "
            "this platform), run on a system whose SQLite is 3.51.3 or newer, 3.50.7 or "
            "3.44.6, or use PostgreSQL (DATABASE_URL).",
            id="webhooker.W001",
        )
    ]

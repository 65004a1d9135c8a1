"""The SQLite library webhooker's processes use (webhooker/db/sqlite/library.py): one
copy per process, without the WAL-reset bug where a wheel of pysqlite3 exists."""

import importlib.util
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection

from tests.support.processes import (
    ROOT,
    children,
    post_events,
    process_env,
    start_engine,
    start_web,
    wait_until,
)
from webhooker.db.sqlite import library

sqlite_only = pytest.mark.skipif("connection.vendor != 'sqlite'", reason="SQLite's library")

# Installed: where pyproject.toml installs pysqlite3's wheel, or by hand elsewhere.
BUNDLED = importlib.util.find_spec("pysqlite3") is not None
WHEEL_PLATFORM = (sys.platform, platform.machine()) in {("linux", "x86_64"), ("darwin", "arm64")}


@pytest.mark.parametrize(
    ("version", "affected"),
    [
        ((3, 6, 23), False),
        ((3, 7, 0), True),
        ((3, 40, 1), True),
        ((3, 44, 5), True),
        ((3, 44, 6), False),
        ((3, 45, 0), True),
        ((3, 50, 6), True),
        ((3, 50, 7), False),
        ((3, 51, 2), True),
        ((3, 51, 3), False),
        ((3, 53, 4), False),
    ],
)
def test_the_versions_with_the_wal_reset_bug(version, affected):
    assert library.has_wal_reset_bug(version) is affected


@pytest.mark.skipif(not WHEEL_PLATFORM, reason="pyproject.toml installs no wheel here")
def test_the_wheel_is_installed_where_pyproject_installs_it():
    assert BUNDLED


@sqlite_only
@pytest.mark.skipif(not BUNDLED, reason="pysqlite3 has no wheel for this platform")
def test_the_database_is_opened_with_a_library_without_the_wal_reset_bug(db):
    version = connection.Database.sqlite_version_info
    assert not library.has_wal_reset_bug(version), version
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT sqlite_version()")
        assert cursor.fetchone()[0] == connection.Database.sqlite_version


def test_every_sqlite3_in_the_process_is_the_one_django_opens_the_file_with():
    """A second copy of the library closing its handle on the file would drop the
    locks of the first one's connections."""
    import sqlite3
    import sqlite3.dbapi2

    from django.db.backends.sqlite3 import base

    assert sqlite3.connect is base.Database.connect
    assert sqlite3.dbapi2 is base.Database


def test_a_process_uses_the_bundled_library_from_its_first_import(tmp_path):
    """A command's process, as `make run` starts them: Django's backend, the tests'
    and a deployment's `import sqlite3` all find the same module."""
    code = (
        "import django; django.setup(); import sqlite3; "
        "from django.db.backends.sqlite3 import base; "
        "print(sqlite3.__name__, base.Database.__name__, sqlite3.sqlite_version)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=process_env(tmp_path, DATABASE_URL=f"sqlite:///{tmp_path}/w.sqlite3"),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if BUNDLED:
        assert out[:2] == ["pysqlite3", "pysqlite3.dbapi2"], out
        assert not library.has_wal_reset_bug(tuple(map(int, out[2].split(".")))), out
    else:
        assert out[0] == "sqlite3", out


@sqlite_only
def test_the_checks_warn_when_the_library_has_the_bug(db, monkeypatch, capsys):
    monkeypatch.setattr(connection.Database, "sqlite_version_info", (3, 40, 1))
    call_command("check")
    err = capsys.readouterr().err
    assert "webhooker.W001" in err and "SQLite 3.40.1 has the WAL-reset bug" in err
    monkeypatch.setattr(connection.Database, "sqlite_version_info", (3, 51, 3))
    call_command("check")
    assert "webhooker.W001" not in capsys.readouterr().err


def _libraries(pid) -> set[str]:
    """The SQLite libraries mapped into process `pid`, and whether it has the test
    database's WAL index mapped (it has opened the database)."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    found = set(re.findall(r"\S*(?:libsqlite3\.so|_sqlite3\.cpython)\S*", maps))
    wal_index = f"/{Path(connection.settings_dict['NAME']).name}-shm"
    return {"pysqlite3" if "/pysqlite3/" in path else "system" for path in found} | (
        {"opened"} if wal_index in maps else set()
    )


@sqlite_only
@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc")
def test_the_web_workers_and_the_engine_map_one_sqlite_library(entrypoint, data_dir):
    web, base = start_web(data_dir, workers=1)
    engine = start_engine(data_dir)
    try:
        post_events(base, entrypoint, 1)
        (worker,) = children(web.pid)
        expected = {"pysqlite3" if BUNDLED else "system", "opened"}
        assert _libraries(worker) == expected
        wait_until(lambda: "opened" in _libraries(engine.pid), message="the engine's database")
        assert _libraries(engine.pid) == expected
    finally:
        engine.stop()
        web.stop()

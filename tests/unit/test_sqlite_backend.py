"""webhooker/db/sqlite/base.py's cursor: Django's placeholder conversion, done once
per distinct statement."""

import pytest
from django.db import connection
from django.db.backends.sqlite3.base import SQLiteCursorWrapper

from webhooker.db.sqlite import base

pytestmark = pytest.mark.django_db


@pytest.fixture
def sqlite_cursor():
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's backend")
    with connection.cursor() as cursor:
        yield cursor


@pytest.mark.parametrize(
    "query",
    [
        "SELECT %s, %s",
        "SELECT '100%%', %s",
        "SELECT %s WHERE 'a%%s' <> %s",
    ],
)
def test_placeholders_are_converted_as_django_converts_them(query):
    assert base.CursorWrapper.convert_query(None, query) == SQLiteCursorWrapper.convert_query(
        None, query
    )


def test_a_statement_run_again_is_not_converted_again(sqlite_cursor):
    query = "SELECT %s + %s -- converted once"
    sqlite_cursor.execute(query, [1, 2])
    hits = base._qmark.cache_info().hits
    sqlite_cursor.execute(query, [3, 4])
    assert sqlite_cursor.fetchone() == (7,)
    assert base._qmark.cache_info().hits == hits + 1


def test_named_parameters_still_work(sqlite_cursor):
    sqlite_cursor.execute("SELECT %(a)s * %(b)s", {"a": 6, "b": 7})
    assert sqlite_cursor.fetchone() == (42,)

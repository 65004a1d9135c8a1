"""What the database server holds for this test's connection."""

import os
from pathlib import Path

from django.db import connection, connections


def numbered(statement: str) -> str:
    """`statement` with its `%s` numbered `$1`, `$2`, … as psycopg sends them."""
    first, *rest = statement.split("%s")
    return first + "".join(f"${n}{part}" for n, part in enumerate(rest, 1))


def prepared(statement: str) -> int:
    """How many statements beginning with `statement` (whole, or its beginning)
    this connection's server session holds prepared."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE starts_with(statement, %s)",
            [numbered(statement)],
        )
        return cursor.fetchone()[0]


def generic_plan(statement: str, arguments: str) -> str:
    """The plan PostgreSQL keeps for `statement` prepared, whatever its values;
    `arguments` as EXECUTE takes them, e.g. "(1, 'pending')"."""
    with connection.cursor() as cursor:
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        try:
            cursor.execute(f"PREPARE generic_plan AS {numbered(statement)}")
            cursor.execute(f"EXPLAIN EXECUTE generic_plan{arguments}")
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE generic_plan")
            cursor.execute("RESET plan_cache_mode")


def raw(model, field_name, pk):
    """The stored text of one column, as the database holds it."""
    q = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {q(model._meta.get_field(field_name).column)} FROM {q(model._meta.db_table)} "
            "WHERE id = %s",
            [pk],
        )
        return cursor.fetchone()[0]


# --- SQLite's file ---------------------------------------------------------------------
#
# SQLite's locks on a database file are POSIX (fcntl) locks, which belong to the
# process, and closing *any* descriptor of the file drops all of them. A test that
# opens the database file itself (to read its bytes, to copy it) while this process's
# connection is open leaves that connection unlocked: the next process to close its own
# connection then believes it is the last one, checkpoints, and deletes the WAL and its
# index under this connection, whose later writes go to a deleted file (sqlite.org,
# "How To Corrupt An SQLite Database File", 2.2).


def file_locked_by_this_process(path) -> bool:
    """Whether this process holds a POSIX lock on the file at `path` (Linux's
    /proc/locks; True where there is none to read)."""
    try:
        locks = Path("/proc/locks").read_text()
    except OSError:
        return True
    # By inode alone: the device /proc/locks names is the superblock's, which is not
    # stat's st_dev on btrfs subvolumes; one process rarely locks two files of one inode.
    inode = f":{os.stat(path).st_ino}"
    pid = str(os.getpid())
    return any(
        fields[1] == "POSIX" and fields[4] == pid and fields[5].endswith(inode)
        for fields in (line.split() for line in locks.splitlines())
        if len(fields) > 5
    )


def sqlite_file_bytes(path) -> bytes:
    """The bytes of the SQLite file at `path`, read with this process's connections
    closed, so that closing the file drops no lock a connection holds."""
    connections.close_all()
    return Path(path).read_bytes()

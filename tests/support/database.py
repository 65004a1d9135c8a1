"""What the database server holds for this test's connection."""

from django.db import connection


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

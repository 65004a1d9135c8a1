"""What the database server holds for this test's connection."""

from django.db import connection


def prepared(statement: str) -> int:
    """How many statements beginning with `statement` (whole, or its beginning)
    this connection's server session holds prepared; its `%s` are numbered `$1`,
    `$2`, … as psycopg sends them."""
    first, *rest = statement.split("%s")
    text = first + "".join(f"${n}{part}" for n, part in enumerate(rest, 1))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE starts_with(statement, %s)",
            [text],
        )
        return cursor.fetchone()[0]


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

"""What the database server holds for this test's connection."""

from django.db import connection


def prepared(statement: str) -> int:
    """How many statements beginning like `statement` (its first 60 characters)
    this connection's server session holds prepared."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE starts_with(statement, %s)",
            [statement[:60]],
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

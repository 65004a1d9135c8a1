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

from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction

from deliveries.fields import encrypted_fields
from webhooker import encryption


class Command(BaseCommand):
    help = (
        "Re-encrypt every stored secret under the first key of WEBHOOKER_ENCRYPTION_KEYS, "
        "in batches. Safe to interrupt and to run again: what is under the first key "
        "already is left alone. Remove an old key only after this has run."
    )

    def add_arguments(self, parser):
        parser.add_argument("--batch", type=int, default=500, help="rows per transaction")

    def handle(self, *args, batch, **options):
        if batch < 1:
            raise CommandError("--batch must be at least 1.")
        unreadable = {}
        for model, field in encrypted_fields():
            label = f"{model._meta.label}.{field.name}"
            done, current, bad = self.rotate(model, field, batch)
            self.stdout.write(
                f"{label}: {done} re-encrypted, {current} under the first key already"
                + (
                    f", {len(bad)} cannot be decrypted (ids {', '.join(map(str, bad))})"
                    if bad
                    else ""
                )
            )
            if bad:
                unreadable[label] = bad
        if unreadable:
            raise CommandError(
                f"{sum(map(len, unreadable.values()))} stored values {encryption.PROBLEM}: "
                "put the key that encrypted them back in WEBHOOKER_ENCRYPTION_KEYS and run "
                "this again, or enter those secrets again."
            )

    def rotate(self, model, field, batch):
        """Re-encrypt one column, `batch` rows per transaction, in id order. Each row
        is written only if it still holds the token read (compare and set): a value
        saved meanwhile is under the first key already. Plain values stored before
        encryption (none once the migration ran) are encrypted."""
        # Names from the models, quoted; values as parameters.
        q = connection.ops.quote_name
        table, column, pk = q(model._meta.db_table), q(field.column), q(model._meta.pk.column)
        rows_after = f"SELECT {pk}, {column} FROM {table} WHERE {pk} > %s"  # noqa: S608
        select = f"{rows_after} AND {column} <> '' ORDER BY {pk} LIMIT %s"
        update = f"UPDATE {table} SET {column} = %s WHERE {pk} = %s AND {column} = %s"  # noqa: S608
        done = current = 0
        bad = []
        last = 0
        while True:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(select, [last, batch])
                rows = cursor.fetchall()
                for row_id, stored in rows:
                    if encryption.is_token(stored) and encryption.is_current(stored):
                        current += 1
                        continue
                    try:
                        new = (
                            encryption.rotate(stored)
                            if encryption.is_token(stored)
                            else encryption.encrypt(stored)
                        )
                    except encryption.InvalidToken:
                        bad.append(row_id)
                        continue
                    cursor.execute(update, [new, row_id, stored])
                    done += cursor.rowcount
            if len(rows) < batch:
                return done, current, bad
            last = rows[-1][0]

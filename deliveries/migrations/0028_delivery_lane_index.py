# An ordered lane's head by event (statements "head"), built concurrently on
# PostgreSQL, as 0027's index is: a build interrupted half-way leaves an invalid
# index of the same name, dropped and built again when the migration is rerun.

from django.db import migrations, models

INDEX = models.Index(
    condition=models.Q(("status__in", ["pending", "retrying"])),
    fields=["target", "event"],
    name="delivery_lane_idx",
)


def add_index(apps, schema_editor):
    """On PostgreSQL without locking the deliveries table while it is built."""
    delivery = apps.get_model("deliveries", "Delivery")
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.add_index(delivery, INDEX)
        return
    schema_editor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{INDEX.name}"')
    schema_editor.add_index(delivery, INDEX, concurrently=True)


def remove_index(apps, schema_editor):
    delivery = apps.get_model("deliveries", "Delivery")
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.remove_index(delivery, INDEX)
        return
    schema_editor.remove_index(delivery, INDEX, concurrently=True)


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run in a transaction.
    atomic = False

    dependencies = [
        ("deliveries", "0027_body_file_index"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="delivery", index=INDEX)],
            database_operations=[migrations.RunPython(add_index, remove_index)],
        ),
    ]

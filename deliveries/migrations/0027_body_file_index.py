# The index of 0026's column, built concurrently on PostgreSQL: apart from 0026 so
# that a build interrupted half-way (which leaves PostgreSQL an invalid index) is
# simply run again.

from django.db import migrations, models

INDEX = models.Index(
    condition=models.Q(("body_file__isnull", False)),
    fields=["body_file"],
    name="event_body_file_idx",
)


def add_index(apps, schema_editor):
    """On PostgreSQL without locking the events table while it is built."""
    event = apps.get_model("deliveries", "Event")
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.add_index(event, INDEX)
        return
    # What an interrupted build left: an invalid index of the same name.
    schema_editor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{INDEX.name}"')
    schema_editor.add_index(event, INDEX, concurrently=True)


def remove_index(apps, schema_editor):
    event = apps.get_model("deliveries", "Event")
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.remove_index(event, INDEX)
        return
    schema_editor.remove_index(event, INDEX, concurrently=True)


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run in a transaction.
    atomic = False

    dependencies = [
        ("deliveries", "0026_body_files"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="event", index=INDEX)],
            database_operations=[migrations.RunPython(add_index, remove_index)],
        ),
    ]

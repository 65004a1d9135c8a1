# The values stored so far, encrypted; a migration of its own because PostgreSQL
# refuses to alter a table in the transaction that updated its rows (on the way back).

from django.db import migrations

from webhooker import encryption

# The columns that hold secrets, encrypted at rest from here on.
SECRETS = {
    "webhook": ["alert_url"],
    "entrypoint": ["verification_config"],
    "target": ["config", "signing_secret", "previous_signing_secret"],
}


def _convert(apps, schema_editor, convert):
    # Plain SQL on the stored text: the historical models' fields would decrypt it.
    connection = schema_editor.connection
    q = connection.ops.quote_name
    with connection.cursor() as cursor:
        for model_name, columns in SECRETS.items():
            table = q(apps.get_model("deliveries", model_name)._meta.db_table)
            for column in map(q, columns):
                cursor.execute(f"SELECT id, {column} FROM {table} WHERE {column} <> ''")
                for pk, value in cursor.fetchall():
                    new = convert(value)
                    if new != value:
                        cursor.execute(f"UPDATE {table} SET {column} = %s WHERE id = %s", [new, pk])


def encrypt(apps, schema_editor):
    _convert(
        apps,
        schema_editor,
        lambda value: value if encryption.is_token(value) else encryption.encrypt(value),
    )


def decrypt(apps, schema_editor):
    _convert(
        apps,
        schema_editor,
        lambda value: encryption.decrypt(value) if encryption.is_token(value) else value,
    )


class Migration(migrations.Migration):
    dependencies = [
        ("deliveries", "0020_encrypted_secrets"),
    ]

    operations = [
        migrations.RunPython(encrypt, decrypt),
    ]

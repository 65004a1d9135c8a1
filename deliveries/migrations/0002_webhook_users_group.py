from django.db import migrations

GROUP = "Webhook users"
PERMISSIONS = {
    "webhook": ("add", "change", "delete", "view"),
    "entrypoint": ("add", "change", "delete", "view"),
    "target": ("add", "change", "delete", "view"),
    "event": ("view",),
    "delivery": ("view",),
    "deliveryresult": ("view",),
}


def create_group(apps, schema_editor):
    """A group that lets a staff user manage their own webhooks (and nobody else's).

    Permissions are created by a post_migrate signal, which has not run yet on a
    fresh database, so they are created here when missing.
    """
    from django.contrib.auth.management import create_permissions

    app_config = apps.get_app_config("deliveries")
    app_config.models_module = True  # the stub lacks it; create_permissions checks it
    create_permissions(app_config, apps=apps, verbosity=0)
    app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    group, _ = Group.objects.get_or_create(name=GROUP)
    codenames = [f"{action}_{model}" for model, actions in PERMISSIONS.items() for action in actions]
    group.permissions.set(
        Permission.objects.filter(content_type__app_label="deliveries", codename__in=codenames)
    )


def remove_group(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name=GROUP).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("deliveries", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_group, remove_group)]

"""The Django admin as webhooker's management UI (docs/architecture.md, HTTP surface).

Every admin here is scoped by ownership: a staff user who is not a superuser sees
and changes only the webhooks they own, and only those webhooks' entrypoints,
targets, events and deliveries. The rule is the models' visible_to(); OwnedAdmin
applies it in get_queryset, which the change list, change pages, actions and
autocomplete all go through, and the list filters offer only what it lets through.
A guessed URL of another user's object answers 404 rather than the admin's usual
redirect.
"""

from django.contrib import admin

# Each module registers its model's admin (@admin.register) when imported.
from deliveries.admin import (  # noqa: F401
    alerts,
    audit,
    deliveries,
    entrypoints,
    events,
    keys,
    replays,
    targets,
    webhooks,
)

admin.site.site_header = "webhooker"
admin.site.site_title = "webhooker"
admin.site.index_title = "Dashboard"

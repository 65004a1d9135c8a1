"""The audit log in the console: every create, change and delete of webhooks,
entrypoints, targets, API keys and users (deliveries/audit.py), read-only. A
superuser sees every entry; anyone else those about their own objects and their
own. An object's history is this list narrowed to it (`?content_type=&object_id=`,
linked from the object's page)."""

from auditlog.models import LogEntry
from django.contrib import admin
from unfold.admin import ModelAdmin

from deliveries import audit
from deliveries.admin.base import ReadOnlyMixin, parse_id

if admin.site.is_registered(LogEntry):
    admin.site.unregister(LogEntry)  # auditlog's own, unscoped and unstyled


@admin.register(LogEntry)
class AuditEntryAdmin(ReadOnlyMixin, ModelAdmin):
    list_display = ["timestamp", "action", "kind", "object_repr", "who", "remote_addr", "what"]
    list_filter = ["action", "content_type"]
    list_select_related = ["actor", "content_type"]
    search_fields = ["object_repr"]
    fields = [
        "timestamp",
        "action",
        "kind",
        "object_id",
        "object_repr",
        "who",
        "remote_addr",
        "cid",
        "what",
    ]
    readonly_fields = fields

    def has_view_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_staff

    def has_module_permission(self, request):
        return self.has_view_permission(request)

    def get_queryset(self, request):
        entries = audit.visible_to(request.user)
        # One object's history: the page's own link narrows the list to it.
        content_type = parse_id(request.GET.get("content_type"))
        object_id = parse_id(request.GET.get("object_id"))
        if content_type and object_id:
            entries = entries.filter(content_type_id=content_type, object_id=object_id)
        return entries

    def get_changelist(self, request, **kwargs):
        changelist = super().get_changelist(request, **kwargs)
        # The history parameters are read above, not by the list's own filters.
        keep = ("content_type", "object_id")

        class HistoryList(changelist):
            def get_filters_params(self, params=None):
                params = super().get_filters_params(params)
                for name in keep:
                    params.pop(name, None)
                return params

        return HistoryList

    @admin.display(description="Kind", ordering="content_type__model")
    def kind(self, entry):
        return entry.content_type.name

    @admin.display(description="Who")
    def who(self, entry):
        name = entry.actor.get_username() if entry.actor is not None else "a command or the engine"
        api_key = (entry.additional_data or {}).get("api_key")
        return f"{name} with API key {api_key}" if api_key else name

    @admin.display(description="What changed")
    def what(self, entry):
        return "; ".join(
            f"{field}: {change[0]} → {change[1]}"
            for field, change in entry.changes_dict.items()
            if isinstance(change, list | tuple) and len(change) == 2
        )

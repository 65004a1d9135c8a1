"""API keys."""

from django.contrib import admin, messages
from django.utils import timezone
from django.utils.html import format_html

from deliveries.admin.base import OwnedAdmin, OwnerMixin
from deliveries.models import ApiKey


@admin.register(ApiKey)
class ApiKeyAdmin(OwnerMixin, OwnedAdmin):
    """Keys to the REST API. A new key is shown once, in the message after saving:
    only its digest is stored. Each user sees and revokes their own keys."""

    list_display = ["name", "key_prefix", "state", "created_at", "last_used_at", "expires_at"]
    search_fields = ["name", "prefix"]
    actions = ["revoke"]
    owner_field = "user"
    owner_help_text = "Whose key this is (empty: yours)."

    def get_fields(self, request, obj=None):
        if obj is not None:
            return ["name", "expires_at", *self.get_readonly_fields(request, obj)]
        return ["name", "expires_at", *self.owner_fields(request)]

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return []
        return ["key_prefix", "user", "created_at", "last_used_at", "revoked_at"]

    def save_model(self, request, obj, form, change):
        if change:
            return super().save_model(request, obj, form, change)
        key = obj.set_new_key()
        super().save_model(request, obj, form, change)  # OwnerMixin fills in the user
        self.message_user(
            request,
            format_html(
                "The new key, shown only this once (only its digest is kept): "
                '<code class="wh-url">{}</code>',
                key,
            ),
            messages.WARNING,
        )

    @admin.display(description="Key")
    def key_prefix(self, obj):
        return f"{obj.prefix}…" if obj.prefix else "(shown once saved)"

    @admin.display(description="State")
    def state(self, obj):
        return obj.state(timezone.now())

    @admin.action(description="Revoke selected keys")
    def revoke(self, request, queryset):
        revoked = queryset.revoke()
        self.message_user(request, f"Revoked {revoked} keys.", messages.SUCCESS)

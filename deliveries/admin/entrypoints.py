"""Entrypoints: verification and deduplication, and the requests they refused."""

from django.contrib import admin
from django.utils.html import format_html

from deliveries import signing, verification
from deliveries.admin.base import OwnedAdmin, ReadOnlyInline
from deliveries.admin.filters import EntrypointWebhookFilter
from deliveries.forms import EntrypointForm
from deliveries.models import Entrypoint, Rejection


class RejectionInline(ReadOnlyInline):
    model = Rejection
    fields = ["created_at", "remote_addr", "reason"]
    readonly_fields = fields
    verbose_name_plural = f"rejected requests (the last {Rejection.KEEP}, newest first)"

    def has_view_permission(self, request, obj=None):
        # Part of the entrypoint's record: whoever may see it sees why it refused.
        return request.user.has_perm("deliveries.view_entrypoint")


@admin.register(Entrypoint)
class EntrypointAdmin(OwnedAdmin):
    """An entrypoint's verification and deduplication, and what it refused.
    Entrypoints are added on their webhook's page."""

    form = EntrypointForm
    list_display = ["__str__", "webhook", "verification", "dedup", "active", "created_at"]
    list_select_related = ["webhook"]
    list_filter = [EntrypointWebhookFilter, "verification", "dedup", "active"]
    search_fields = ["description", "webhook__name"]
    inlines = [RejectionInline]
    view_on_site = False  # its URL takes POSTs only
    fieldsets = [
        (None, {"fields": [("webhook", "inbound_path"), ("description", "active")]}),
        (
            "Verification",
            {
                "fields": ["verification", "secret_status", *EntrypointForm.config_keys],
                "description": "Checked over the raw body before anything is stored; a "
                "request that fails is answered 401 and listed below.",
            },
        ),
        ("Deduplication", {"fields": ["dedup", "dedup_source"]}),
    ]
    readonly_fields = ["webhook", "inbound_path", "secret_status"]

    class Media:
        js = ["deliveries/trust.js"]

    def has_add_permission(self, request):
        return False

    @admin.display(description="Inbound path")
    def inbound_path(self, obj):
        return format_html('<code class="wh-url">{}</code>', obj.get_absolute_url())

    @admin.display(description="Stored secret")
    def secret_status(self, obj):
        preset = verification.PRESETS.get(obj.verification)
        stored = [
            f"{key}: {signing.mask(obj.verification_config[key])}"
            for key in (preset.secret_keys if preset else ())
            if obj.verification_config.get(key)
        ]
        return ", ".join(stored) or "none"

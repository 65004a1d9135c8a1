"""Alerts: the notices sent about targets, read-only."""

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from deliveries.admin.base import OwnedAdmin, ReadOnlyMixin
from deliveries.admin.filters import AlertWebhookFilter
from deliveries.models import Alert


@admin.register(Alert)
class AlertAdmin(ReadOnlyMixin, OwnedAdmin):
    list_display = ["created_at", "target_link", "kind", "message", "email", "slack"]
    list_select_related = ["target__webhook"]
    list_filter = ["kind", AlertWebhookFilter]
    fields = ["created_at", "target_link", "kind", "message", "email", "slack"]
    readonly_fields = fields

    def has_view_permission(self, request, obj=None):
        # Alerts are notices about targets: whoever may see the targets may see
        # their alerts (visible_to scopes both), with no permission of their own.
        return request.user.has_perm("deliveries.view_target")

    @admin.display(description="Target", ordering="target__name")
    def target_link(self, obj):
        url = reverse("admin:deliveries_target_change", args=[obj.target_id])
        return format_html(
            '<a href="{}">{} → {}</a>', url, obj.target.webhook.name, obj.target.name
        )

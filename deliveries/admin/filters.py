"""The admin's list filters. Each offers only what visible_to() lets the user see
(a RelatedFieldListFilter would list everyone's rows)."""

from django.contrib import admin
from django.db.models import Exists, OuterRef
from unfold.contrib.filters.admin import DropdownFilter

from deliveries.admin.base import parse_id
from deliveries.models import Delivery, Entrypoint, Target, Webhook


class HealthFilter(admin.SimpleListFilter):
    title = "health"
    parameter_name = "health"

    def lookups(self, request, model_admin):
        return [("ok", "OK"), ("degraded", "Retrying"), ("failing", "Failing")]

    def queryset(self, request, queryset):
        if self.value() == "ok":
            return queryset.filter(failed_24h=0, retrying_now=0)
        if self.value() == "degraded":
            return queryset.filter(failed_24h=0, retrying_now__gt=0)
        if self.value() == "failing":
            return queryset.filter(failed_24h__gt=0)
        return queryset


class WebhookFilter(DropdownFilter):
    """The user's own webhooks only (RelatedFieldListFilter would list everyone's)."""

    title = "webhook"
    parameter_name = "webhook"
    field = "webhook"

    def lookups(self, request, model_admin):
        webhooks = Webhook.objects.visible_to(request.user).order_by("name")
        return list(webhooks.values_list("pk", "name"))

    def queryset(self, request, queryset):
        if self.value():
            pk = parse_id(self.value())
            return queryset.filter(**{self.field: pk}) if pk else queryset.none()
        return queryset


class EntrypointFilter(DropdownFilter):
    title = "entrypoint"
    parameter_name = "entrypoint"

    def lookups(self, request, model_admin):
        entrypoints = Entrypoint.objects.visible_to(request.user).select_related("webhook")
        return [(e.pk, f"{e.webhook.name}: {e}") for e in entrypoints.order_by("webhook__name")]

    def queryset(self, request, queryset):
        if self.value():
            pk = parse_id(self.value())
            return queryset.filter(entrypoint=pk) if pk else queryset.none()
        return queryset


class DeliveryStatusFilter(DropdownFilter):
    """Events with at least one delivery in this status."""

    title = "delivery status"
    parameter_name = "delivery_status"

    def lookups(self, request, model_admin):
        return Delivery.Status.choices

    def queryset(self, request, queryset):
        if self.value() in Delivery.Status.values:
            # EXISTS per event, read from delivery_event_target_uniq: the list
            # stops at its first page of matches instead of joining every delivery.
            return queryset.filter(
                Exists(Delivery.objects.filter(event=OuterRef("pk"), status=self.value()))
            )
        return queryset


class SearchInFilter(DropdownFilter):
    """What the search box searches: codes and event ids (indexed), or a bounded
    window of headers or payloads (deliveries/admin/search.py)."""

    title = "search in"
    parameter_name = "search_in"
    all_option = ["", "Code prefix or event id"]

    def lookups(self, request, model_admin):
        return [("headers", "Header values"), ("payload", "Payload text")]

    def queryset(self, request, queryset):
        return queryset  # the search itself reads the choice


class DeliveryWebhookFilter(WebhookFilter):
    field = "target__webhook"


class TargetFilter(DropdownFilter):
    title = "target"
    parameter_name = "target"

    def lookups(self, request, model_admin):
        targets = (
            Target.objects.visible_to(request.user)
            .select_related("webhook")
            .order_by("webhook__name", "name")
        )
        webhook = parse_id(request.GET.get("webhook"))
        if webhook:
            targets = targets.filter(webhook_id=webhook)
        return [(t.pk, f"{t.webhook.name} → {t.name}") for t in targets]

    def queryset(self, request, queryset):
        if self.value():
            pk = parse_id(self.value())
            return queryset.filter(target=pk) if pk else queryset.none()
        return queryset


class TargetWebhookFilter(WebhookFilter):
    field = "webhook"


class AlertWebhookFilter(WebhookFilter):
    field = "target__webhook"


class EntrypointWebhookFilter(WebhookFilter):
    field = "webhook"

from django.contrib import admin

from deliveries.models import Delivery, DeliveryResult, Entrypoint, Event, Target, Webhook


class EntrypointInline(admin.TabularInline):
    model = Entrypoint
    extra = 0
    fields = ["code", "description", "active", "created_at"]
    readonly_fields = ["code", "created_at"]


class TargetInline(admin.StackedInline):
    model = Target
    extra = 0
    fields = ["name", "type", "active", "config", "max_retries", "max_queue_size"]


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "retention_days", "created_at"]
    search_fields = ["name", "code"]
    fields = ["name", "description", "retention_days"]
    inlines = [EntrypointInline, TargetInline]

    def save_model(self, request, obj, form, change):
        if not change:
            obj.owner = request.user
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        form.instance.ensure_entrypoint()


class ReadOnlyAdmin(admin.ModelAdmin):
    """Events and deliveries are records of what happened: never edited by hand."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class DeliveryInline(admin.TabularInline):
    model = Delivery
    extra = 0
    fields = ["target", "status", "attempts", "next_attempt_at", "updated_at"]
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ["code", "webhook", "method", "content_type", "body_size", "received_at"]
    list_select_related = ["webhook"]
    list_filter = ["webhook"]
    search_fields = ["code"]
    exclude = ["body"]
    inlines = [DeliveryInline]
    show_full_result_count = False


class DeliveryResultInline(admin.TabularInline):
    model = DeliveryResult
    extra = 0
    fields = ["attempt", "created_at", "success", "status_code", "duration_ms", "error"]
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    list_display = ["id", "event", "target", "status", "attempts", "next_attempt_at", "updated_at"]
    list_select_related = ["event", "target"]
    list_filter = ["status"]
    search_fields = ["event__code"]
    inlines = [DeliveryResultInline]
    show_full_result_count = False

"""Deliveries: the list, the page (each attempt's request beside its response, read
with the delivery's state in one statement, reloading itself while the delivery is
on its way), the Redeliver and Retry now actions and buttons."""

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.utils import flatten_fieldsets
from django.db.models import F
from django.template.loader import render_to_string
from django.urls import reverse

from deliveries import export
from deliveries.admin import search
from deliveries.admin.base import (
    CappedCountPaginator,
    ExportsList,
    OwnedAdmin,
    ReadOnlyMixin,
    confirmed,
    copyable_code,
    delivery_buttons,
    post_urls,
    redirect_back,
    status_badge,
)
from deliveries.admin.filters import (
    AwareRangeDateTimeFilter,
    CappedChoicesDropdownFilter,
    DeliveryWebhookFilter,
    FaultFilter,
    TargetFilter,
)
from deliveries.admin.replays import OffersReplay
from deliveries.models import Delivery, DeliveryResult, Event

# The newest attempts the page shows.
ATTEMPTS_SHOWN = 50
_STATE = ["status", "attempts", "next_attempt_at", "updated_at"]
_RESULT = [field.attname for field in DeliveryResult._meta.concrete_fields]


def read_consistently(delivery: Delivery) -> None:
    """The delivery's state and its newest attempts (as `attempt_rows`) from one
    SELECT, a LEFT JOIN: the engine writes an attempt's result and the delivery's
    new state in one transaction, and one statement sees either both or neither.
    (Read apart, a page showed "pending, 4 attempts" above attempt 5.)"""
    rows = list(
        Delivery.objects.filter(pk=delivery.pk)
        .values(*_STATE, *(f"results__{name}" for name in _RESULT))
        .order_by(F("results__attempt").desc(nulls_last=True), "-results__id")[:ATTEMPTS_SHOWN]
    )
    if rows:  # else it is gone: the page shows what get_object() read
        for name in _STATE:
            setattr(delivery, name, rows[0][name])
    delivery.attempt_rows = [
        DeliveryResult(**{name: row[f"results__{name}"] for name in _RESULT})
        for row in rows
        if row["results__id"] is not None
    ]


@admin.register(Delivery)
class DeliveryAdmin(OffersReplay, ExportsList, ReadOnlyMixin, OwnedAdmin):
    export_columns = export.DELIVERY_COLUMNS
    replay_from = "delivery"

    def export_rows(self, queryset):
        return export.deliveries_for_export(queryset)

    list_display = [
        "id",
        "badge",
        "webhook",
        "target",
        "event_link",
        "attempts",
        "last_status_code",
        "next_attempt_at",
        "updated_at",
    ]
    list_display_links = ["id"]
    # Only columns an index orders: any other sort would read every delivery.
    sortable_by = ["id", "badge", "attempts", "updated_at"]
    list_select_related = ["target__webhook"]
    list_filter = [
        ("status", CappedChoicesDropdownFilter),
        FaultFilter,
        ("failure", CappedChoicesDropdownFilter),
        ("target__type", CappedChoicesDropdownFilter),
        DeliveryWebhookFilter,
        TargetFilter,
        ("created_at", AwareRangeDateTimeFilter),
    ]
    list_filter_submit = True
    search_fields = ["=event__code"]
    search_help_text = "An event's code prefix or its sender's event id."
    paginator = CappedCountPaginator
    show_full_result_count = False
    actions = ["redeliver", "retry_now"]
    change_form_template = "admin/deliveries/refreshing_change_form.html"
    fieldsets = [
        (None, {"fields": ["buttons", ("badge", "attempts", "next_attempt_at")]}),
        (None, {"fields": [("event_link", "webhook", "target"), ("created_at", "updated_at")]}),
        ("Attempts", {"fields": ["attempts_view"]}),
    ]
    readonly_fields = flatten_fieldsets(fieldsets)

    def get_urls(self):
        return post_urls(self, self.act_on_one, ("retry_now", "redeliver")) + super().get_urls()

    def act_on_one(self, name, request, object_id):
        """The page buttons: one delivery, no confirmation needed (it is one)."""
        delivery = self.get_object(request, object_id)  # 404 for others' deliveries
        one = self.get_queryset(request).filter(pk=delivery.pk)
        if name == "retry_now":
            done = one.retry_now()
            text = "It will be attempted now." if done else "It was not waiting for a retry."
        else:
            done = one.redeliver()
            text = "Queued for redelivery." if done else "It is already on its way."
        self.message_user(
            request, f"Delivery {delivery.pk}: {text}", messages.SUCCESS if done else messages.INFO
        )
        fallback = reverse("admin:deliveries_delivery_change", args=[delivery.pk])
        return redirect_back(request, request.GET.get("next", ""), fallback)

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        events = search.find(Event.objects.all(), term).values("pk")
        return queryset.filter(event__in=events), False

    @admin.display(description="")
    def buttons(self, obj):
        here = reverse("admin:deliveries_delivery_change", args=[obj.pk])
        return delivery_buttons(obj, here, empty="–")

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            read_consistently(obj)
            # The page reloads itself while the engine may still change it.
            if obj.status in Delivery.UNFINISHED:
                context["refresh_seconds"] = settings.WEBHOOKER_CONSOLE_REFRESH
        return super().render_change_form(request, context, add, change, form_url, obj)

    @admin.display(description="Attempts, newest first")
    def attempts_view(self, obj):
        """Each attempt: what was sent beside what came back."""
        if not hasattr(obj, "attempt_rows"):
            read_consistently(obj)
        attempts = [
            {
                "result": result,
                "response_headers": [
                    line.partition(": ")[::2]
                    for line in result.response_headers.splitlines()
                    if line
                ],
            }
            for result in obj.attempt_rows
        ]
        return render_to_string("admin/deliveries/delivery/attempts.html", {"attempts": attempts})

    def get_changelist_instance(self, request):
        changelist = super().get_changelist_instance(request)
        # The page's event codes and last status codes: two queries for the page,
        # where a join and a subquery per row would also weigh on the list's count
        # and its ordering over a million rows.
        rows = {d.pk: d for d in changelist.result_list}
        codes = dict(
            Event.objects.filter(pk__in={d.event_id for d in rows.values()}).values_list(
                "pk", "code"
            )
        )
        last = {}
        for delivery, code in (
            DeliveryResult.objects.filter(delivery__in=list(rows))
            .order_by("delivery", "attempt", "id")
            .values_list("delivery", "status_code")
        ):
            last[delivery] = code
        for delivery in rows.values():
            delivery.event_code = codes.get(delivery.event_id, "")
            delivery.last_status_code = last.get(delivery.pk)
        return changelist

    def lookup_allowed(self, lookup, value, request=None):
        if lookup in ("status__in",):
            return True
        return super().lookup_allowed(lookup, value, request)

    @admin.display(description="Status", ordering="status")
    def badge(self, obj):
        return status_badge(obj.status)

    @admin.display(description="Webhook")
    def webhook(self, obj):
        return obj.target.webhook

    @admin.display(description="Attempts", ordering="attempts")
    def attempts(self, obj):
        return obj.attempts

    @admin.display(description="Event")
    def event_link(self, obj):
        url = reverse("admin:deliveries_event_change", args=[obj.event_id])
        if not hasattr(obj, "event_code"):  # the change page: one delivery
            obj.event_code = Event.objects.values_list("code", flat=True).get(pk=obj.event_id)
        return copyable_code(obj.event_code, url)

    @admin.display(description="Last code")
    def last_status_code(self, obj):
        code = getattr(obj, "last_status_code", None)
        return code if code is not None else "–"

    @admin.action(description="Redeliver selected deliveries")
    @confirmed("deliveries")
    def redeliver(self, request, queryset):
        total = queryset.count()
        queued = queryset.redeliver()
        skipped = total - queued
        note = f" {skipped} pending or retrying were already on their way." if skipped else ""
        self.message_user(
            request, f"Queued {queued} deliveries for redelivery.{note}", messages.SUCCESS
        )

    @admin.action(description="Retry now (skip the rest of the backoff)")
    @confirmed("deliveries")
    def retry_now(self, request, queryset):
        total = queryset.count()
        hurried = queryset.retry_now()
        message = f"{hurried} deliveries will be attempted now."
        if total > hurried:
            message += f" {total - hurried} were not waiting for a retry."
        self.message_user(request, message, messages.SUCCESS)

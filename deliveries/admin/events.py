"""Events: the list (search, outcome per event), the page (deliveries, request,
headers, body), the body's download and Replay."""

import json
import re

from django.contrib import admin, messages
from django.contrib.admin.utils import flatten_fieldsets
from django.db.models import Count, OuterRef, Subquery
from django.http import Http404, HttpResponse, HttpResponseRedirect
from django.template.defaultfilters import filesizeformat
from django.template.loader import render_to_string
from django.urls import path, reverse
from django.utils.html import format_html

from deliveries import bodies, export
from deliveries.admin import search
from deliveries.admin.base import (
    CappedCountPaginator,
    ExportsList,
    OwnedAdmin,
    ReadOnlyMixin,
    ask_first,
    confirmed,
    copyable_code,
    delivery_buttons,
)
from deliveries.admin.filters import (
    AwareRangeDateTimeFilter,
    DeliveryStatusFilter,
    EntrypointFilter,
    WebhookFilter,
)
from deliveries.admin.replays import OffersReplay
from deliveries.admin.search import SCAN_ROWS
from deliveries.forms import ResendForm
from deliveries.models import Delivery, DeliveryResult, Event

# Every status, the ones that need a look first.
OUTCOME_ORDER = [
    Delivery.Status.FAILED,
    Delivery.Status.RETRYING,
    Delivery.Status.PENDING,
    Delivery.Status.DELIVERED,
    Delivery.Status.FILTERED,
]


def outcome_badges(counts: dict[str, int]):
    """'2 of 2 delivered', or one badge per status that is not delivered."""
    total = sum(counts.values())
    delivered = counts.get(Delivery.Status.DELIVERED, 0)
    if total and delivered == total:
        badges = [(Delivery.Status.DELIVERED, f"{delivered} of {total} delivered")]
    else:
        badges = [
            (status, f"{counts[status]} {status}") for status in OUTCOME_ORDER if counts.get(status)
        ]
    return render_to_string("admin/deliveries/event/outcome.html", {"badges": badges})


@admin.register(Event)
class EventAdmin(OffersReplay, ExportsList, ReadOnlyMixin, OwnedAdmin):
    export_columns = export.EVENT_COLUMNS
    replay_from = "event"

    list_display = [
        "short_code",
        "webhook",
        "kind",
        "provider_id",
        "size",
        "received_at",
        "outcome",
    ]
    list_display_links = None
    # Only columns an index orders (the code's unique index, event_received_idx).
    sortable_by = ["short_code", "received_at"]
    list_select_related = ["webhook"]
    list_filter = [
        WebhookFilter,
        EntrypointFilter,
        ("received_at", AwareRangeDateTimeFilter),
        DeliveryStatusFilter,
    ]
    list_filter_submit = True
    search_fields = ["=code"]
    search_help_text = (
        "A code prefix (8 characters are plenty) or the sender's event id "
        "(e.g. X-GitHub-Delivery); or, with “Search in”, header values or payload text "
        f"among the {SCAN_ROWS:,} newest events of the date range."
    )
    list_before_template = "admin/deliveries/event/search_note.html"
    paginator = CappedCountPaginator
    show_full_result_count = False
    actions = ["replay"]
    fieldsets = [
        ("Deliveries", {"fields": ["deliveries_table"]}),
        (None, {"fields": [("code", "received_at"), ("webhook", "entrypoint")]}),
        ("Sender's event", {"fields": [("event_type", "provider_id"), "received"]}),
        (None, {"fields": ["resend_link"]}),
        (
            "Request",
            {
                "fields": [
                    ("method", "content_type", "size"),
                    ("remote_addr", "query_string"),
                    ("request_id", "traceparent"),
                ]
            },
        ),
        ("Headers", {"fields": ["headers_table"]}),
        ("Body", {"fields": ["body_view"]}),
    ]
    readonly_fields = [name for name in flatten_fieldsets(fieldsets) if not isinstance(name, tuple)]

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        if request.resolver_match and request.resolver_match.url_name.endswith("changelist"):
            # The list never shows bodies or headers: don't read megabytes per page.
            queryset = queryset.defer("body", "headers")
        return queryset

    def get_urls(self):
        return [
            path(
                "<path:object_id>/body/",
                self.admin_site.admin_view(self.body_download),
                name="deliveries_event_body",
            ),
            path(
                "<path:object_id>/resend/",
                self.admin_site.admin_view(self.resend_view),
                name="deliveries_event_resend",
            ),
            *super().get_urls(),
        ]

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        where = request.GET.get("search_in")
        if where in ("headers", "payload"):
            found, reach = search.scan(queryset, term, where)
            request.wh_search_scan = {"where": where, "scan": reach}
            return found, False
        return search.find(queryset, term), False

    # What the search box searches, chosen beside it (search_form.html).
    SEARCH_IN = [
        ("", "Code or event id"),
        ("headers", "Header values"),
        ("payload", "Payload text"),
    ]

    def get_changelist(self, request, **kwargs):
        base = super().get_changelist(request, **kwargs)
        choices = self.SEARCH_IN

        class EventList(base):
            search_in_choices = choices

            def get_filters_params(self, params=None):
                # Read by get_search_results, not a filter: kept out of the lookups
                # (and of the hidden inputs the search form carries over).
                params = super().get_filters_params(params)
                self.search_in = params.pop("search_in", [""])[-1]
                return params

        return EventList

    def get_changelist_instance(self, request):
        changelist = super().get_changelist_instance(request)
        # The outcome of the page's events: one grouped query, not one per row.
        events = {event.pk: event for event in changelist.result_list}
        for event in events.values():
            event.delivery_counts = {}
        rows = (
            Delivery.objects.filter(event__in=list(events))
            .values_list("event", "status")
            .annotate(n=Count("pk"))
            .order_by()
        )
        for event_id, status, n in rows:
            events[event_id].delivery_counts[status] = n
        return changelist

    @admin.display(description="Event", ordering="code")
    def short_code(self, obj):
        return copyable_code(obj.code, reverse("admin:deliveries_event_change", args=[obj.pk]))

    @admin.display(description="Type", ordering="event_type")
    def kind(self, obj):
        return obj.event_type or "–"

    @admin.display(description="Deliveries")
    def outcome(self, obj):
        return outcome_badges(getattr(obj, "delivery_counts", {}))

    @admin.display(description="Received")
    def received(self, obj):
        if not obj.provider_id:
            return "–"
        if not obj.duplicates:
            return "once"
        return f"{obj.duplicates + 1} times (the repeats were answered as duplicates)"

    @admin.display(description="")
    def deliveries_table(self, obj):
        deliveries = obj.deliveries.select_related("target").order_by("target__name", "pk")
        last = DeliveryResult.objects.filter(delivery=OuterRef("pk")).order_by("-attempt", "-id")
        deliveries = deliveries.annotate(last_code=Subquery(last.values("status_code")[:1]))
        here = reverse("admin:deliveries_event_change", args=[obj.pk])
        rows = [(d, delivery_buttons(d, here)) for d in deliveries]
        return render_to_string("admin/deliveries/event/deliveries.html", {"rows": rows})

    def resend_view(self, request, object_id):
        """Edit and resend: the event's header lines and body in a form; saved, a new
        event linked to this one, delivered as usual (Event.resend)."""
        event = self.get_object(request, object_id)  # 404 for junk ids and others' events
        try:
            body = event.read_body()
        except bodies.Unreadable as exc:
            self.message_user(request, f"Cannot resend: {exc}.", messages.ERROR)
            return HttpResponseRedirect(reverse("admin:deliveries_event_change", args=[event.pk]))
        initial = {
            "headers": "\n".join(f"{name}: {value}" for name, value in event.headers),
            "body": body.decode("utf-8", "replace"),
        }
        form = ResendForm(request.POST if "apply" in request.POST else None, initial=initial)
        if not form.is_valid():
            return ask_first(
                self,
                request,
                title="Edit and resend",
                intro="A new event is stored with these header lines and this body, "
                "linked to this one, and delivered to the webhook's active targets.",
                objects=[event],
                describe=lambda e: f"event {e.code}",
                form=form,
                hidden={"apply": "1"},
                submit="Resend",
            )
        copy = event.resend(body=form.cleaned_data["body"], headers=form.cleaned_data["headers"])
        self.message_user(request, f"Stored and queued as event {copy.code}.", messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:deliveries_event_change", args=[copy.pk]))

    @admin.display(description="Resend")
    def resend_link(self, obj):
        if obj.pk is None:
            return "–"
        url = reverse("admin:deliveries_event_resend", args=[obj.pk])
        origin = ""
        if obj.resent_from_id:
            back = reverse("admin:deliveries_event_change", args=[obj.resent_from_id])
            origin = format_html(' · a resend of <a href="{}">this event</a>', back)
        return format_html('<a class="wh-button" href="{}">Edit and resend…</a>{}', url, origin)

    def body_download(self, request, object_id):
        """The exact bytes as received."""
        if not self.has_view_permission(request):
            raise Http404
        event = self.get_object(request, object_id)  # 404 for junk ids and others' events
        try:
            body = event.read_body()
        except bodies.Unreadable as exc:
            return HttpResponse(f"{exc}\n", status=500, content_type="text/plain")
        response = HttpResponse(body, content_type="application/octet-stream")
        response["Content-Disposition"] = f'attachment; filename="event-{event.code}.bin"'
        response["X-Content-Type-Options"] = "nosniff"
        return response

    @admin.display(description="Size", ordering="body_size")
    def size(self, obj):
        return filesizeformat(obj.body_size)

    @admin.display(description="Headers")
    def headers_table(self, obj):
        lines = [(name, header_text(value)) for name, value in obj.headers]
        return render_to_string("admin/deliveries/headers.html", {"lines": lines})

    @admin.display(description="Body")
    def body_view(self, obj):
        try:
            body = obj.read_body()
        except bodies.Unreadable as exc:
            return format_html('<p class="errornote">{}.</p>', str(exc).capitalize())
        kind, text = body_preview(body)
        return render_to_string(
            "admin/deliveries/event/body.html",
            {"event": obj, "size": len(body), "kind": kind, "text": text},
        )

    @admin.action(description="Replay selected events to their targets")
    @confirmed("events")
    def replay(self, request, queryset):
        reset, created = queryset.replay()
        self.message_user(
            request,
            f"Queued {reset + created} deliveries: {reset} redelivered, {created} new for "
            "targets added since.",
            messages.SUCCESS,
        )


BODY_PREVIEW = 256 * 1024
# Half of a UTF-16 pair alone: JSON may escape one ("\ud800"), but no UTF-8 page
# can carry it.
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def header_text(value: str) -> str:
    """A header value as its sender wrote it. The server hands values over as their
    bytes read as Latin-1 (and they are stored, and forwarded, that way); most
    senders mean UTF-8, so show that when the bytes are UTF-8."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return value


def body_preview(body: bytes) -> tuple[str, str]:
    """Pretty JSON, else text, else a hex view, at most BODY_PREVIEW bytes: the
    view's kind ("json", "", "hex") and its text."""
    shown = body[:BODY_PREVIEW]
    cut = "" if len(body) <= BODY_PREVIEW else f"\n… {len(body) - BODY_PREVIEW} more bytes"
    try:
        text = shown.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None:
        try:
            pretty = json.dumps(json.loads(body), indent=2, ensure_ascii=False)
            pretty = LONE_SURROGATE.sub(lambda m: f"\\u{ord(m[0]):04x}", pretty)
            return "json", pretty[:BODY_PREVIEW]
        except (ValueError, RecursionError):  # not JSON, or nested too deep to show
            return "", text + cut
    lines = []
    for offset in range(0, len(shown), 16):
        chunk = shown[offset : offset + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        printable = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{offset:08x}  {hexes:<47}  {printable}")
    return "hex", "\n".join(lines) + cut

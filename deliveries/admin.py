"""The Django admin as webhooker's management UI (docs/architecture.md, HTTP surface).

Every admin here is scoped by ownership: a staff user who is not a superuser sees
and changes only the webhooks they own, and only those webhooks' entrypoints,
targets, events and deliveries. The rule is the models' visible_to(); OwnedAdmin
applies it in get_queryset, which the change list, change pages, actions and
autocomplete all go through, and the list filters offer only what it lets through.
A guessed URL of another user's object answers 404 rather than the admin's usual
redirect.
"""

import datetime
import functools
import json
import re

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import flatten_fieldsets
from django.core.paginator import Paginator
from django.db.models import (
    Count,
    Exists,
    F,
    Func,
    IntegerField,
    OuterRef,
    Subquery,
    URLField,
)
from django.http import Http404, HttpResponse, HttpResponseRedirect
from django.template.defaultfilters import filesizeformat
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST
from unfold.admin import ModelAdmin, StackedInline, TabularInline
from unfold.contrib.filters.admin import (
    ChoicesDropdownFilter,
    DropdownFilter,
    RangeDateTimeFilter,
)

from deliveries import health, search, signing, ssrf, verification
from deliveries.forms import EntrypointForm, PauseForm, RedeliverFailedForm, TargetForm
from deliveries.models import (
    Alert,
    ApiKey,
    Delivery,
    DeliveryResult,
    Entrypoint,
    Event,
    Rejection,
    Target,
    Webhook,
)
from deliveries.search import SCAN_ROWS
from deliveries.targets.base import TargetURLField

STATUS_COLOURS = {
    "pending": "#6b7280",
    "retrying": "#b45309",
    "delivered": "#15803d",
    "failed": "#b91c1c",
    "filtered": "#0e7490",
}


def status_badge(status, text=None):
    return format_html(
        '<span class="wh-badge" style="background:{}">{}</span>',
        STATUS_COLOURS.get(status, "#6b7280"),
        text or status,
    )


class AtLeast(int):
    """A count that was capped: it pages as the number it is, and reads "10000+"
    wherever the admin prints it ("Select all 10000+ deliveries"), never as if it
    were the exact number."""

    def __str__(self):
        return f"{int(self) - 1}+"


class CappedCountPaginator(Paginator):
    """Counts at most CAP rows: a COUNT(*) over millions of rows is the slowest
    query a change list runs, and nobody pages past the first few thousand."""

    CAP = 10_000

    @cached_property
    def count(self):
        count = self.object_list[: self.CAP + 1].count()
        return AtLeast(count) if count > self.CAP else count


def confirmed(noun: str):
    """A bulk action that first shows the exact number of `noun` it will act on.

    The page pins the set: with "select all" it records the highest id shown, so
    rows arriving meanwhile are not swept in, and the count is a real COUNT, not
    the list's capped one.
    """

    def wrap(func):
        @functools.wraps(func)
        def action(self, request, queryset):
            upto = parse_id(request.POST.get("upto"))
            if request.POST.get("confirm") != "1" or not upto:
                return confirm_page(self, request, queryset, action, noun)
            return func(self, request, queryset.filter(pk__lte=upto))

        return action

    return wrap


def confirm_page(model_admin, request, queryset, func, noun):
    count = queryset.count()
    if not count:
        model_admin.message_user(request, f"No {noun} to act on.", messages.WARNING)
        return None
    upto = queryset.order_by("-pk").values_list("pk", flat=True)[0]
    hidden = {
        "action": request.POST.get("action", ""),
        "select_across": request.POST.get("select_across", "0"),
        "index": "0",
        ACTION_CHECKBOX_NAME: request.POST.getlist(ACTION_CHECKBOX_NAME),
        "upto": str(upto),
    }
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": func.short_description,
        "count": count,
        "noun": noun,
        "sample": queryset.order_by("-pk")[:10],
        "hidden": hidden,
        "media": model_admin.media,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/deliveries/confirm_action.html", context)


class OwnedAdmin(ModelAdmin):
    """Scopes every query to the requesting user's webhooks."""

    def get_queryset(self, request):
        return super().get_queryset(request).visible_to(request.user)

    def get_object(self, request, object_id, from_field=None):
        obj = super().get_object(request, object_id, from_field)
        if obj is None:
            # The admin would redirect with "doesn't exist"; another user's
            # object must look exactly like one that does not exist at all.
            raise Http404("No such object.")
        return obj


class ReadOnlyMixin:
    """Records of what happened are never edited by hand (actions change them)."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return request.user.is_superuser


# --- webhooks ------------------------------------------------------------------


class EntrypointInline(TabularInline):
    model = Entrypoint
    # Its URL takes POSTs only: a "View on site" link to it would answer 405.
    view_on_site = False
    extra = 0
    fields = ["inbound_url", "description", "active", "trust", "created_at"]
    readonly_fields = ["inbound_url", "trust", "created_at"]

    def get_formset(self, request, obj=None, **kwargs):
        self._request = request  # inline instances are made per request
        return super().get_formset(request, obj, **kwargs)

    @admin.display(description="Inbound URL")
    def inbound_url(self, obj):
        if not obj.pk:
            return "(shown once saved)"
        url = obj.inbound_url(self._request)
        return format_html(
            '<code class="wh-url">{}</code> <button type="button" class="wh-copy" '
            'data-copy="{}">Copy</button>',
            url,
            url,
        )

    @admin.display(description="Verification and dedup")
    def trust(self, obj):
        if not obj.pk:
            return "(set once saved)"
        return format_html(
            '{} <a href="{}">change</a>',
            trust_summary(obj),
            reverse("admin:deliveries_entrypoint_change", args=[obj.pk]),
        )


def trust_summary(entrypoint) -> str:
    parts = [entrypoint.get_verification_display() if entrypoint.verification != "none" else ""]
    if entrypoint.dedup:
        parts.append(f"dedup by {entrypoint.id_source}")
    return " · ".join(p for p in parts if p) or "none"


class SigningSecretMixin:
    """The target's signing secret, masked until revealed, with Copy and Rotate."""

    @admin.display(description="Signing secret")
    def signing_secret_view(self, obj):
        if not obj.pk:
            return "(made when the target is saved)"
        element = f"wh-secret-{obj.pk}"
        rotated = ""
        if obj.previous_signing_secret and obj.secret_rotated_at:
            rotated = format_html(
                "<br><small>Rotated {}; the previous secret is also signed with until the "
                "overlap ends.</small>",
                timezone.localtime(obj.secret_rotated_at).strftime("%Y-%m-%d %H:%M"),
            )
        masked = signing.mask(obj.signing_secret)
        return format_html(
            '<code id="{}" class="wh-url" data-secret="{}" data-masked="{}">{}</code>'
            ' <button type="button" class="wh-copy wh-reveal" data-for="{}">Reveal</button>'
            ' <button type="button" class="wh-copy" data-copy="{}">Copy</button>'
            ' <button type="submit" class="wh-copy wh-rotate" formaction="{}" formmethod="post"'
            ' data-confirm="{}">Rotate secret</button>{}',
            element,
            obj.signing_secret,
            masked,
            masked,
            element,
            obj.signing_secret,
            reverse("admin:deliveries_target_rotate_secret", args=[obj.pk]),
            "Make a new signing secret? Unsaved changes on this page are lost. "
            "The current secret stays valid during the rotation overlap.",
            rotated,
        )


# The target form's fieldsets after its type's fields: on the webhook page and on
# the target's own page.
TARGET_FIELDSETS = [
    (
        "Signing (Standard Webhooks)",
        {"fields": ["signing", "signing_secret_view"], "classes": ["wh-type-http"]},
    ),
    ("Delivery", {"fields": [("max_retries", "max_queue_size"), ("ordered", "rate_limit")]}),
    ("Pause", {"fields": [("paused", "paused_reason")]}),
    ("Filters", {"fields": ["filters"]}),
]


class TargetInline(SigningSecretMixin, StackedInline):
    model = Target
    form = TargetForm
    extra = 0
    fieldsets = [
        (None, {"fields": [("name", "type", "active"), "health_line"]}),
        *TargetForm.type_fieldsets(),
        *TARGET_FIELDSETS,
    ]
    readonly_fields = ["health_line", "signing_secret_view"]

    def get_formset(self, request, obj=None, **kwargs):
        self._breakers = health.breakers()  # inline instances are made per request
        kwargs["form"] = TargetForm.for_user(request.user)
        return super().get_formset(request, obj, **kwargs)

    @admin.display(description="Health (24 h)")
    def health_line(self, obj):
        if not obj.pk:
            return "–"
        return health_text(health.detail(obj, self._breakers), obj.pk)


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


def posted_urls(post) -> list[str]:
    """The URLs a webhook or target form checks: targets' (with the inline's prefix,
    or without on the target's page) and the webhook's alert URL."""
    names = ("url", "webhook_url", "alert_url")
    return [value for key, value in post.items() if key.rsplit("-", 1)[-1] in names]


def _subcount(queryset):
    """COUNT(*) of `queryset` as a correlated subquery: one per row of the page and
    no join between events and deliveries multiplying each other's rows."""
    counted = queryset.order_by().annotate(n=Func(F("pk"), function="COUNT")).values("n")
    return Subquery(counted[:1], output_field=IntegerField())


@admin.register(Webhook)
class WebhookAdmin(OwnedAdmin):
    list_display = ["name", "health", "events_24h", "failing", "targets_count", "created_at"]
    list_filter = [HealthFilter]
    search_fields = ["name", "description"]
    inlines = [EntrypointInline, TargetInline]
    # The alert URL is checked as target URLs are: its scheme typed out.
    formfield_overrides = {URLField: {"form_class": TargetURLField}}

    class Media:
        js = ["deliveries/trust.js"]

    def get_list_display(self, request):
        if request.user.is_superuser:
            return [*self.list_display[:1], "owner", *self.list_display[1:]]
        return self.list_display

    def get_fields(self, request, obj=None):
        fields = ["name", "description", "retention_days", "alert_url"]
        if request.user.is_superuser:
            fields.append("owner")
        return fields

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        # The admin validates and saves inside one transaction, which on SQLite holds
        # the database's write lock: resolve the targets' hosts (SSRF check) before
        # it starts, so a slow DNS answer never makes the inbound endpoint wait.
        urls = posted_urls(request.POST)
        with ssrf.resolved_in_advance(urls):
            return super().changeform_view(request, object_id, form_url, extra_context)

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change, **kwargs)
        if "owner" in form.base_fields:
            owner = form.base_fields["owner"]
            owner.required = False
            owner.help_text = "Who sees and manages this webhook (empty: you)."
        return form

    def get_queryset(self, request):
        since = timezone.now() - datetime.timedelta(hours=24)

        return (
            super()
            .get_queryset(request)
            .select_related("owner")
            .annotate(
                events_24h=_subcount(
                    Event.objects.filter(webhook=OuterRef("pk"), received_at__gte=since)
                ),
                failed_24h=_subcount(
                    Delivery.objects.filter(
                        target__webhook=OuterRef("pk"), status="failed", updated_at__gte=since
                    )
                ),
                retrying_now=_subcount(
                    Delivery.objects.filter(target__webhook=OuterRef("pk"), status="retrying")
                ),
                targets_count=Count("targets", distinct=True),
            )
        )

    def save_model(self, request, obj, form, change):
        if not obj.owner_id:  # new (the owner field is a superuser's only)
            obj.owner = request.user
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        form.instance.ensure_entrypoint()

    @admin.display(description="Health")
    def health(self, obj):
        if obj.failed_24h:
            return format_html(
                '<span class="wh-dot wh-bad" title="{}">●</span> failing',
                "failed deliveries in the last 24 h",
            )
        if obj.retrying_now:
            return format_html(
                '<span class="wh-dot wh-warn" title="{}">●</span> retrying',
                "deliveries waiting for a retry",
            )
        return format_html(
            '<span class="wh-dot wh-ok" title="{}">●</span> ok', "nothing failed in the last 24 h"
        )

    @admin.display(description="Events (24 h)", ordering="events_24h")
    def events_24h(self, obj):
        return obj.events_24h

    @admin.display(description="Failing", ordering="failed_24h")
    def failing(self, obj):
        total = obj.failed_24h + obj.retrying_now
        if not total:
            return 0
        url = reverse("admin:deliveries_delivery_changelist")
        return format_html(
            '<a href="{}?webhook={}&status__in=failed,retrying">{} ({} failed, {} retrying)</a>',
            url,
            obj.pk,
            total,
            obj.failed_24h,
            obj.retrying_now,
        )

    @admin.display(description="Targets", ordering="targets_count")
    def targets_count(self, obj):
        return obj.targets_count


# --- events --------------------------------------------------------------------


class ReadOnlyInline(TabularInline):
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class DeliveryInline(ReadOnlyInline):
    model = Delivery
    fields = ["link", "target", "badge", "attempts", "next_attempt_at", "updated_at"]
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("target")

    @admin.display(description="Delivery")
    def link(self, obj):
        url = reverse("admin:deliveries_delivery_change", args=[obj.pk])
        return format_html('<a href="{}">#{}</a>', url, obj.pk)

    @admin.display(description="Status")
    def badge(self, obj):
        return status_badge(obj.status)


def parse_id(value) -> int | None:
    """A primary key from a query string, or None for anything else ('²', 10**20…).
    The filters' "show counts" passes their own choices, ints, through here too."""
    value = str(value) if value is not None else ""
    if not value or not value.isascii() or not value.isdigit() or len(value) > 18:
        return None
    return int(value) or None


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
    window of headers or payloads (deliveries/search.py)."""

    title = "search in"
    parameter_name = "search_in"
    all_option = ["", "Code prefix or event id"]

    def lookups(self, request, model_admin):
        return [("headers", "Header values"), ("payload", "Payload text")]

    def queryset(self, request, queryset):
        return queryset  # the search itself reads the choice


OUTCOME_ORDER = ["failed", "retrying", "pending", "delivered", "filtered"]


def outcome_badges(counts: dict[str, int]):
    """'2 of 2 delivered', or one badge per status that is not delivered."""
    total = sum(counts.values())
    if not total:
        return format_html('<span class="wh-quiet">no targets</span>')
    delivered = counts.get("delivered", 0)
    if delivered == total:
        return status_badge("delivered", f"{delivered} of {total} delivered")
    badges = [
        status_badge(status, f"{counts[status]} {status}")
        for status in OUTCOME_ORDER
        if counts.get(status)
    ]
    return format_html_join(" ", "{}", ((badge,) for badge in badges))


def copyable_code(code, url=None):
    """The first 8 characters of a code; the whole on hover and on Copy."""
    short = str(code)[:8]
    text = format_html('<a href="{}">{}</a>', url, short) if url else short
    return format_html(
        '<span class="wh-code" title="{}">{}</span>'
        '<button type="button" class="wh-copy wh-copy-icon" data-copy="{}" title="Copy {}">'
        '<span class="material-symbols-outlined">content_copy</span></button>',
        code,
        text,
        code,
        code,
    )


@admin.register(Event)
class EventAdmin(ReadOnlyMixin, OwnedAdmin):
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
        SearchInFilter,
        WebhookFilter,
        EntrypointFilter,
        ("received_at", RangeDateTimeFilter),
        DeliveryStatusFilter,
    ]
    list_filter_submit = True
    search_fields = ["=code"]
    search_help_text = (
        "A code prefix (8 characters are plenty) or the sender's event id "
        "(e.g. X-GitHub-Delivery); or, with “search in”, header values or payload text "
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
        (
            "Request",
            {"fields": [("method", "content_type", "size"), ("remote_addr", "query_string")]},
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
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
            '<td class="wh-buttons">{}</td></tr>',
            (
                (
                    format_html(
                        '<a href="{}">{}</a>',
                        reverse("admin:deliveries_delivery_change", args=[d.pk]),
                        d.target.name,
                    ),
                    status_badge(d.status),
                    d.attempts,
                    d.last_code or "–",
                    when(d.next_attempt_at),
                    when(d.updated_at),
                    delivery_buttons(d, here),
                )
                for d in deliveries
            ),
        )
        if not rows:
            return "No deliveries: the webhook had no active target when it arrived."
        return format_html(
            '<div class="wh-scroll"><table class="wh-table"><thead><tr><th>Target</th>'
            "<th>Status</th><th>Attempts</th><th>Last code</th><th>Next try</th>"
            "<th>Last change</th><th></th></tr></thead><tbody>{}</tbody></table></div>",
            rows,
        )

    def body_download(self, request, object_id):
        """The exact bytes as received."""
        if not self.has_view_permission(request):
            raise Http404
        event = self.get_object(request, object_id)  # 404 for junk ids and others' events
        response = HttpResponse(bytes(event.body), content_type="application/octet-stream")
        response["Content-Disposition"] = f'attachment; filename="event-{event.code}.bin"'
        response["X-Content-Type-Options"] = "nosniff"
        return response

    @admin.display(description="Size", ordering="body_size")
    def size(self, obj):
        return filesizeformat(obj.body_size)

    @admin.display(description="Headers")
    def headers_table(self, obj):
        rows = format_html_join(
            "",
            "<tr><th>{}</th><td><code>{}</code></td></tr>",
            ((name, header_text(value)) for name, value in obj.headers),
        )
        return format_html('<table class="wh-headers">{}</table>', rows)

    @admin.display(description="Body")
    def body_view(self, obj):
        body = bytes(obj.body)
        url = reverse("admin:deliveries_event_body", args=[obj.pk])
        download = format_html(
            '<p><a href="{}">Download the exact bytes</a> ({})</p>', url, filesizeformat(len(body))
        )
        return format_html("{}{}", download, render_body(body))

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


def render_body(body: bytes):
    """Pretty JSON, else text, else a hex view, at most BODY_PREVIEW bytes."""
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
            return format_html('<pre class="wh-body wh-json">{}</pre>', pretty[:BODY_PREVIEW])
        except (ValueError, RecursionError):  # not JSON, or nested too deep to show
            return format_html('<pre class="wh-body">{}{}</pre>', text, cut)
    lines = []
    for offset in range(0, len(shown), 16):
        chunk = shown[offset : offset + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        printable = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{offset:08x}  {hexes:<47}  {printable}")
    return format_html('<pre class="wh-body wh-hex">{}{}</pre>', "\n".join(lines), cut)


# --- deliveries ----------------------------------------------------------------


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


def when(moment) -> str:
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S") if moment else "–"


def delivery_buttons(delivery, next_url: str):
    """Retry now (while it waits for a retry) and Redeliver (once finished): submit
    buttons that post the page's form, CSRF token included, to the delivery's
    action URLs (a change page is one form already; forms cannot nest)."""
    buttons = []
    if delivery.status == Delivery.Status.RETRYING:
        buttons.append(("retry_now", "Retry now", "wh-button-primary"))
    if delivery.status in Delivery.FINISHED:
        buttons.append(("redeliver", "Redeliver", ""))
    return format_html_join(
        " ",
        '<button type="submit" class="wh-button {}" formmethod="post" '
        'formaction="{}?next={}" formnovalidate>{}</button>',
        (
            (css, reverse(f"admin:deliveries_delivery_{name}", args=[delivery.pk]), next_url, label)
            for name, label, css in buttons
        ),
    )


def header_rows(lines):
    rows = format_html_join(
        "", "<tr><th>{}</th><td><code>{}</code></td></tr>", ((n, v) for n, v in lines)
    )
    return format_html('<table class="wh-headers">{}</table>', rows) if rows else "–"


def attempt_card(result):
    """One attempt: what was sent beside what came back."""
    response_lines = [
        line.partition(": ")[::2] for line in result.response_headers.splitlines() if line
    ]
    outcome = status_badge("delivered" if result.success else "failed")
    return format_html(
        '<section class="wh-attempt"><header><strong>Attempt {}</strong> {} '
        '<span class="wh-quiet">{} · {} ms</span></header>'
        '<div class="wh-exchange"><div><h4>Request</h4><p><code class="wh-url">POST {}</code></p>'
        "{}</div><div><h4>Response {}</h4>{}{}{}</div></div></section>",
        result.attempt,
        outcome,
        when(result.created_at),
        result.duration_ms,
        result.request_url or "(not recorded)",
        header_rows(result.request_headers),
        result.status_code or "",
        format_html('<p class="wh-error">{}</p>', result.error) if result.error else "",
        header_rows(response_lines),
        format_html('<pre class="wh-excerpt">{}</pre>', result.response_body)
        if result.response_body
        else "",
    )


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyMixin, OwnedAdmin):
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
        ("status", ChoicesDropdownFilter),
        ("target__type", ChoicesDropdownFilter),
        DeliveryWebhookFilter,
        TargetFilter,
        ("created_at", RangeDateTimeFilter),
    ]
    list_filter_submit = True
    search_fields = ["=event__code"]
    search_help_text = "An event's code prefix or its sender's event id."
    paginator = CappedCountPaginator
    show_full_result_count = False
    actions = ["redeliver", "retry_now"]
    fieldsets = [
        (None, {"fields": ["buttons", ("badge", "attempts", "next_attempt_at")]}),
        (None, {"fields": [("event_link", "webhook", "target"), ("created_at", "updated_at")]}),
        ("Attempts", {"fields": ["attempts_view"]}),
    ]
    readonly_fields = flatten_fieldsets(fieldsets)

    def get_urls(self):
        return [
            path(
                f"<path:object_id>/{name.replace('_', '-')}/",
                self.admin_site.admin_view(require_POST(functools.partial(self.act_on_one, name))),
                name=f"deliveries_delivery_{name}",
            )
            for name in ("retry_now", "redeliver")
        ] + super().get_urls()

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
        back = request.GET.get("next", "")
        if not url_has_allowed_host_and_scheme(back, {request.get_host()}, request.is_secure()):
            back = reverse("admin:deliveries_delivery_change", args=[delivery.pk])
        return HttpResponseRedirect(back)

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        events = search.find(Event.objects.all(), term).values("pk")
        return queryset.filter(event__in=events), False

    @admin.display(description="")
    def buttons(self, obj):
        here = reverse("admin:deliveries_delivery_change", args=[obj.pk])
        return delivery_buttons(obj, here) or "–"

    @admin.display(description="Attempts, newest first")
    def attempts_view(self, obj):
        results = obj.results.order_by("-attempt", "-id")[:50]
        cards = format_html_join("", "{}", ((attempt_card(r),) for r in results))
        return cards or "No attempt yet."

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


# --- targets and alerts ----------------------------------------------------------


def breaker_text(breaker: health.Breaker | None) -> str:
    if breaker is None:
        return "closed"
    if breaker.until is None:
        return breaker.state
    return f"{breaker.state}, next probe {timezone.localtime(breaker.until):%H:%M:%S}"


def health_text(figures: health.Health, pk: int):
    """One line: success rate, durations, failures in a row, breaker, pause."""
    parts = []
    if figures.success_rate is None:
        parts.append("no attempts")
    else:
        parts.append(f"{figures.success_rate:.1f} % of {figures.attempts} attempts succeeded")
    if figures.p50_ms is not None:
        parts.append(f"p50 {figures.p50_ms} ms, p95 {figures.p95_ms} ms")
    if figures.consecutive_failures:
        more = "+" if figures.run_capped else ""
        parts.append(f"{figures.consecutive_failures}{more} failures in a row")
    if figures.last_error:
        parts.append(f"last error: {figures.last_error[:200]}")
    parts.append(f"breaker {breaker_text(figures.breaker)}")
    if figures.paused:
        parts.append(f"paused: {figures.paused_reason or 'no reason given'}")
    url = reverse("admin:deliveries_target_change", args=[pk])
    return format_html(
        '<span class="wh-health">{}</span> <a href="{}">details</a>', " · ".join(parts), url
    )


class TargetWebhookFilter(WebhookFilter):
    field = "webhook"


@admin.register(Target)
class TargetAdmin(SigningSecretMixin, OwnedAdmin):
    """The target as the unit of control: its state, health and the actions on it.
    Targets are added on their webhook's page."""

    form = TargetForm
    list_display = ["name", "webhook", "type", "state", "breaker", "success_rate", "last_error"]
    list_select_related = ["webhook"]
    list_filter = [TargetWebhookFilter, "paused", "active", ("type", admin.ChoicesFieldListFilter)]
    search_fields = ["name", "webhook__name"]
    actions = ["pause", "resume", "redeliver_failed", "rotate_secrets"]
    fieldsets = [
        (None, {"fields": [("name", "webhook"), ("type", "active")]}),
        ("Health, last 24 hours", {"fields": ["health_line", "breaker", "failing_since"]}),
        *TargetForm.type_fieldsets(),
        *TARGET_FIELDSETS,
        (None, {"fields": ["paused_at"]}),
    ]
    readonly_fields = [
        "webhook",
        "health_line",
        "breaker",
        "failing_since",
        "paused_at",
        "signing_secret_view",
    ]

    class Media:
        js = ["deliveries/trust.js"]

    def has_add_permission(self, request):
        return False

    def get_urls(self):
        return [
            path(
                "<path:object_id>/rotate-secret/",
                self.admin_site.admin_view(require_POST(self.rotate_secret)),
                name="deliveries_target_rotate_secret",
            ),
            *super().get_urls(),
        ]

    def rotate_secret(self, request, object_id):
        """The Rotate secret button (on the target's page and on its webhook's)."""
        target = self.get_object(request, object_id)  # 404 for others' targets
        if not self.has_change_permission(request, target):
            raise Http404("No such object.")
        target.rotate_signing_secret()
        self.message_user(request, rotated_message(1), messages.SUCCESS)
        back = request.headers.get("Referer", "")
        if not url_has_allowed_host_and_scheme(
            back, {request.get_host()}, require_https=request.is_secure()
        ):
            back = reverse("admin:deliveries_target_change", args=[target.pk])
        return HttpResponseRedirect(back)

    @admin.action(description="Rotate signing secrets of selected targets")
    def rotate_secrets(self, request, queryset):
        targets = list(queryset)
        for target in targets:
            target.rotate_signing_secret()
        self.message_user(request, rotated_message(len(targets)), messages.SUCCESS)

    def get_queryset(self, request):
        return health.annotate(super().get_queryset(request))

    def get_form(self, request, obj=None, change=False, **kwargs):
        kwargs["form"] = TargetForm.for_user(request.user)
        return super().get_form(request, obj, change, **kwargs)

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        # Hosts resolved before the admin's transaction, as on the webhook page.
        with ssrf.resolved_in_advance(posted_urls(request.POST)):
            return super().changeform_view(request, object_id, form_url, extra_context)

    def get_changelist_instance(self, request):
        changelist = super().get_changelist_instance(request)
        # One read of the engine's breakers for the page: the rows are fetched
        # here, and the template iterates the same (cached) results.
        found = health.breakers()
        for target in changelist.result_list:
            target.breaker_state = found.get(target.pk)
        return changelist

    def _breaker(self, obj) -> health.Breaker | None:
        if not hasattr(obj, "breaker_state"):  # the change page: one target
            obj.breaker_state = health.breakers().get(obj.pk)
        return obj.breaker_state

    @admin.display(description="State", ordering="paused")
    def state(self, obj):
        if obj.paused:
            css, text = "wh-warn", f"paused: {obj.paused_reason or '–'}"
        elif not obj.active:
            css, text = "", "inactive"
        else:
            css, text = "wh-ok", "active"
        return format_html('<span class="wh-dot {}">●</span> {}', css, text)

    @admin.display(description="Breaker")
    def breaker(self, obj):
        if not obj.pk:
            return "–"
        found = self._breaker(obj)
        css = "wh-ok" if found is None else "wh-bad"
        return format_html('<span class="{}">{}</span>', css, breaker_text(found))

    @admin.display(description="Success (24 h)", ordering="successes_24h")
    def success_rate(self, obj):
        rate = health.summary(obj, {}).success_rate
        if rate is None:
            return "–"
        return f"{rate:.1f} % of {obj.attempts_24h}"

    @admin.display(description="Last error (24 h)")
    def last_error(self, obj):
        return (obj.last_error_24h or "–")[:120]

    @admin.display(description="Health")
    def health_line(self, obj):
        return health_text(health.detail(obj, {obj.pk: self._breaker(obj)}), obj.pk)

    @admin.action(description="Pause selected targets")
    def pause(self, request, queryset):
        form = PauseForm(request.POST if "apply" in request.POST else None)
        if not form.is_valid():
            return self._ask(
                request,
                queryset,
                form,
                "pause",
                "Pause targets",
                "Pause",
                "Their deliveries are still created and wait, unattempted, until you resume.",
            )
        reason = form.cleaned_data["reason"] or f"paused by {request.user.get_username()}"
        paused = queryset.pause(reason)
        self.message_user(request, f"Paused {paused} targets.", messages.SUCCESS)
        return None

    @admin.action(description="Resume selected targets")
    def resume(self, request, queryset):
        resumed = queryset.filter(paused=True).resume()
        self.message_user(
            request, f"Resumed {resumed} targets: what waited is sent now.", messages.SUCCESS
        )

    @admin.action(description="Redeliver failed deliveries since…")
    def redeliver_failed(self, request, queryset):
        initial = {"since": timezone.now() - datetime.timedelta(hours=24)}
        data = request.POST if "apply" in request.POST else None
        form = RedeliverFailedForm(data, initial=initial)
        if not form.is_valid():
            return self._ask(
                request,
                queryset,
                form,
                "redeliver_failed",
                "Redeliver failed deliveries",
                "Redeliver",
                "Every failed delivery of these targets since the time below is sent again.",
            )
        since = form.cleaned_data["since"]
        queued = (
            Delivery.objects.visible_to(request.user)
            .filter(target__in=queryset, status=Delivery.Status.FAILED, updated_at__gte=since)
            .redeliver()
        )
        self.message_user(
            request,
            f"Queued {queued} failed deliveries since "
            f"{timezone.localtime(since):%Y-%m-%d %H:%M} for redelivery.",
            messages.SUCCESS,
        )
        return None

    def _ask(self, request, queryset, form, action, title, submit, intro):
        """The intermediate page of an action that needs an answer first."""
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": title,
            "intro": intro,
            "submit": submit,
            "form": form,
            "action": action,
            "targets": queryset.select_related("webhook")[:100],
            "selected": request.POST.getlist(ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across") == "1",
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/deliveries/target/action_form.html", context)


def rotated_message(n: int) -> str:
    hours = settings.SIGNING_ROTATION_OVERLAP / 3600
    return (
        f"New signing secret for {n} target{'s' if n != 1 else ''}. Deliveries are signed "
        f"with the new and the previous secret for {hours:g} hours; give receivers the new "
        "one before then."
    )


class AlertWebhookFilter(WebhookFilter):
    field = "target__webhook"


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


# --- entrypoints: verification and deduplication --------------------------------


class RejectionInline(ReadOnlyInline):
    model = Rejection
    fields = ["created_at", "remote_addr", "reason"]
    readonly_fields = fields
    verbose_name_plural = f"rejected requests (the last {Rejection.KEEP}, newest first)"

    def has_view_permission(self, request, obj=None):
        # Part of the entrypoint's record: whoever may see it sees why it refused.
        return request.user.has_perm("deliveries.view_entrypoint")


class EntrypointWebhookFilter(WebhookFilter):
    field = "webhook"


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


# --- API keys --------------------------------------------------------------------


@admin.register(ApiKey)
class ApiKeyAdmin(OwnedAdmin):
    """Keys to the REST API. A new key is shown once, in the message after saving:
    only its digest is stored. Each user sees and revokes their own keys."""

    list_display = ["name", "key_prefix", "state", "created_at", "last_used_at", "expires_at"]
    search_fields = ["name", "prefix"]
    actions = ["revoke"]

    def get_list_display(self, request):
        if request.user.is_superuser:
            return [*self.list_display[:1], "user", *self.list_display[1:]]
        return self.list_display

    def get_fields(self, request, obj=None):
        if obj is not None:
            return ["name", "expires_at", *self.get_readonly_fields(request, obj)]
        return (
            ["name", "expires_at", "user"] if request.user.is_superuser else ["name", "expires_at"]
        )

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return []
        return ["key_prefix", "user", "created_at", "last_used_at", "revoked_at"]

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change, **kwargs)
        if "user" in form.base_fields:
            form.base_fields["user"].required = False
            form.base_fields["user"].help_text = "Whose key this is (empty: yours)."
        return form

    def save_model(self, request, obj, form, change):
        if change:
            return super().save_model(request, obj, form, change)
        if not obj.user_id:
            obj.user = request.user
        key = obj.set_new_key()
        super().save_model(request, obj, form, change)
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


admin.site.site_header = "webhooker"
admin.site.site_title = "webhooker"
admin.site.index_title = "Dashboard"

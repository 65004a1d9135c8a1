"""Targets: the target as the unit of control (state, health, breaker, pause,
signing secret), on its own page and inline on its webhook's."""

import datetime
import json

from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.http import Http404, JsonResponse
from django.template.loader import render_to_string
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.views.decorators.http import require_POST
from unfold.admin import StackedInline
from unfold.widgets import UnfoldAdminTextInputWidget

from deliveries import signing, ssrf
from deliveries.admin import health
from deliveries.admin.base import (
    DateTimeLocalWidget,
    OwnedAdmin,
    ask_first,
    posted_urls,
    redirect_back,
)
from deliveries.admin.filters import TargetWebhookFilter
from deliveries.filters import clean_filters
from deliveries.forms import PauseForm, RedeliverFailedForm, TargetForm
from deliveries.models import Delivery, Event, Target
from deliveries.targets import TARGET_TYPES, egress
from deliveries.transforms import TransformError, validate_program
from deliveries.transforms.preview import preview

# Events offered in the "Run on an event" panel, newest first (any other by its code).
RECENT_EVENTS = 20


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
    return render_to_string("admin/deliveries/target/health.html", {"parts": parts, "pk": pk})


class SigningSecretMixin:
    """The target's signing secret, masked until revealed, with Copy and Rotate."""

    @admin.display(description="Signing secret")
    def signing_secret_view(self, obj):
        if not obj.pk:
            return "(made when the target is saved)"
        return render_to_string(
            "admin/deliveries/target/signing_secret.html",
            {
                "target": obj,
                "masked": signing.mask(obj.signing_secret),
                "rotated": obj.previous_signing_secret and obj.secret_rotated_at,
            },
        )


# The target form's fieldsets after its type's fields: on the webhook page and on
# the target's own page.
TARGET_FIELDSETS = [
    (
        "Signing (Standard Webhooks)",
        {"fields": ["signing", "signing_secret_view", "traceparent"], "classes": ["wh-type-http"]},
    ),
    (
        "Delivery",
        {
            "fields": [
                ("max_retries", "max_queue_size"),
                "retry_schedule",
                ("ordered", "rate_limit"),
            ]
        },
    ),
    ("Pause", {"fields": [("paused", "paused_reason")]}),
    ("Filters", {"fields": ["filters"]}),
    ("Transform (jq)", {"fields": ["transform"]}),
]


def folded(fieldsets: list, fold: bool = True) -> list:
    """The fieldsets collapsed (fold) or open."""
    found = []
    for name, options in fieldsets:
        classes = [css for css in options.get("classes", []) if css != "collapse"]
        found.append((name, {**options, "classes": classes + ["collapse"] * fold}))
    return found


def compact_type_fieldsets() -> list:
    """Each type's main field in sight (the URL), the rest of its fields folded."""
    fieldsets = []
    for type_, names in TargetForm.type_fields.items():
        kind, css = TARGET_TYPES[type_], [f"wh-type-{type_}"]
        main = [name for name in names if name == kind.main_field]
        rest = [name for name in names if name != kind.main_field]
        if main:
            fieldsets.append((None, {"fields": main, "classes": css}))
            if rest:
                fieldsets += folded([(f"{kind.label} options", {"fields": rest, "classes": css})])
        elif rest:
            fieldsets.append((kind.label, {"fields": rest, "classes": css}))
    return fieldsets


class TargetInline(SigningSecretMixin, StackedInline):
    """A target on its webhook's page, compact: name and type (wide enough to
    read) on the first row, its URL, and every other section folded."""

    model = Target
    form = TargetForm
    extra = 0
    fieldsets = [
        (None, {"fields": [("name", "type"), ("active", "health_line")]}),
        *compact_type_fieldsets(),
        *folded(TARGET_FIELDSETS),
    ]
    readonly_fields = ["health_line", "signing_secret_view"]

    def get_fieldsets(self, request, obj=None):
        fieldsets = super().get_fieldsets(request, obj)
        if request.method == "POST":
            # The page came back with errors: every section open. (Django keeps a
            # section folded when the error is in a row of two fields.)
            return folded(fieldsets, fold=False)
        return fieldsets

    def get_formset(self, request, obj=None, **kwargs):
        self._breakers = health.breakers()  # inline instances are made per request
        kwargs["form"] = TargetForm.for_user(request.user)
        return super().get_formset(request, obj, **kwargs)

    @admin.display(description="Health (24 h)")
    def health_line(self, obj):
        if not obj.pk:
            return "–"
        return health_text(health.detail(obj, self._breakers), obj.pk)


class StyledPauseForm(PauseForm):
    """The Pause question with unfold's text input."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["reason"].widget = UnfoldAdminTextInputWidget()


class StyledRedeliverFailedForm(RedeliverFailedForm):
    """The Redeliver failed question with unfold's input around the browser's picker."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["since"].widget = DateTimeLocalWidget()


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
        ("Run on an event", {"fields": ["transform_preview"]}),
        (None, {"fields": ["paused_at"]}),
    ]
    readonly_fields = [
        "transform_preview",
        "webhook",
        "health_line",
        "breaker",
        "failing_since",
        "paused_at",
        "signing_secret_view",
    ]

    class Media:
        js = ["deliveries/trust.js", "deliveries/filters.js", "deliveries/transform.js"]

    def warnings(self, obj):
        warning = egress.expiry_warning(obj.config) if obj.type == Target.Type.HTTP else ""
        return [warning] if warning else []

    def has_add_permission(self, request):
        return False

    def get_urls(self):
        return [
            path(
                "<path:object_id>/rotate-secret/",
                self.admin_site.admin_view(require_POST(self.rotate_secret)),
                name="deliveries_target_rotate_secret",
            ),
            path(
                "<path:object_id>/preview/",
                self.admin_site.admin_view(require_POST(self.preview)),
                name="deliveries_target_preview",
            ),
            *super().get_urls(),
        ]

    def preview(self, request, object_id):
        """The "Run on an event" panel: what the target would be sent for one of its
        webhook's events, with the program as typed (saved or not). JSON."""
        target = self.get_object(request, object_id)  # None for others' targets
        if target is None or not self.has_view_permission(request, target):
            raise Http404("No such object.")
        program = request.POST.get("transform", target.transform).replace("\r\n", "\n")
        filters = request.POST.get("filters")
        wanted = request.POST.get("event", "").strip()
        events = Event.objects.filter(webhook_id=target.webhook_id)
        try:
            event = events.get(code=wanted) if "-" in wanted else events.get(pk=wanted)
        except (Event.DoesNotExist, ValidationError, ValueError):
            return JsonResponse({"error": "No such event of this target's webhook."}, status=400)
        try:
            validate_program(program)
            if filters is not None:
                filters = clean_filters(_json_or_invalid(filters))
            return JsonResponse(preview(target, event, program, filters))
        except ValidationError as exc:
            return JsonResponse({"error": " ".join(exc.messages)}, status=400)
        except TransformError as exc:
            return JsonResponse({"error": f"The transform failed: {exc}"}, status=400)

    @admin.display(description="Event")
    def transform_preview(self, obj):
        if not obj.pk:
            return "–"
        recent = (
            Event.objects.filter(webhook_id=obj.webhook_id)
            .only("id", "code", "event_type", "received_at")
            .order_by("-received_at", "-id")[:RECENT_EVENTS]
        )
        return render_to_string(
            "admin/deliveries/target/transform_preview.html", {"target": obj, "events": recent}
        )

    def rotate_secret(self, request, object_id):
        """The Rotate secret button (on the target's page and on its webhook's)."""
        target = self.get_object(request, object_id)  # 404 for others' targets
        if not self.has_change_permission(request, target):
            raise Http404("No such object.")
        target.rotate_signing_secret()
        self.message_user(request, rotated_message(1), messages.SUCCESS)
        fallback = reverse("admin:deliveries_target_change", args=[target.pk])
        return redirect_back(request, request.headers.get("Referer", ""), fallback)

    @admin.action(description="Rotate signing secrets of selected targets")
    def rotate_secrets(self, request, queryset):
        targets = list(queryset)
        for target in targets:
            target.rotate_signing_secret(wait=False)
        Target.until_engines_see_changes()  # once for all of them
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
        form = StyledPauseForm(request.POST if "apply" in request.POST else None)
        if not form.is_valid():
            return self._ask(
                request,
                queryset,
                form,
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
        form = StyledRedeliverFailedForm(data, initial=initial)
        if not form.is_valid():
            return self._ask(
                request,
                queryset,
                form,
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

    def _ask(self, request, queryset, form, title, submit, intro):
        """The question of an action (the base's intermediate page): the targets,
        the form, and `apply` marking the post that answers it."""
        return ask_first(
            self,
            request,
            title=title,
            intro=intro,
            objects=queryset.select_related("webhook")[:100],
            describe=lambda target: f"{target.webhook.name} → {target.name}",
            form=form,
            hidden={"apply": "1"},
            submit=submit,
        )


def _json_or_invalid(text: str):
    try:
        return json.loads(text or "[]")
    except ValueError:
        raise ValidationError("The filters are not valid JSON.") from None


def rotated_message(n: int) -> str:
    hours = settings.SIGNING_ROTATION_OVERLAP / 3600
    return (
        f"New signing secret for {n} target{'s' if n != 1 else ''}. Deliveries are signed "
        f"with the new and the previous secret for {hours:g} hours; give receivers the new "
        "one before then."
    )

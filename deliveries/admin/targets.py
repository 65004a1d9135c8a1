"""Targets: the target as the unit of control (state, health, breaker, pause,
signing secret), on its own page and inline on its webhook's."""

import datetime

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST
from unfold.admin import StackedInline

from deliveries import signing, ssrf
from deliveries.admin import health
from deliveries.admin.base import OwnedAdmin, posted_urls
from deliveries.admin.filters import TargetWebhookFilter
from deliveries.forms import PauseForm, RedeliverFailedForm, TargetForm
from deliveries.models import Delivery, Target


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

"""Webhooks: the list with counts and health, the page with its inbound URLs and a
curl to try them on top, entrypoints and targets inline."""

from django import forms
from django.contrib import admin
from django.contrib.admin.options import IS_POPUP_VAR
from django.db.models import Count, F, Func, IntegerField, OuterRef, Subquery
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from unfold.admin import TabularInline

from deliveries import ssrf
from deliveries.admin import health
from deliveries.admin.base import OwnedAdmin, OwnerMixin, copyable_text, posted_urls
from deliveries.admin.filters import HealthFilter
from deliveries.admin.targets import TargetInline
from deliveries.fields import EncryptedURLField
from deliveries.models import Delivery, Entrypoint, Event, Webhook
from deliveries.targets.base import TargetURLField


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
        return copyable_text(obj.inbound_url(self._request))

    @admin.display(description="Verification and dedup")
    def trust(self, obj):
        if not obj.pk:
            return "(set once saved)"
        return format_html(
            '{} <a href="{}">change</a>',
            trust_summary(obj),
            reverse("admin:deliveries_entrypoint_change", args=[obj.pk]),
        )


# What a new user pastes into a terminal to see an event arrive.
TRY_IT = "curl -X POST {url} -H 'Content-Type: application/json' -d '{{\"hello\": \"world\"}}'"


def inbound_panel(webhook, request) -> list[dict]:
    """The active entrypoints' URLs, each with a curl that posts to it."""
    urls = [e.inbound_url(request) for e in webhook.entrypoints.filter(active=True)]
    return [{"url": url, "curl": TRY_IT.format(url=url)} for url in urls]


def trust_summary(entrypoint) -> str:
    parts = [entrypoint.get_verification_display() if entrypoint.verification != "none" else ""]
    if entrypoint.dedup:
        parts.append(f"dedup by {entrypoint.id_source}")
    return " · ".join(p for p in parts if p) or "none"


GRADE_CSS = {health.HEALTHY: "wh-ok", health.DEGRADED: "wh-warn", health.FAILING: "wh-bad"}


def _subcount(queryset):
    """COUNT(*) of `queryset` as a correlated subquery: one per row of the page and
    no join between events and deliveries multiplying each other's rows."""
    counted = queryset.order_by().annotate(n=Func(F("pk"), function="COUNT")).values("n")
    return Subquery(counted[:1], output_field=IntegerField())


class WebhookForm(forms.ModelForm):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        field = self.fields.get("alert_url")
        if field is not None and self.instance.alert_url:
            self.initial["alert_url"] = field.shown(self.instance.alert_url)

    def clean_alert_url(self):
        # Shown with its path masked (TargetURLField): sent back so, the stored one stays.
        value = self.cleaned_data.get("alert_url")
        return self.fields["alert_url"].keep_masked(value, self.instance.alert_url)


@admin.register(Webhook)
class WebhookAdmin(OwnerMixin, OwnedAdmin):
    form = WebhookForm
    list_display = ["name", "health", "events_24h", "failing", "targets_count", "created_at"]
    list_filter = [HealthFilter]
    search_fields = ["name", "description"]
    inlines = [EntrypointInline, TargetInline]
    # The alert URL is checked as target URLs are: its scheme typed out. Its path
    # is its secret (a Slack incoming webhook's).
    formfield_overrides = {EncryptedURLField: {"form_class": TargetURLField, "secret_path": True}}
    owner_help_text = "Who sees and manages this webhook (empty: you)."

    class Media:
        js = ["deliveries/trust.js", "deliveries/filters.js"]

    def get_fields(self, request, obj=None):
        return ["name", "description", "retention_days", "alert_url", *self.owner_fields(request)]

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        # The admin validates and saves inside one transaction, which on SQLite holds
        # the database's write lock: resolve the targets' hosts (SSRF check) before
        # it starts, so a slow DNS answer never makes the inbound endpoint wait.
        urls = posted_urls(request.POST)
        with ssrf.resolved_in_advance(urls):
            return super().changeform_view(request, object_id, form_url, extra_context)

    def get_queryset(self, request):
        since = timezone.now() - health.WINDOW

        def finished(status):
            return _subcount(
                Delivery.objects.filter(
                    target__webhook=OuterRef("pk"), status=status, updated_at__gte=since
                )
            )

        return (
            super()
            .get_queryset(request)
            .select_related("owner")
            .annotate(
                events_24h=_subcount(
                    Event.objects.filter(webhook=OuterRef("pk"), received_at__gte=since)
                ),
                failed_24h=finished(Delivery.Status.FAILED),
                delivered_24h=finished(Delivery.Status.DELIVERED),
                retrying_now=_subcount(
                    Delivery.objects.filter(target__webhook=OuterRef("pk"), status="retrying")
                ),
                targets_count=Count("targets", distinct=True),
            )
            .annotate(
                health_grade=health.grade(F("failed_24h"), F("delivered_24h"), F("retrying_now"))
            )
        )

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None and obj.pk:
            context["inbound"] = inbound_panel(obj, request)
        return super().render_change_form(request, context, add, change, form_url, obj)

    def response_add(self, request, obj, post_url_continue=None):
        """A new webhook's page, whichever save button: its inbound URL is on top."""
        response = super().response_add(request, obj, post_url_continue)
        if "_addanother" in request.POST or IS_POPUP_VAR in request.POST:
            return response
        return HttpResponseRedirect(reverse("admin:deliveries_webhook_change", args=[obj.pk]))

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        form.instance.ensure_entrypoint()

    @admin.display(description="Health", ordering="health_grade")
    def health(self, obj):
        """The grade (health.grade()) and what it was read from."""
        finished = obj.failed_24h + obj.delivered_24h
        if finished:
            share = 100 * obj.failed_24h / finished
            said = [f"{share:.1f} % of {finished} deliveries failed (24 h)"]
        else:
            said = ["no delivery finished (24 h)"]
        if obj.retrying_now:
            said.append(f"{obj.retrying_now} waiting for a retry")
        return format_html(
            '<span class="wh-dot {}">●</span> {} <span class="wh-quiet">{}</span>',
            GRADE_CSS[obj.health_grade],
            obj.health_grade,
            "; ".join(said),
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

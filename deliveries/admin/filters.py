"""The admin's list filters. Each offers only what visible_to() lets the user see
(a RelatedFieldListFilter would list everyone's rows), and counts its choices for
"Show counts" as the list counts its rows: at most CappedCountPaginator.CAP each."""

from django.contrib import admin
from django.core.exceptions import ValidationError
from django.core.validators import EMPTY_VALUES
from django.db.models import Exists, OuterRef
from django.utils import timezone
from unfold.contrib.filters.admin import ChoicesDropdownFilter, DropdownFilter, RangeDateTimeFilter
from unfold.utils import parse_datetime_str

from deliveries.admin.base import AtLeast, CappedCountPaginator, capped_count, parse_id
from deliveries.admin.health import GRADES
from deliveries.models import Delivery, Entrypoint, Target, Webhook
from deliveries.targets.base import FAULTS, failures_of


class CappedFacets:
    """Show counts (the admin's facets) with each choice counted as its own list
    would count it (base.capped_count: a LIMIT subquery, "10000+" past the cap).
    Django counts every choice of a filter in one aggregate over every row the
    list's other filters let through: seconds on a few hundred thousand rows."""

    def get_facet_queryset(self, changelist):
        rows = self.facet_base(changelist)
        return {key: capped_count(chosen) for key, chosen in self.facet_rows(changelist, rows)}

    def facet_base(self, changelist):
        """The list's rows as its other filters (and search) leave them."""
        return changelist.get_queryset(
            self.request, exclude_parameters=self.expected_parameters()
        ).order_by()

    def facet_rows(self, changelist, rows) -> list:
        """(facet key, the rows of that choice) for each choice, keyed as the
        filter's choices() reads them."""
        if not isinstance(self, admin.SimpleListFilter):
            counts = self.get_facet_counts(changelist.pk_attname, rows)
            return [(key, rows.filter(count.filter)) for key, count in counts.items()]
        found = []
        original = self.used_parameters.get(self.parameter_name)
        try:
            for i, (value, _title) in enumerate(self.lookup_choices):
                self.used_parameters[self.parameter_name] = value
                chosen = self.queryset(self.request, rows)
                found.append((f"{i}__c", rows if chosen is None else chosen))
        finally:
            self.used_parameters[self.parameter_name] = original
        return found


class CappedChoicesDropdownFilter(CappedFacets, ChoicesDropdownFilter):
    """A model field's choices, in a dropdown."""


class HealthFilter(CappedFacets, admin.SimpleListFilter):
    """Webhooks by their grade (deliveries/admin/health.py)."""

    title = "health"
    parameter_name = "health"

    def lookups(self, request, model_admin):
        return [(grade, grade.capitalize()) for grade in GRADES]

    def queryset(self, request, queryset):
        if self.value() in GRADES:
            return queryset.filter(health_grade=self.value())  # health.grade()
        return queryset


class WebhookFilter(CappedFacets, DropdownFilter):
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


class EntrypointFilter(CappedFacets, DropdownFilter):
    title = "entrypoint"
    parameter_name = "entrypoint"

    def lookups(self, request, model_admin):
        entrypoints = Entrypoint.objects.visible_to(request.user).select_related("webhook")
        webhook = parse_id(request.GET.get("webhook"))
        if webhook:  # the chosen webhook's alone (and nothing else to count)
            entrypoints = entrypoints.filter(webhook_id=webhook)
        return [(e.pk, f"{e.webhook.name}: {e}") for e in entrypoints.order_by("webhook__name")]

    def queryset(self, request, queryset):
        if self.value():
            pk = parse_id(self.value())
            return queryset.filter(entrypoint=pk) if pk else queryset.none()
        return queryset


class FaultFilter(CappedFacets, DropdownFilter):
    """Failed deliveries by whose fault their failure was: the receiver's or ours
    (targets.base.FAILURES)."""

    title = "whose fault"
    parameter_name = "fault"

    def lookups(self, request, model_admin):
        return [(fault, words.capitalize()) for fault, words in FAULTS.items()]

    def queryset(self, request, queryset):
        if self.value() in FAULTS:
            return queryset.filter(
                status=Delivery.Status.FAILED, failure__in=failures_of(self.value())
            )
        return queryset


class DeliveryStatusFilter(CappedFacets, DropdownFilter):
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

    def get_facet_queryset(self, changelist):
        """Counted from the deliveries' side: the EXISTS above would read every event
        to count a status few of them have. Each status reads at most CAP + 1 of its
        deliveries (delivery_status_idx) and the events among them; when it has more
        deliveries than that, the events found are a floor ("N+")."""
        events = self.facet_base(changelist)
        deliveries = Delivery.objects.visible_to(self.request.user).order_by()
        counts = {}
        for i, (status, _title) in enumerate(self.lookup_choices):
            some = deliveries.filter(status=status)
            count = capped_count(
                events.filter(pk__in=some.values("event")[: CappedCountPaginator.CAP + 1])
            )
            if not isinstance(count, AtLeast) and isinstance(capped_count(some), AtLeast):
                count = AtLeast(count + 1)  # read as "count+"
            counts[f"{i}__c"] = count
        return counts


class DeliveryWebhookFilter(WebhookFilter):
    field = "target__webhook"


class TargetFilter(CappedFacets, DropdownFilter):
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


class AwareRangeDateTimeFilter(RangeDateTimeFilter):
    """unfold's date-and-time range, its bounds read in the current time zone as
    aware datetimes. unfold's own passes them naive, which Django reads the same
    way but warns about on every filtered request. A bound that is not a date and
    time leaves the range out, as unfold's does."""

    def queryset(self, request, queryset):
        bounds = {}
        for end, lookup in (("from", "gte"), ("to", "lte")):
            date = self.used_parameters.get(f"{self.parameter_name}_{end}_0")
            time = self.used_parameters.get(f"{self.parameter_name}_{end}_1")
            if date in EMPTY_VALUES or time in EMPTY_VALUES:
                continue
            value = parse_datetime_str(f"{date} {time}")
            if value is None:
                return None
            bounds[f"{self.parameter_name}__{lookup}"] = timezone.make_aware(value)
        try:
            return queryset.filter(**bounds)
        except (ValueError, ValidationError):
            return None

"""Query parameters that narrow a list, and the selections of bulk actions.

Each filter is a serializer: the same class validates the parameters (a bad value
answers 400 with its field's message, never a 500), documents them in the schema,
and turns them into one filter() on a queryset that visible_to() already scoped.
"""

from django.core.management.base import CommandError
from rest_framework import serializers

from deliveries.api.strict import RefusesUnknown
from deliveries.models import Delivery
from deliveries.targets.base import FAULTS, failures_of

# The largest id a database integer column holds: a bigger number is a 400 here,
# rather than an overflow in the database driver.
MAX_ID = 2**63 - 1


def id_field(help_text: str) -> serializers.IntegerField:
    return serializers.IntegerField(
        min_value=1, max_value=MAX_ID, required=False, help_text=help_text
    )


class QueryFilter(RefusesUnknown, serializers.Serializer):
    # Each parameter's ORM lookup.
    lookups: dict[str, str] = {}

    def apply(self, queryset):
        """`queryset` narrowed by the valid parameters; ValidationError otherwise."""
        self.is_valid(raise_exception=True)
        return queryset.filter(
            **{
                self.lookups[name]: value
                for name, value in self.validated_data.items()
                if name in self.lookups
            }
        )

    def criteria(self) -> dict:
        """The validated parameters that narrow something."""
        return {k: v for k, v in self.validated_data.items() if k in self.lookups}


class WebhookChildFilter(QueryFilter):
    lookups = {"webhook": "webhook_id"}
    webhook = id_field("Only those of this webhook.")


class EventFilter(QueryFilter):
    lookups = {
        "webhook": "webhook_id",
        "entrypoint": "entrypoint_id",
        "code": "code",
        "provider_id": "provider_id",
        "since": "received_at__gte",
        "until": "received_at__lt",
    }
    webhook = id_field("Only events of this webhook.")
    entrypoint = id_field("Only events received on this entrypoint.")
    code = serializers.UUIDField(
        required=False, help_text="The event with this code (what the inbound URL answered)."
    )
    provider_id = serializers.CharField(
        required=False,
        max_length=255,
        help_text="The event with this id of the sender's own (X-GitHub-Delivery, Stripe's id...).",
    )
    since = serializers.DateTimeField(
        required=False, help_text="Received at or after this time (ISO 8601; UTC if no zone)."
    )
    until = serializers.DateTimeField(required=False, help_text="Received before this time.")


class DeliveryFilter(QueryFilter):
    lookups = {
        "status": "status",
        "target": "target_id",
        "webhook": "target__webhook_id",
        "event": "event_id",
        "event_code": "event__code",
        "since": "updated_at__gte",
        "until": "updated_at__lt",
        "failure": "failure",
        "fault": "failure__in",
    }
    status = serializers.ChoiceField(
        choices=Delivery.Status.choices, required=False, help_text="Only deliveries in this status."
    )
    failure = serializers.ChoiceField(
        choices=Delivery._meta.get_field("failure").choices,
        required=False,
        help_text="Only failed deliveries whose final failure was of this class.",
    )
    fault = serializers.ChoiceField(
        choices=list(FAULTS.items()),
        required=False,
        help_text="Only failed deliveries that failed by the receiver's fault or by ours.",
    )

    def validate_fault(self, value):
        return failures_of(value)

    target = id_field("Only deliveries to this target.")
    webhook = id_field("Only deliveries of this webhook's events.")
    event = id_field("Only deliveries of this event.")
    event_code = serializers.UUIDField(
        required=False, help_text="Only deliveries of the event with this code."
    )
    # Last changed, as the admin's "Redeliver failed since": for a failed delivery,
    # when it failed, so an outage's failures are caught whenever their events came.
    since = serializers.DateTimeField(
        required=False,
        help_text="Last changed (created, attempted, set back) at or after this time; "
        "for a failed delivery, when it failed (ISO 8601; UTC if no zone).",
    )
    until = serializers.DateTimeField(required=False, help_text="Last changed before this time.")


class Selection(QueryFilter):
    """A bulk action's rows: `ids`, or the filter's parameters, or both."""

    ids = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=MAX_ID),
        required=False,
        min_length=1,
        max_length=1000,
        help_text="These ids (any you cannot see answers 404).",
    )

    def validate(self, attrs):
        if "ids" not in attrs and not any(name in attrs for name in self.lookups):
            raise serializers.ValidationError(
                "Say which: 'ids', or at least one of " + ", ".join(self.lookups) + "."
            )
        return attrs


class DeliverySelection(Selection, DeliveryFilter):
    pass


class EventSelection(Selection, EventFilter):
    pass


# --- the same selections on the command line (manage.py redeliver, replay) ---------


def add_arguments(parser, selection: type[Selection]) -> None:
    """The selection's parameters as options: --target 3 --since 2026-01-01T00:00."""
    for name, field in selection().fields.items():
        flag = "--" + name.replace("_", "-")
        if name == "ids":
            parser.add_argument(flag, nargs="+", metavar="ID", help=field.help_text)
        else:
            parser.add_argument(flag, dest=name, help=field.help_text)


def selected_by_options(queryset, selection: type[Selection], options: dict):
    """`queryset` narrowed by the options add_arguments() made; CommandError if invalid."""
    data = {name: options[name] for name in selection().fields if options.get(name) is not None}
    form = selection(data=data)
    if not form.is_valid():
        raise CommandError(_as_text(form.errors))
    queryset = form.apply(queryset)
    if "ids" in form.validated_data:
        queryset = queryset.filter(pk__in=form.validated_data["ids"])
    return queryset, form.validated_data


def _as_text(errors) -> str:
    parts = []
    for name, messages in errors.items():
        if isinstance(messages, dict):  # per item of --ids
            messages = [m for item in messages.values() for m in item]
        text = " ".join(map(str, messages))
        parts.append(text if name == "non_field_errors" else f"--{name.replace('_', '-')}: {text}")
    return " ".join(parts)


# The audit log's object types, by the names the API uses for them.
AUDITED = {
    "webhook": "webhook",
    "entrypoint": "entrypoint",
    "target": "target",
    "api_key": "apikey",
    "user": "user",
}


class AuditFilter(QueryFilter):
    lookups = {
        "object_type": "content_type__model",
        "object_id": "object_id",
        "action": "action",
        "since": "timestamp__gte",
        "until": "timestamp__lt",
    }
    object_type = serializers.ChoiceField(
        choices=list(AUDITED), required=False, help_text="Only entries about this kind of object."
    )
    object_id = id_field("Only entries about the object with this id (with object_type).")
    action = serializers.ChoiceField(
        choices=["create", "update", "delete"],
        required=False,
        help_text="Only this kind of change.",
    )
    since = serializers.DateTimeField(
        required=False, help_text="Made at or after this time (ISO 8601; UTC if no zone)."
    )
    until = serializers.DateTimeField(required=False, help_text="Made before this time.")

    def validate_object_type(self, value):
        return AUDITED[value]

    def validate_action(self, value):
        return ["create", "update", "delete"].index(value)

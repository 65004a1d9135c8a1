"""What the API reads and writes. Writes are validated by the models' own
full_clean(), the validation behind the admin's forms (config per target type,
SSRF checks, filters): the rules exist once, in the models and target types."""

import copy

from auditlog.models import LogEntry
from django.core.exceptions import NON_FIELD_ERRORS
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import models
from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.settings import api_settings

from deliveries import verification
from deliveries.api.filters import AUDITED, EventSelection
from deliveries.api.strict import RefusesUnknown
from deliveries.filters import clean_filters
from deliveries.forms import clean_header_lines
from deliveries.models import (
    Delivery,
    DeliveryResult,
    Entrypoint,
    Event,
    Target,
    Webhook,
)
from deliveries.targets import TARGET_TYPES
from deliveries.targets.base import MASK as SHOWN_SECRET
from deliveries.targets.base import keep_masked, keep_secrets, mask_url, masked_keys
from deliveries.transforms import validate_program


@extend_schema_field({"type": "object", "additionalProperties": True})
class ObjectField(serializers.JSONField):
    """A JSON object (a config): documented as one, so a client knows null is not."""


@extend_schema_field({"type": "array", "items": {}})
class ArrayField(serializers.JSONField):
    """A JSON array (filters, a retry schedule), checked by the model's cleaner."""


@extend_schema_field(
    {
        "type": "array",
        "items": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 604800},
        "maxItems": 50,
    }
)
class ScheduleField(serializers.JSONField):
    """A retry schedule: delays in seconds (engine/backoff.py checks it)."""


class OwnedRelatedField(serializers.PrimaryKeyRelatedField):
    """The id of one of the requesting user's rows: anyone else's "does not exist"."""

    def get_queryset(self):
        return self.queryset.model.objects.visible_to(self.context["request"].user)


class ModelCleaned(RefusesUnknown, serializers.ModelSerializer):
    """Runs the model's full_clean() on the row as it would be saved."""

    # Fields validated elsewhere: relations by their field, the owner set by the view.
    clean_exclude: tuple = ()
    # Fields that cannot change after create.
    create_only: tuple = ()

    def get_fields(self):
        fields = super().get_fields()
        if isinstance(self.instance, models.Model):  # an update
            for name in self.create_only:
                fields[name].read_only = True
        return fields

    def validate(self, attrs):
        row = copy.copy(self.instance) if self.instance is not None else self.Meta.model()
        for name, value in attrs.items():
            setattr(row, name, value)
        try:
            row.full_clean(
                exclude=self.clean_exclude, validate_unique=False, validate_constraints=False
            )
        except DjangoValidationError as exc:
            errors = serializers.as_serializer_error(exc)
            if NON_FIELD_ERRORS in errors:
                errors[api_settings.NON_FIELD_ERRORS_KEY] = errors.pop(NON_FIELD_ERRORS)
            raise serializers.ValidationError(errors) from None
        # Keep what cleaning normalised (a target's config and filters).
        return {name: getattr(row, name) for name in attrs}


class EntrypointBriefSerializer(serializers.ModelSerializer):
    url = serializers.SerializerMethodField(help_text="The inbound URL: senders POST here.")

    class Meta:
        model = Entrypoint
        fields = ["id", "code", "url", "active"]

    def get_url(self, obj) -> str:
        return obj.inbound_url(self.context["request"])


class WebhookSerializer(ModelCleaned):
    owner = serializers.CharField(source="owner.username", read_only=True)
    entrypoints = EntrypointBriefSerializer(many=True, read_only=True)
    clean_exclude = ("owner",)

    # A string, not a "uri": it reads back masked (••••••••), which no URI holds;
    # the model checks what is written.
    alert_url = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=500,
        help_text="A Slack-compatible incoming-webhook URL; read back with its path "
        "masked, and sending that back keeps the stored one.",
    )

    class Meta:
        model = Webhook
        fields = [
            "id",
            "code",
            "name",
            "description",
            "retention_days",
            "alert_url",
            "owner",
            "entrypoints",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["created_at"]

    def to_representation(self, obj):
        data = super().to_representation(obj)
        data["alert_url"] = mask_url(obj.alert_url, path=True)
        return data

    def validate(self, attrs):
        if "alert_url" in attrs:
            stored = self.instance.alert_url if self.instance is not None else ""
            kept = keep_masked(attrs["alert_url"], mask_url(stored, path=True), stored)
            if isinstance(kept, str) and SHOWN_SECRET in kept:
                raise serializers.ValidationError(
                    {
                        "alert_url": [
                            f"Type the URL itself: {SHOWN_SECRET} stands for a stored value."
                        ]
                    }
                )
            attrs["alert_url"] = kept
        return super().validate(attrs)


# What an entrypoint's verification secrets read back as.
MASK = "********"


def _secret_keys(preset: str) -> set:
    try:
        return set(verification.get_preset(preset).secret_keys)
    except DjangoValidationError:
        return set()


class EntrypointSerializer(EntrypointBriefSerializer, ModelCleaned):
    webhook = OwnedRelatedField(
        queryset=Webhook.objects.all(), help_text="Set at creation; cannot change."
    )
    verification_config = ObjectField(
        required=False,
        help_text='The preset\'s settings, e.g. {"secret": "..."}. Secrets read back as '
        f"{MASK!r}; sending that (or leaving a secret out) keeps the stored one.",
    )
    clean_exclude = ("webhook",)
    create_only = ("webhook",)

    class Meta:
        model = Entrypoint
        fields = [
            "id",
            "webhook",
            "code",
            "url",
            "description",
            "active",
            "verification",
            "verification_config",
            "dedup",
            "dedup_source",
            "created_at",
        ]
        read_only_fields = ["created_at"]

    def to_representation(self, obj):
        data = super().to_representation(obj)
        secrets = _secret_keys(obj.verification)
        data["verification_config"] = {
            key: MASK if key in secrets and value else value
            for key, value in (obj.verification_config or {}).items()
        }
        return data

    def validate(self, attrs):
        # Secrets are entered once: an update that does not repeat them keeps them,
        # as long as the preset stays the same.
        old = self.instance
        config = attrs.get("verification_config")
        same_preset = old is not None and attrs.get("verification", old.verification) == (
            old.verification
        )
        if same_preset and isinstance(config, dict):
            kept = old.verification_config or {}
            config = dict(config)
            for key in _secret_keys(old.verification) & kept.keys():
                if config.get(key) in (None, MASK):
                    config[key] = kept[key]
            attrs["verification_config"] = config
        return super().validate(attrs)


def _shown_config(type_: str, config):
    kind = TARGET_TYPES.get(type_)
    return kind.shown_config(config) if kind is not None and isinstance(config, dict) else {}


class TargetSerializer(ModelCleaned):
    webhook = OwnedRelatedField(
        queryset=Webhook.objects.all(), help_text="Set at creation; cannot change."
    )
    config = ObjectField(
        required=False,
        help_text="Per type: http {url, headers?, timeout?}; slack {webhook_url}; "
        "database and log none. Read back with its secrets masked (header values, a "
        "password in the URL, a Slack URL's path); sending a masked value back keeps the "
        "stored one.",
    )
    filters = ArrayField(required=False, help_text=Target._meta.get_field("filters").help_text)
    retry_schedule = ScheduleField(
        required=False, help_text=Target._meta.get_field("retry_schedule").help_text
    )
    clean_exclude = ("webhook",)
    create_only = ("webhook",)

    class Meta:
        model = Target
        fields = [
            "id",
            "webhook",
            "name",
            "type",
            "active",
            "config",
            "max_retries",
            "retry_schedule",
            "max_queue_size",
            *Target.DELIVERY_SETTINGS,
            "signing_secret",
            "secret_rotated_at",
            "paused",
            "paused_reason",
            "paused_at",
            "failing_since",
            "created_at",
            "updated_at",
        ]
        # Pausing goes through the pause and resume actions, which the engine hears.
        read_only_fields = ["paused", "paused_reason", "paused_at", "created_at"]
        extra_kwargs = {
            "signing_secret": {
                "help_text": "The Standard Webhooks secret (whsec_...) deliveries are signed "
                "with; the rotate-secret action makes a new one."
            }
        }

    def to_representation(self, obj):
        data = super().to_representation(obj)
        data["config"] = _shown_config(obj.type, obj.config)
        return data

    def validate(self, attrs):
        old = self.instance
        if old is not None and "config" in attrs and attrs.get("type", old.type) == old.type:
            shown = _shown_config(old.type, old.config)
            try:
                attrs["config"] = keep_secrets(attrs["config"], shown, old.config)
            except DjangoValidationError as exc:
                raise serializers.ValidationError({"config": exc.messages}) from None
        elif masked_keys(attrs.get("config")):
            raise serializers.ValidationError(
                {"config": [f"Type the secrets themselves, not {SHOWN_SECRET}."]}
            )
        return super().validate(attrs)


class EventSerializer(serializers.ModelSerializer):
    class Meta:
        model = Event
        fields = [
            "id",
            "code",
            "webhook",
            "entrypoint",
            "method",
            "content_type",
            "body_size",
            "remote_addr",
            "received_at",
            "provider_id",
            "duplicates",
        ]


class EventDetailSerializer(EventSerializer):
    headers = serializers.ListField(
        child=serializers.ListField(child=serializers.CharField(), min_length=2, max_length=2),
        help_text="[name, value] pairs in the order received.",
    )
    body_url = serializers.SerializerMethodField(help_text="The exact body, downloadable.")

    class Meta(EventSerializer.Meta):
        fields = [
            *EventSerializer.Meta.fields,
            "query_string",
            "headers",
            "request_id",
            "traceparent",
            "resent_from",
            "body_url",
        ]

    def get_body_url(self, obj) -> str:
        request = self.context["request"]
        return request.build_absolute_uri(reverse("api:event-body", args=[obj.pk]))


class DeliverySerializer(serializers.ModelSerializer):
    webhook = serializers.IntegerField(source="webhook_id", read_only=True)
    event_code = serializers.UUIDField(read_only=True)

    class Meta:
        model = Delivery
        fields = [
            "id",
            "status",
            "event",
            "event_code",
            "target",
            "webhook",
            "attempts",
            "next_attempt_at",
            "failure",
            "reason",
            "created_at",
            "updated_at",
        ]


class AttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = DeliveryResult
        fields = [
            "attempt",
            "success",
            "status_code",
            "duration_ms",
            "error",
            "failure",
            "response_body",
            "created_at",
        ]


class DeliveryDetailSerializer(DeliverySerializer):
    results = AttemptSerializer(many=True, read_only=True, help_text="Every attempt, in order.")

    class Meta(DeliverySerializer.Meta):
        fields = [*DeliverySerializer.Meta.fields, "results"]


# --- actions ----------------------------------------------------------------------


class ReplayRequest(EventSelection):
    target = OwnedRelatedField(
        queryset=Target.objects.all(),
        required=False,
        help_text="Only to this target (say, one added since), and only its webhook's events.",
    )

    def validate(self, attrs):
        attrs = super().validate(attrs)
        target, webhook = attrs.get("target"), attrs.get("webhook")
        if target is not None and webhook is not None and target.webhook_id != webhook:
            raise serializers.ValidationError({"target": [f"Not a target of webhook {webhook}."]})
        return attrs


def cleaned_by(clean, value):
    """`value` as the model-side `clean` returns it; its messages as the field's."""
    try:
        return clean(value)
    except DjangoValidationError as exc:
        raise serializers.ValidationError(exc.messages) from None


class PreviewRequestSerializer(RefusesUnknown, serializers.Serializer):
    event = serializers.IntegerField(help_text="A stored event of the target's webhook.")
    transform = serializers.CharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        validators=[validate_program],
        help_text="A jq program to try in place of the saved one (empty: none).",
    )
    filters = serializers.JSONField(
        required=False,
        help_text="Filter rules to try in place of the saved ones.",
    )

    def validate_filters(self, value):
        return cleaned_by(clean_filters, value)


class PreviewSerializer(serializers.Serializer):
    dropped = serializers.BooleanField(help_text="The target would not be sent this event.")
    reason = serializers.CharField(required=False, help_text="Why it was dropped.")
    body = serializers.CharField(required=False, help_text="The body sent, as text.")
    headers = serializers.ListField(
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text="The header lines sent, [name, value], credentials masked.",
    )
    query = serializers.CharField(required=False, help_text="The query string sent.")
    input = serializers.JSONField(help_text="What a transform reads for this event.")
    output = serializers.JSONField(help_text="What the transform yielded (null: none, or dropped).")


class ResendSerializer(RefusesUnknown, serializers.Serializer):
    body = serializers.CharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        help_text="The new event's body, sent as UTF-8 (absent: the original's bytes).",
    )
    headers = serializers.JSONField(
        required=False,
        help_text="The new event's header lines, [[name, value], ...] (absent: the original's).",
    )

    def validate_headers(self, value):
        return cleaned_by(clean_header_lines, value)


class PauseSerializer(RefusesUnknown, serializers.Serializer):
    reason = serializers.CharField(max_length=500, required=False, default="paused through the API")


class QueuedSerializer(serializers.Serializer):
    queued = serializers.IntegerField(help_text="Deliveries queued by this request.")


class RedeliveredSerializer(QueuedSerializer):
    matched = serializers.IntegerField(
        help_text="Deliveries selected; those pending or retrying were already on their way."
    )


class ReplayedSerializer(QueuedSerializer):
    redelivered = serializers.IntegerField(help_text="Finished deliveries set back to pending.")
    created = serializers.IntegerField(help_text="New deliveries, for targets added since.")


class AuditEntrySerializer(serializers.ModelSerializer):
    """One create, change or delete (deliveries/audit.py); secrets masked."""

    action = serializers.SerializerMethodField(help_text="create, update or delete.")
    object_type = serializers.SerializerMethodField(
        help_text="webhook, entrypoint, target, api_key or user."
    )
    changes = serializers.SerializerMethodField(
        help_text="{field: [before, after]}, as text; secrets masked."
    )
    actor = serializers.SerializerMethodField(
        help_text="Who made it (null: a command or the engine)."
    )
    api_key = serializers.SerializerMethodField(help_text="The API key used, if one was.")
    request_id = serializers.CharField(
        source="cid", allow_null=True, help_text="The request's X-Request-Id (null: no request)."
    )

    class Meta:
        model = LogEntry
        fields = [
            "id",
            "timestamp",
            "action",
            "object_type",
            "object_id",
            "object_repr",
            "changes",
            "actor",
            "api_key",
            "remote_addr",
            "request_id",
        ]

    def get_action(self, entry) -> str:
        return ["create", "update", "delete", "access"][entry.action]

    def get_object_type(self, entry) -> str:
        names = {model: name for name, model in AUDITED.items()}
        return names.get(entry.content_type.model, entry.content_type.model)

    def get_changes(self, entry) -> dict:
        return entry.changes_dict

    def get_actor(self, entry) -> str | None:
        return entry.actor.get_username() if entry.actor is not None else None

    def get_api_key(self, entry) -> str | None:
        return (entry.additional_data or {}).get("api_key")

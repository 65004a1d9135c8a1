"""The replay jobs API: start one (or count it, dry run), follow it, pause, resume
and cancel it (deliveries/replays.py; README, Replay jobs)."""

from django.core.exceptions import ValidationError as DjangoValidationError
from django.utils import timezone
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.response import Response

from deliveries import replays
from deliveries.api.errors import ErrorSerializer, StateConflict
from deliveries.api.filters import WebhookChildFilter
from deliveries.api.serializers import OwnedRelatedField
from deliveries.api.strict import RefusesUnknown
from deliveries.api.views import ReadOnlyViewSet
from deliveries.models import Delivery, ReplayJob, Target, Webhook


class ReplayJobRequest(RefusesUnknown, serializers.Serializer):
    webhook = OwnedRelatedField(
        queryset=Webhook.objects.all(), help_text="The webhook whose events are sent again."
    )
    since = serializers.DateTimeField(
        help_text="Events received at or after this time (ISO 8601; UTC if no zone)."
    )
    until = serializers.DateTimeField(
        required=False, help_text="Events received before this time (absent: now)."
    )
    target = OwnedRelatedField(
        queryset=Target.objects.all(),
        required=False,
        allow_null=True,
        help_text="Only the deliveries to this target of the webhook.",
    )
    statuses = serializers.ListField(
        child=serializers.ChoiceField(choices=Delivery.Status.choices),
        required=False,
        max_length=len(Delivery.Status.choices),
        help_text="Only deliveries in these statuses (absent: every finished one; "
        "pending and retrying ones only with to_target).",
    )
    to_target = OwnedRelatedField(
        queryset=Target.objects.all(),
        required=False,
        allow_null=True,
        help_text="Send each matched event to this target of the webhook instead "
        "(a delivery created for it, or set back), not to the targets it went to.",
    )
    dry_run = serializers.BooleanField(
        required=False, default=False, help_text='Only count: answer {"matched": n}.'
    )

    def validate(self, attrs):
        criteria = replays.Criteria(
            attrs["webhook"],
            attrs["since"],
            attrs.get("until") or timezone.now(),
            attrs.get("target"),
            tuple(dict.fromkeys(attrs.get("statuses", ()))),
            attrs.get("to_target"),
        )
        try:
            criteria.clean()
        except DjangoValidationError as exc:
            raise serializers.ValidationError(exc.message_dict) from None
        return {"criteria": criteria, "dry_run": attrs["dry_run"]}


class MatchedSerializer(serializers.Serializer):
    matched = serializers.IntegerField(help_text="Deliveries a job started now would send.")


class ReplayJobSerializer(serializers.ModelSerializer):
    class Meta:
        model = ReplayJob
        fields = [
            "id",
            "state",
            "webhook",
            "since",
            "until",
            "target",
            "statuses",
            "to_target",
            "matched",
            "queued",
            "delivered",
            "failed",
            "filtered",
            "skipped",
            "created_at",
            "finished_at",
        ]
        read_only_fields = fields
        extra_kwargs = {
            "matched": {"help_text": "Deliveries the job sends (0 until it is planned)."},
            "queued": {"help_text": "Handed to the engine so far."},
            "delivered": {"help_text": "Of those queued, delivered."},
            "failed": {"help_text": "Of those queued, failed."},
            "filtered": {"help_text": "Of those queued, not sent: the target's filters."},
            "skipped": {"help_text": "Already on their way when their turn came: not sent."},
        }


def replay_control(name: str, verb, already: tuple, allowed: str):
    """A job's pause/resume/cancel: the job as it now is. Asking for the state it is
    in already changes nothing and answers 200; 409 when its state does not allow it."""

    def control(self, request, pk=None):
        job = self.get_object()
        changed = verb(job)
        job.refresh_from_db()
        if not changed and job.state not in already:
            raise StateConflict(
                f"Replay job {job.pk} is {job.state}: only a job that is {allowed}."
            )
        return Response(ReplayJobSerializer(job).data)

    control.__name__ = name  # before @action, which routes to the method by it
    return extend_schema(
        operation_id=f"replays_{name}",
        request=None,
        responses={200: ReplayJobSerializer, 404: ErrorSerializer, 409: ErrorSerializer},
        description=f"Only a job that is {allowed}; 409 otherwise.",
    )(action(detail=True, methods=["post"])(control))


class ReplayViewSet(ReadOnlyViewSet):
    """Replay jobs: what a webhook received in a time range, sent again by the
    engine, with progress, pause, resume and cancel (README, Replay jobs)."""

    model = ReplayJob
    serializer_class = ReplayJobSerializer
    list_filter = WebhookChildFilter

    @extend_schema(
        operation_id="replays_create",
        request=ReplayJobRequest,
        responses={
            201: ReplayJobSerializer,
            200: OpenApiResponse(MatchedSerializer, description="A dry run's count."),
        },
    )
    def create(self, request):
        """Start a job, or with dry_run only count what it would send."""
        asked = ReplayJobRequest(data=request.data, context=self.get_serializer_context())
        asked.is_valid(raise_exception=True)
        criteria = asked.validated_data["criteria"]
        if asked.validated_data["dry_run"]:
            return Response({"matched": criteria.count()})
        job = replays.start(criteria, request.user)  # checked by the request's validate()
        return Response(ReplayJobSerializer(job).data, status=201)

    cancel = replay_control(
        "cancel", replays.cancel, (ReplayJob.State.CANCELLED,), "planning, running or paused"
    )
    pause = replay_control("pause", replays.pause, (ReplayJob.State.PAUSED,), "planning or running")
    resume = replay_control("resume", replays.resume, ReplayJob.ACTIVE, "paused")

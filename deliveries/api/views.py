"""The API's resources and actions. Every queryset starts from visible_to(user), the
admin's ownership rule, so another user's rows answer 404 like missing ones; every
action calls the same set-based operation as the admin's."""

from django.db import transaction
from django.db.models import F, QuerySet
from django.http import HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException, NotFound, ValidationError
from rest_framework.response import Response

from deliveries import audit, bodies, export
from deliveries.api import idempotency
from deliveries.api import serializers as s
from deliveries.api.errors import ErrorSerializer
from deliveries.api.filters import (
    AuditFilter,
    DeliveryFilter,
    DeliverySelection,
    EventFilter,
    QueryFilter,
    WebhookChildFilter,
)
from deliveries.models import Delivery, Entrypoint, Event, Target, Webhook
from deliveries.transforms import TransformError
from deliveries.transforms.preview import preview

# Path ids are digits that fit a database integer; anything else is a 404 at routing.
ID_PATTERN = r"[0-9]{1,18}"


class OwnedViewSet(viewsets.GenericViewSet):
    model: type
    lookup_value_regex = ID_PATTERN
    _idempotent = None

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)  # authenticated, allowed, throttled
        self._idempotent = idempotency.begin(request)

    def handle_exception(self, exc):
        if isinstance(exc, idempotency.Replayed):
            return idempotency.replay(exc.record)
        try:
            return super().handle_exception(exc)
        except Exception:
            idempotency.abandon(self._idempotent)
            raise

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        if self._idempotent is not None:
            idempotency.complete(self._idempotent, response)
        return response

    # The list's query parameters, validated and documented (a QueryFilter), or None.
    list_filter = None
    # What one row reads as, when it shows more than the list does.
    detail_serializer_class = None

    def get_serializer_class(self):
        if self.action == "retrieve" and self.detail_serializer_class is not None:
            return self.detail_serializer_class
        return super().get_serializer_class()

    def get_queryset(self):
        queryset = self.model.objects.visible_to(self.request.user)
        if self.action in ("list", "export"):
            # Every list checks its parameters: one it does not know is a 400.
            params = self.list_filter or QueryFilter
            known = {"also_known": (self.paginator.cursor_query_param, "limit", "as")}
            queryset = params(data=self.request.query_params, context=known).apply(queryset)
        return queryset

    def selected(self, queryset, selection) -> QuerySet:
        """A bulk action's rows: `ids` (each must be visible, else 404) and filters."""
        selection.is_valid(raise_exception=True)
        ids = selection.validated_data.get("ids")
        if ids:
            queryset = queryset.filter(pk__in=ids)
            missing = set(ids) - set(queryset.values_list("pk", flat=True))
            if missing:
                name = self.model._meta.verbose_name
                raise NotFound(f"No such {name}: {', '.join(map(str, sorted(missing)))}.")
        return selection.apply(queryset)


class ReadOnlyViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, OwnedViewSet):
    pass


class CrudViewSet(
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    ReadOnlyViewSet,
):
    pass


class EntrypointViewSet(CrudViewSet):
    """Inbound URLs: each webhook has one or more; senders POST to `url`."""

    model = Entrypoint
    serializer_class = s.EntrypointSerializer
    list_filter = WebhookChildFilter


class WebhookViewSet(CrudViewSet):
    """Webhooks: a new one gets its first entrypoint at once."""

    model = Webhook
    serializer_class = s.WebhookSerializer

    def get_queryset(self):
        return super().get_queryset().select_related("owner").prefetch_related("entrypoints")

    def perform_create(self, serializer):
        with transaction.atomic():
            webhook = serializer.save(owner=self.request.user)
            webhook.ensure_entrypoint()


class TargetViewSet(CrudViewSet):
    """Where a webhook's events go. Validated as in the admin (config per type, SSRF)."""

    model = Target
    serializer_class = s.TargetSerializer
    list_filter = WebhookChildFilter

    @extend_schema(
        operation_id="targets_pause", request=s.PauseSerializer, responses=s.TargetSerializer
    )
    @action(detail=True, methods=["post"])
    def pause(self, request, pk=None):
        """Hold the target's deliveries, unattempted, until resumed."""
        target = self.get_object()
        form = s.PauseSerializer(data=request.data, context=self.get_serializer_context())
        form.is_valid(raise_exception=True)
        Target.objects.filter(pk=target.pk).pause(form.validated_data["reason"])
        return self._current(target)

    @extend_schema(operation_id="targets_resume", request=None, responses=s.TargetSerializer)
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        """Send what waited, in order."""
        target = self.get_object()
        Target.objects.filter(pk=target.pk).resume()
        return self._current(target)

    @extend_schema(operation_id="targets_rotate_secret", request=None, responses=s.TargetSerializer)
    @action(detail=True, methods=["post"], url_path="rotate-secret")
    def rotate_secret(self, request, pk=None):
        """A new signing secret; the old one still signs during the rotation overlap
        (SIGNING_ROTATION_OVERLAP), so receivers can switch over."""
        target = self.get_object()
        target.rotate_signing_secret()
        return self._current(target)

    @extend_schema(
        operation_id="targets_preview",
        request=s.PreviewRequestSerializer,
        responses={200: s.PreviewSerializer, 400: ErrorSerializer},
    )
    @action(detail=True, methods=["post"])
    def preview(self, request, pk=None):
        """What the target would be sent for one of its webhook's stored events: its
        filters, then its transform (or `transform`, unsaved), nothing sent."""
        target = self.get_object()
        form = s.PreviewRequestSerializer(data=request.data, context=self.get_serializer_context())
        form.is_valid(raise_exception=True)
        event = Event.objects.filter(webhook_id=target.webhook_id, pk=form.validated_data["event"])
        event = event.first()
        if event is None:
            raise ValidationError({"event": ["No such event of this target's webhook."]})
        try:
            answer = preview(
                target,
                event,
                form.validated_data.get("transform"),
                form.validated_data.get("filters"),
            )
        except TransformError as exc:
            raise ValidationError(f"The transform failed: {exc}") from None
        return Response(s.PreviewSerializer(answer).data)

    def _current(self, target):
        target.refresh_from_db()
        return Response(self.get_serializer(target).data)


class ExportMixin:
    """`GET …/export/?as=csv|jsonl` and the list's filters: every row the list
    would page through, streamed (deliveries/export.py)."""

    export_columns: dict

    def export_rows(self, queryset):
        return queryset

    def perform_content_negotiation(self, request, force=False):
        # CSV or JSON Lines whatever the client accepts; errors are JSON.
        return super().perform_content_negotiation(request, force=force or self.action == "export")

    @action(detail=False, methods=["get"])
    def export(self, request):
        kind = request.query_params.get("as", "jsonl")
        if kind not in export.FORMATS:
            raise ValidationError({"as": [f"One of {', '.join(export.FORMATS)}."]})
        rows = self.export_rows(self.get_queryset())
        return export.stream(rows, self.export_columns, kind, self.basename + "s")


def export_schema(name, list_filter):
    return extend_schema(
        operation_id=f"{name}_export",
        parameters=[
            list_filter,
            OpenApiParameter("as", OpenApiTypes.STR, enum=list(export.FORMATS), default="jsonl"),
        ],
        responses={
            (200, "text/csv"): OpenApiResponse(OpenApiTypes.BINARY),
            (200, "application/jsonl"): OpenApiResponse(OpenApiTypes.BINARY),
        },
        description="The list as filtered, every row, streamed: CSV with a header row, "
        "or one JSON object per line.",
    )


@extend_schema_view(export=export_schema("events", EventFilter))
class EventViewSet(ExportMixin, ReadOnlyViewSet):
    """Events as received, newest first. Read-only: replay sends them again."""

    model = Event
    serializer_class = s.EventSerializer
    detail_serializer_class = s.EventDetailSerializer
    list_filter = EventFilter
    export_columns = export.EVENT_COLUMNS

    def get_queryset(self):
        queryset = super().get_queryset()
        if self.action not in ("body", "resend"):
            # Nothing but the body download and a resend read bodies: not megabytes
            # per page.
            queryset = queryset.defer("body")
        if self.action == "list":
            queryset = queryset.defer("body", "headers")
        return queryset

    def perform_content_negotiation(self, request, force=False):
        # The body is answered as received whatever the client accepts; errors
        # are JSON like everywhere else.
        return super().perform_content_negotiation(request, force=force or self.action == "body")

    @extend_schema(
        operation_id="events_resend",
        request=s.ResendSerializer,
        responses={201: s.EventDetailSerializer},
    )
    @action(detail=True, methods=["post"])
    def resend(self, request, pk=None):
        """An edited copy of the event (`body`, `headers`), stored as a new event
        linked to it (`resent_from`) and delivered as usual."""
        event = self.get_object()
        form = s.ResendSerializer(data=request.data, context=self.get_serializer_context())
        form.is_valid(raise_exception=True)
        body = form.validated_data.get("body")
        copy = event.resend(
            body=None if body is None else body.encode("utf-8"),
            headers=form.validated_data.get("headers"),
        )
        return Response(
            s.EventDetailSerializer(copy, context={"request": request}).data, status=201
        )

    @extend_schema(
        operation_id="events_body",
        responses={
            # Any schema, not a binary string: the answer is whatever was received,
            # under its own Content-Type, so a JSON body is JSON to a client that
            # reads it by its Content-Type (schemathesis does).
            (200, "*/*"): OpenApiResponse(
                OpenApiTypes.ANY,
                description="The exact bytes received, with the Content-Type received.",
            )
        },
    )
    @action(detail=True, methods=["get"])
    def body(self, request, pk=None):
        event = self.get_object()
        try:
            body = event.read_body()
        except bodies.Unreadable as exc:
            raise APIException(f"{str(exc).capitalize()}.") from exc
        response = HttpResponse(body, content_type=event.content_type or "application/octet-stream")
        # Whatever the sender claimed the body is, it must never run as a page on
        # this origin (the admin's): a download, unsniffed, sandboxed.
        response["Content-Disposition"] = f'attachment; filename="event-{event.code}.bin"'
        response["X-Content-Type-Options"] = "nosniff"
        response["Content-Security-Policy"] = "sandbox; default-src 'none'"
        return response

    @extend_schema(
        operation_id="events_replay",
        request=s.ReplayRequest,
        responses={200: s.ReplayedSerializer, 404: ErrorSerializer},
    )
    @action(detail=False, methods=["post"])
    def replay(self, request):
        """Send events again (by `ids` or by filter): finished deliveries back to
        pending, new ones for targets added since; or only to `target`."""
        selection = s.ReplayRequest(data=request.data, context=self.get_serializer_context())
        events = self.selected(self.get_queryset(), selection)
        reset, created = events.replay(target=selection.validated_data.get("target"))
        return Response({"queued": reset + created, "redelivered": reset, "created": created})


@extend_schema_view(export=export_schema("deliveries", DeliveryFilter))
class DeliveryViewSet(ExportMixin, ReadOnlyViewSet):
    """One event to one target: its status and every attempt."""

    model = Delivery
    serializer_class = s.DeliverySerializer
    detail_serializer_class = s.DeliveryDetailSerializer
    list_filter = DeliveryFilter
    export_columns = export.DELIVERY_COLUMNS

    def export_rows(self, queryset):
        return export.deliveries_for_export(queryset)

    def get_queryset(self):
        queryset = (
            super()
            .get_queryset()
            .annotate(webhook_id=F("target__webhook_id"), event_code=F("event__code"))
        )
        if self.action == "retrieve":
            queryset = queryset.prefetch_related("results")
        return queryset

    @extend_schema(
        operation_id="deliveries_redeliver",
        request=DeliverySelection,
        responses={200: s.RedeliveredSerializer, 404: ErrorSerializer},
    )
    @action(detail=False, methods=["post"])
    def redeliver(self, request):
        """Send finished deliveries again (by `ids` or by filter, e.g. failed ones
        of a target since a time). Pending and retrying ones are on their way."""
        selection = DeliverySelection(data=request.data, context=self.get_serializer_context())
        deliveries = self.selected(Delivery.objects.visible_to(request.user), selection)
        matched = deliveries.count()
        return Response({"queued": deliveries.redeliver(), "matched": matched})

    @extend_schema(operation_id="deliveries_retry", request=None, responses=s.QueuedSerializer)
    @action(detail=True, methods=["post"])
    def retry(self, request, pk=None):
        """Retry now: skip what is left of a retrying delivery's backoff."""
        delivery = self.get_object()
        return Response({"queued": Delivery.objects.filter(pk=delivery.pk).retry_now()})


@csrf_exempt
def not_found(request, *args, **kwargs):
    """Any other path under /api/v1/: the API's 404, not an HTML page. CSRF-exempt
    as every API view is (DRF's views are; keys, not cookies, authenticate): a
    write to a path that names nothing (`targets/abc/pause/`) is a 404, not the
    CSRF failure page."""
    return JsonResponse({"error": "Not found.", "fields": {}}, status=404)


class AuditViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """The audit log: every create, change and delete of webhooks, entrypoints,
    targets, API keys and users, newest first. A superuser reads every entry; anyone
    else those about their own objects (deleted ones too) and those they made."""

    serializer_class = s.AuditEntrySerializer
    list_filter = AuditFilter  # documented in the schema (schema.py)

    def get_queryset(self):
        params = self.list_filter(
            data=self.request.query_params,
            context={"also_known": (self.paginator.cursor_query_param, "limit")},
        )
        entries = audit.visible_to(self.request.user).select_related("actor", "content_type")
        return params.apply(entries)

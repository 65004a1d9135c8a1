import dataclasses
import datetime
import hashlib
import secrets
import time
import uuid

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import connections, models, transaction
from django.utils import timezone

from deliveries import audit, bodies, targets, verification, wake
from deliveries.audit import Audited
from deliveries.engine.backoff import clean_schedule
from deliveries.fields import EncryptedJSONField, EncryptedTextField, EncryptedURLField
from deliveries.filters import clean_filters
from deliveries.signing import new_secret
from deliveries.targets.base import FAILURES, MASK, require_url
from deliveries.transforms import validate_program
from webhooker import encryption

# "Receiver: timed out", "webhooker: transform failed", ...
FAILURE_CHOICES = [
    (name, f"{'Receiver' if whose == 'receiver' else 'webhooker'}: {words}")
    for name, whose, words in FAILURES
]


class OwnedQuerySet(models.QuerySet):
    """The ownership boundary, written once: a superuser sees every row, any other
    user only the rows of the webhooks they own (and their own API keys), an anonymous
    or inactive user none. The admin, its dashboard and the REST API scope every
    query through visible_to()."""

    # The lookup from the model to its owner; each subclass names its own.
    owner_path: str

    def visible_to(self, user):
        if not (user.is_authenticated and user.is_active):
            return self.none()
        if user.is_superuser:
            return self.all()
        return self.filter(**{self.owner_path: user})


class WebhookQuerySet(OwnedQuerySet):
    owner_path = "owner"


class Webhook(Audited, models.Model):
    code = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="webhooks")
    retention_days = models.PositiveIntegerField(
        default=30,
        validators=[MinValueValidator(1), MaxValueValidator(36_500)],
        help_text="Events older than this are pruned with their deliveries.",
    )
    alert_url = EncryptedURLField(
        blank=True,
        max_length=500,
        help_text="Optional Slack-compatible incoming-webhook URL for alerts about this "
        "webhook's targets (the owner is also emailed).",
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    objects = WebhookQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    def clean(self):
        if self.alert_url:
            try:
                require_url({"alert_url": self.alert_url}, "alert_url")
            except ValidationError as exc:
                raise ValidationError({"alert_url": exc.messages}) from None

    def ensure_entrypoint(self):
        """Give the webhook its first entrypoint, so a new webhook can receive at once."""
        if not self.entrypoints.exists():
            self.entrypoints.create(description="default")


class EntrypointQuerySet(OwnedQuerySet):
    owner_path = "webhook__owner"


class Entrypoint(Audited, models.Model):
    webhook = models.ForeignKey(Webhook, models.CASCADE, related_name="entrypoints")
    code = models.UUIDField(
        default=uuid.uuid4,
        unique=True,
        editable=False,
        help_text="The inbound URL is /webhook/<code>.",
    )
    # One member per preset of the verification registry: Verification.GITHUB == "github".
    Verification = models.TextChoices(
        "Verification", [(name.upper(), (name, label)) for name, label in verification.choices()]
    )

    description = models.CharField(max_length=200, blank=True)
    active = models.BooleanField(default=True, help_text="An inactive entrypoint answers 410 Gone.")
    verification = models.CharField(
        max_length=32,
        choices=Verification.choices,
        default=Verification.NONE,
        help_text="How a request proves it comes from the sender; one that fails is "
        "answered 401 and stores nothing.",
    )
    # The preset's settings, e.g. {"secret": "..."} (see deliveries/verification.py).
    verification_config = EncryptedJSONField(default=dict, blank=True)
    dedup = models.BooleanField(
        default=False,
        help_text="Store a provider's event only once: a repeat of its event id, while "
        "the first is kept, is answered with the first event's code.",
    )
    dedup_source = models.CharField(
        max_length=255,
        blank=True,
        help_text="Where the provider's event id is: header:Name or json:dotted.path "
        "(blank: the verification preset's default).",
    )
    created_at = models.DateTimeField(default=timezone.now)

    objects = EntrypointQuerySet.as_manager()

    class Meta:
        ordering = ["created_at"]

    def __str__(self):
        return self.description or str(self.code)

    def get_absolute_url(self):
        return f"/webhook/{self.code}"

    def clean_fields(self, exclude=None):
        # The config is checked against the preset here, not in clean(), because
        # only clean_fields() is told what a ModelForm leaves out (as for Target).
        exclude = exclude or ()
        errors = {}
        try:
            super().clean_fields(exclude)
        except ValidationError as exc:
            errors = exc.error_dict
        checks = {
            "verification_config": lambda: verification.clean_config(
                self.verification, self.verification_config
            ),
            "dedup_source": lambda: verification.clean_id_source(self.dedup_source),
        }
        for name, check in checks.items():
            if name not in exclude and name not in errors and "verification" not in errors:
                try:
                    setattr(self, name, check())
                except ValidationError as exc:
                    errors[name] = exc.messages
        if errors:
            raise ValidationError(errors)

    def clean(self):
        if self.dedup and not self.id_source:
            raise ValidationError(
                {"dedup_source": "Deduplication needs to know where the event id is."}
            )

    @property
    def id_source(self) -> str:
        """Where provider event ids are read from ("" when nowhere)."""
        return verification.id_source(self.verification, self.dedup_source)

    def inbound_url(self, request) -> str:
        """The full URL senders post to: WEBHOOKER_PUBLIC_URL, else this request's host."""
        base = settings.WEBHOOKER_PUBLIC_URL or request.build_absolute_uri("/")[:-1]
        return f"{base}{self.get_absolute_url()}"


class RejectionQuerySet(OwnedQuerySet):
    owner_path = "entrypoint__webhook__owner"

    def record(self, entrypoint_id: int, remote_addr: str | None, reason: str) -> None:
        """Keep a failed verification, and only the newest KEEP per entrypoint.

        The prune deletes below the KEEP-th newest id through the entrypoint's
        index: a few rows at a time, however long a flood of forgeries goes on.
        """
        with transaction.atomic(using=self.db):
            self.create(entrypoint_id=entrypoint_id, remote_addr=remote_addr, reason=reason[:200])
            oldest_kept = (
                self.filter(entrypoint_id=entrypoint_id)
                .order_by("-id")
                .values("id")[Rejection.KEEP - 1 : Rejection.KEEP]
            )
            self.filter(entrypoint_id=entrypoint_id, id__lt=models.Subquery(oldest_kept)).delete()


class Rejection(models.Model):
    """A request an entrypoint refused because it failed verification: why the
    sender's events stopped showing up."""

    KEEP = 100

    entrypoint = models.ForeignKey(
        Entrypoint, models.CASCADE, related_name="rejections", db_index=False
    )
    created_at = models.DateTimeField(default=timezone.now)
    remote_addr = models.GenericIPAddressField(null=True, blank=True)
    reason = models.CharField(max_length=200)

    objects = RejectionQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        indexes = [
            # An entrypoint's newest rejections (admin), and the prune on insert.
            models.Index(fields=["entrypoint", "-id"], name="rejection_entrypoint_idx"),
        ]

    def __str__(self):
        return self.reason


class TargetQuerySet(OwnedQuerySet):
    owner_path = "webhook__owner"

    def pause(self, reason: str) -> int:
        """Hold these targets' deliveries, unattempted, until resumed."""
        now = timezone.now()
        return self._change(paused=True, paused_reason=reason[:500], paused_at=now, now=now)

    def resume(self) -> int:
        """Send what waited, in order; the engine takes it up at once."""
        return self._change(paused=False, paused_reason="", paused_at=None, now=timezone.now())

    def _change(self, *, now, **values) -> int:
        # updated_at is the version the engine watches: bump it with the change.
        with transaction.atomic(using=self.db):
            before = list(self.select_related("webhook"))
            changed = self.update(updated_at=now, **values)
            if changed:
                wake.notify_on_commit(connections[self.db])
                # update() sends no signals: the audit log is told here, in the same
                # transaction, whoever paused (a user, or the engine by itself).
                for target in before:
                    audit.record(
                        target,
                        {
                            name: [str(getattr(target, name)), str(value)]
                            for name, value in values.items()
                            if getattr(target, name) != value
                        },
                    )
        return changed


class Target(Audited, models.Model):
    # One member per type of the target registry, the one list of them:
    # Target.Type.HTTP == "http", labelled "HTTP endpoint".
    Type = models.TextChoices(
        "Type", [(type_.upper(), (type_, label)) for type_, label in targets.choices()]
    )
    # An engine never attempts with a target row it checked longer ago than this
    # (engine/targets.py); so a change committed this long ago (and a margin)
    # is in every attempt begun since. A rotation answers only then.
    ENGINE_FRESHNESS = 0.5
    ROTATION_SEEN_AFTER = ENGINE_FRESHNESS + 0.25
    # How the target takes each delivery, beyond where it goes and how often it is
    # retried: the settings the console's form and the API's serializer offer alike.
    DELIVERY_SETTINGS = ("ordered", "rate_limit", "filters", "transform", "signing", "traceparent")

    webhook = models.ForeignKey(Webhook, models.CASCADE, related_name="targets")
    name = models.CharField(max_length=200)
    type = models.CharField(max_length=16, choices=Type.choices, default=Type.HTTP)
    active = models.BooleanField(default=True)
    # The URL, header values, a Slack webhook URL: credentials, encrypted at rest.
    config = EncryptedJSONField(default=dict, blank=True)
    # New targets retry (with backoff, behind the breaker): a receiver that is down
    # for a moment must not lose events.
    max_retries = models.PositiveIntegerField(
        default=5,
        help_text="0 = fire-and-forget: one attempt, no circuit breaker.",
    )
    retry_schedule = models.JSONField(
        default=list,
        blank=True,
        help_text="Delays in seconds before each retry, e.g. [5, 60, 600, 3600]: when set, "
        "it replaces the exponential backoff and its length is the number of retries.",
    )
    max_queue_size = models.PositiveIntegerField(
        default=10_000,
        validators=[MinValueValidator(1)],
        help_text="Most deliveries of this target the engine holds in memory; "
        "the rest wait in the database.",
    )
    paused = models.BooleanField(
        default=False,
        help_text="Deliveries are still created, and wait unattempted until resumed.",
    )
    paused_reason = models.CharField(max_length=500, blank=True)
    paused_at = models.DateTimeField(null=True, blank=True)
    ordered = models.BooleanField(
        default=False,
        help_text="One attempt at a time, in event order. A delivery that finally fails "
        "pauses the target, so nothing is ever delivered out of order.",
    )
    rate_limit = models.FloatField(
        default=0,
        validators=[MinValueValidator(0)],
        help_text="Attempts per second at most (0: no limit).",
    )
    filters = models.JSONField(
        default=list,
        blank=True,
        help_text="Deliver only events matching every rule; others end as 'filtered'.",
    )
    transform = models.TextField(
        blank=True,
        default="",
        validators=[validate_program],
        help_text="A jq program that reshapes what this target is sent, or drops the "
        "event with null (README, Transformations). Empty: sent as received.",
    )
    traceparent = models.BooleanField(
        default=True,
        db_default=True,
        verbose_name="Send traceparent",
        help_text="HTTP targets, with OpenTelemetry on: send each attempt's W3C traceparent "
        "(in place of the sender's), so the receiver's spans join the event's trace.",
    )
    signing = models.BooleanField(
        default=True,
        help_text="Sign HTTP deliveries (Standard Webhooks headers). Off only for "
        "receivers that refuse unknown headers.",
    )
    # The current Standard Webhooks secret (whsec_...), made when the target is.
    signing_secret = EncryptedTextField(default=new_secret, editable=False)
    # The secret the last rotation replaced: still signed with until
    # secret_rotated_at + SIGNING_ROTATION_OVERLAP, so receivers can switch over.
    previous_signing_secret = EncryptedTextField(blank=True, editable=False)
    secret_rotated_at = models.DateTimeField(null=True, blank=True, editable=False)
    # When the current run of failed attempts began (None: the last one succeeded).
    # Written by the engine on transitions only; auto-disable reads it.
    failing_since = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now)
    # Also the target's version: the engine re-reads a target whose updated_at moved,
    # so every change must go through save() or set it (see TargetQuerySet.pause).
    updated_at = models.DateTimeField(auto_now=True)

    objects = TargetQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    def save(self, *args, **kwargs):
        changed = not self._state.adding
        super().save(*args, **kwargs)
        if changed:
            # The one home of the rule: a changed target wakes the engine, which
            # re-reads a target whose updated_at moved; the wake makes it look now, so
            # a pause holds, a resume sends and a new URL is used at once (at COMMIT,
            # if any). A new target has nothing waiting.
            wake.notify_on_commit(connections[self._state.db])

    def clean_fields(self, exclude=None):
        # The config is checked against the type here, not in clean(), because only
        # clean_fields() is told what a ModelForm leaves out: the target form has no
        # config field; it validates the config as fields of its own.
        errors = {}
        try:
            super().clean_fields(exclude)
        except ValidationError as exc:
            errors = exc.error_dict
        if (
            "config" not in (exclude or ())
            and "config" not in errors
            and not encryption.unreadable(self.config)  # kept as stored: nothing to check
        ):
            try:
                self.config = targets.clean_config(
                    self.type, self.config, stored=self._stored_config()
                )
            except ValidationError as exc:
                errors["config"] = exc.error_list
        if "filters" not in (exclude or ()) and "filters" not in errors:
            try:
                self.filters = clean_filters(self.filters)
            except ValidationError as exc:
                errors["filters"] = exc.error_list
        if "retry_schedule" not in (exclude or ()) and "retry_schedule" not in errors:
            try:
                self.retry_schedule = clean_schedule(self.retry_schedule)
            except ValidationError as exc:
                errors["retry_schedule"] = exc.error_list
        if errors:
            raise ValidationError(errors)

    def _stored_config(self) -> dict | None:
        """The config as saved already (None for a new target, or one that cannot be
        read): what was checked when it was given need not be checked again."""
        if self._state.adding or self.pk is None:
            return None
        stored = Target.objects.filter(pk=self.pk).values_list("config", flat=True).first()
        return stored if isinstance(stored, dict) and not encryption.unreadable(stored) else None

    def rotate_signing_secret(self, *, wait: bool = True) -> str:
        """A new signing secret; the current one stays valid for the rotation overlap.

        One UPDATE, so the old secret kept is the one in the database, whatever this
        instance read; updated_at moves with it, which makes the engine re-read the
        target. Returns the new secret, once committed and seen by every engine
        (until_engines_see_changes), so a receiver told the new secret can check
        every attempt begun after it heard; with `wait=False` the caller waits, once
        for many rotations.
        """
        now = timezone.now()
        new = new_secret()
        Target.objects.filter(pk=self.pk).update(
            previous_signing_secret=models.F("signing_secret"),
            signing_secret=new,
            secret_rotated_at=now,
            updated_at=now,
        )
        wake.notify_on_commit(connections[self._state.db])
        if wait:
            transaction.on_commit(Target.until_engines_see_changes, using=self._state.db)
        audit.record(self, {"signing_secret": [MASK, "rotated"]})
        self.refresh_from_db(
            fields=["signing_secret", "previous_signing_secret", "secret_rotated_at", "updated_at"]
        )
        return new

    @staticmethod
    def until_engines_see_changes() -> None:
        """Wait until every engine attempts with the target rows as committed now.
        A time, not a handshake: engines check their rows at least every
        ENGINE_FRESHNESS seconds before an attempt, wherever they run."""
        time.sleep(Target.ROTATION_SEEN_AFTER)


class EventQuerySet(OwnedQuerySet):
    owner_path = "webhook__owner"
    # Events read for the types a webhook has seen: its newest, along the
    # (webhook, received_at) index, whatever its history holds.
    RECENT_TYPES_SCAN = 1000

    def recent_types(self, webhook_id: int) -> list[str]:
        """The event types among the webhook's newest events, sorted."""
        newest = (
            self.filter(webhook_id=webhook_id)
            .order_by("-received_at")
            .values_list("event_type", flat=True)[: self.RECENT_TYPES_SCAN]
        )
        return sorted({type_ for type_ in newest if type_})

    def replay(self, target=None) -> tuple[int, int]:
        """Send these events to their targets again: every finished delivery back to
        pending (history kept), and a new delivery for each active target that has
        none yet (added since). Set-based: a few queries for any number of events.
        Wakes the engine once this commits. Returns (set back, created).

        With `target`, only to that one target (say, one added since), and only the
        events of its webhook."""
        now = timezone.now()
        event_ids = self.values("pk")
        deliveries = Delivery.objects.filter(event__in=event_ids)
        # One filter() call, so that the annotation below reads the same join.
        joined = {"webhook__targets__active": True}
        if target is not None:
            deliveries = deliveries.filter(target=target)
            joined["webhook__targets"] = target
        with transaction.atomic(using=self.db):
            reset = deliveries.set_pending(now)
            missing = (
                Event.objects.filter(pk__in=event_ids)
                .filter(**joined)
                .annotate(target_id=models.F("webhook__targets__id"))
                .exclude(
                    models.Exists(
                        Delivery.objects.filter(
                            event=models.OuterRef("pk"), target=models.OuterRef("target_id")
                        )
                    )
                )
                .values_list("pk", "target_id")
            )
            created = len(
                Delivery.objects.bulk_create(
                    [
                        Delivery(event_id=e, target_id=t, created_at=now, updated_at=now)
                        for e, t in missing.iterator(chunk_size=2000)
                    ],
                    batch_size=1000,
                    ignore_conflicts=True,
                )
            )
            if reset or created:
                wake.notify_on_commit(connections[self.db])
        return reset, created


class Event(models.Model):
    code = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    webhook = models.ForeignKey(Webhook, models.CASCADE, related_name="events")
    entrypoint = models.ForeignKey(
        Entrypoint, models.SET_NULL, null=True, blank=True, related_name="events"
    )
    method = models.CharField(max_length=16)
    # As received, without the "?"; forwarded after the target URL's own query
    # unless the target's config says drop_query.
    query_string = models.TextField(blank=True, default="")
    # [[name, value], ...]: one pair per header line received, in order.
    headers = models.JSONField(default=list)
    body = models.BinaryField(default=b"")
    # Kept beside the body so lists, metrics and the engine can know the size
    # without reading the body itself (up to WEBHOOKER_MAX_BODY_BYTES).
    body_size = models.PositiveBigIntegerField(default=0)
    # A large body kept as a file beside the SQLite database (deliveries/bodies.py):
    # its name, `body` then empty. NULL, not "", so adding the column rewrites no
    # table. Read the body with read_body(), wherever it is.
    body_file = models.CharField(max_length=32, null=True, blank=True, editable=False)  # noqa: DJ001
    content_type = models.CharField(max_length=255, blank=True)
    remote_addr = models.GenericIPAddressField(null=True, blank=True)
    received_at = models.DateTimeField(default=timezone.now)
    # The sender's own id of the event (X-GitHub-Delivery, Stripe's "id"...), when
    # the entrypoint knows where it is; "" otherwise.
    provider_id = models.CharField(max_length=255, blank=True, default="")
    # The sender's name for what happened (X-GitHub-Event, Stripe's "type"...), read
    # at ingest (verification.sender_says); "" when the request does not say.
    event_type = models.CharField(max_length=200, blank=True, default="")
    # The inbound request's X-Request-Id (deliveries.middleware.RequestIdMiddleware).
    request_id = models.CharField(max_length=128, blank=True, default="", db_default="")
    # The W3C traceparent of the span that received it (deliveries/tracing.py): its
    # attempts' spans are children of it. "" when tracing is off.
    traceparent = models.CharField(max_length=55, blank=True, default="", db_default="")
    # The event this one is an edited copy of (Event.resend), if it is one.
    resent_from = models.ForeignKey(
        "self", models.SET_NULL, null=True, blank=True, related_name="resends"
    )
    # Stored by a deduplicating entrypoint: no other such event of the webhook may
    # have the same provider_id while this one is kept (event_provider_id_uniq).
    deduplicated = models.BooleanField(default=False)
    # Repeats of this event answered as duplicates: it was received 1 + duplicates times.
    duplicates = models.PositiveIntegerField(default=0)

    objects = EventQuerySet.as_manager()

    class Meta:
        ordering = ["-received_at", "-id"]
        indexes = [
            # The event list's default ordering, and retention's "older than".
            models.Index(fields=["-received_at", "-id"], name="event_received_idx"),
            # One webhook's events by age: the admin filter and pruneevents.
            models.Index(fields=["webhook", "received_at"], name="event_webhook_received_idx"),
            # The admin's search by provider id. Partial: most events have none.
            models.Index(
                fields=["provider_id"],
                name="event_provider_id_idx",
                condition=~models.Q(provider_id=""),
            ),
            # Which events name a body file (retention.sweep_body_files).
            models.Index(
                fields=["body_file"],
                name="event_body_file_idx",
                condition=models.Q(body_file__isnull=False),
            ),
        ]
        constraints = [
            # Deduplication: the database, not a read-then-write, decides which of
            # two concurrent posts of one event id is stored (ingest inserts with
            # ON CONFLICT DO NOTHING). Deleting the event (retention) frees its id.
            models.UniqueConstraint(
                fields=["webhook", "provider_id"],
                name="event_provider_id_uniq",
                condition=models.Q(deduplicated=True),
            ),
        ]

    def __str__(self):
        return str(self.code)

    def read_body(self) -> bytes:
        """The body as received, from the row or from its file."""
        if self.body_file:
            return bodies.read(self.body_file)
        return bytes(self.body)

    def resend(self, *, body: bytes | None = None, headers: list | None = None) -> "Event":
        """A copy of this event, its body and header lines edited (None: as they
        were), stored as a new event of the same webhook linked to this one, with a
        pending delivery for each active target: delivered as usual."""
        headers = self.headers if headers is None else headers
        body = self.read_body() if body is None else body
        says = verification.sender_says(headers, body)
        body_file = bodies.write_or_unavailable(body) if bodies.spills(len(body)) else None
        content_type = next(
            (value for name, value in headers if name.lower() == "content-type"), ""
        )
        now = timezone.now()
        with transaction.atomic():
            copy = Event.objects.create(
                webhook_id=self.webhook_id,
                entrypoint_id=self.entrypoint_id,
                method=self.method,
                query_string=self.query_string,
                headers=headers,
                body=b"" if body_file else body,
                body_file=body_file,
                body_size=len(body),
                content_type=content_type[:255],
                received_at=now,
                event_type=says.event_type,
                provider_id=says.event_id,
                resent_from=self,
            )
            Delivery.objects.bulk_create(
                Delivery(event=copy, target_id=target_id, created_at=now, updated_at=now)
                for target_id in Target.objects.filter(
                    webhook_id=self.webhook_id, active=True
                ).values_list("id", flat=True)
            )
            wake.notify_on_commit(connections[Event.objects.db])
        return copy


# The reason a delivery set back to pending that was never attempted (a filtered
# one) carries until its attempt: what intake's sweep of set-back rows finds it by,
# since it has no attempt to be found by (delivery_requeued_idx).
SENT_AGAIN = "sent again"
# Pending deliveries set back by a redeliver or replay (or hurried by Retry now).
REQUEUED = models.Q(status="pending") & (models.Q(attempts__gt=0) | models.Q(reason=SENT_AGAIN))


class DeliveryQuerySet(OwnedQuerySet):
    owner_path = "target__webhook__owner"

    def unfinished(self):
        return self.filter(status__in=Delivery.UNFINISHED)

    def stale(self, before):
        """What the recovery tick looks at: pending deliveries nobody touched since
        `before`, and retrying ones whose retry was due before then (a retry that
        lost its owner must not wait for the next restart)."""
        return self.filter(
            models.Q(status=Delivery.Status.PENDING)
            | models.Q(status=Delivery.Status.RETRYING, next_attempt_at__lt=before),
            updated_at__lt=before,
        )

    def requeued(self):
        """Pending deliveries set back: attempted before, or marked SENT_AGAIN."""
        return self.filter(REQUEUED)

    def redeliver(self) -> int:
        """Set the finished deliveries among these back to pending, keeping their
        attempts and results, and wake the engine once that commits. Pending and
        retrying ones are already on their way and stay as they are. Returns how
        many were set back."""
        with transaction.atomic(using=self.db):
            queued = self.set_pending(timezone.now())
            if queued:
                wake.notify_on_commit(connections[self.db])
        return queued

    def retry_now(self) -> int:
        """Skip what is left of the backoff of these retrying deliveries.

        They become pending again (attempts kept): the engine's sweep of such rows
        finds them, and one it holds for a later retry is attempted at once.
        """
        with transaction.atomic(using=self.db):
            hurried = self.filter(status=Delivery.Status.RETRYING).update(
                status=Delivery.Status.PENDING, next_attempt_at=None, updated_at=timezone.now()
            )
            if hurried:
                wake.notify_on_commit(connections[self.db])
        return hurried

    def set_pending(self, now) -> int:
        """The transition of redeliver and replay, without the transaction or the wake.
        One never attempted is marked SENT_AGAIN, for intake to find it."""
        return self.filter(status__in=Delivery.FINISHED).update(
            status=Delivery.Status.PENDING,
            next_attempt_at=None,
            reason=models.Case(
                models.When(attempts=0, then=models.Value(SENT_AGAIN)),
                default=models.Value(""),
            ),
            updated_at=now,
        )


class Delivery(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        RETRYING = "retrying"
        DELIVERED = "delivered"
        FAILED = "failed"
        # The target's filters did not match the event: nothing was sent.
        FILTERED = "filtered"

    UNFINISHED = (Status.PENDING, Status.RETRYING)
    FINISHED = (Status.DELIVERED, Status.FAILED, Status.FILTERED)

    # Both foreign keys are served by composite indexes below (the unique
    # constraint leads with event); a plain index on each would only cost inserts.
    event = models.ForeignKey(Event, models.CASCADE, related_name="deliveries", db_index=False)
    target = models.ForeignKey(Target, models.CASCADE, related_name="deliveries", db_index=False)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    # Why it ended with no attempt (filtered): the filters, or the transform; or,
    # set back to pending without one, SENT_AGAIN until its attempt.
    reason = models.CharField(max_length=200, blank=True, default="", db_default="")
    # Whose fault its final failure was (status failed): targets.base.FAILURES.
    failure = models.CharField(
        max_length=16, blank=True, default="", db_default="", choices=FAILURE_CHOICES
    )
    created_at = models.DateTimeField(default=timezone.now)
    # The "touched" clock of the recovery tick. QuerySet.update() skips auto_now,
    # so every update() sets it explicitly; default=now rather than auto_now keeps
    # it settable by tests and backfills.
    updated_at = models.DateTimeField(default=timezone.now)

    objects = DeliveryQuerySet.as_manager()

    class Meta:
        verbose_name_plural = "deliveries"
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(fields=["event", "target"], name="delivery_event_target_uniq"),
        ]
        indexes = [
            # The admin's delivery list (newest first) filtered by status, and the
            # dashboard's counts by status.
            models.Index(fields=["status", "-id"], name="delivery_status_idx"),
            # The dashboard's last-24-hours figures (counts by status, by hour, failed
            # by target): one range of this index, which holds all they read.
            models.Index(
                fields=["updated_at", "status", "target"], name="delivery_updated_status_idx"
            ),
            # A target's deliveries in one status, recently changed: the webhook
            # list's failed and retrying counts, "redeliver failed since".
            models.Index(
                fields=["target", "status", "updated_at"], name="delivery_target_status_idx"
            ),
            # The delivery list sorted by attempts (the admin's tie-breaker is -id).
            models.Index(fields=["attempts", "id"], name="delivery_attempts_idx"),
            # A target's deliveries newest first (admin filter), cascades on delete.
            models.Index(fields=["target", "-id"], name="delivery_target_idx"),
            # Recovery: at start every pending/retrying delivery; on a tick the
            # pending ones with updated_at < now - DELIVERY_STALE_AFTER, oldest first.
            # Partial, so it holds only unfinished rows however many are delivered.
            models.Index(
                fields=["status", "updated_at"],
                name="delivery_unfinished_idx",
                condition=models.Q(status__in=["pending", "retrying"]),
            ),
            # Retrying deliveries by due time (recovery schedules them from it).
            models.Index(
                fields=["next_attempt_at"],
                name="delivery_retry_due_idx",
                condition=models.Q(status="retrying"),
            ),
            # Intake's sweep of deliveries set back to pending by a redeliver.
            models.Index(fields=["id"], name="delivery_requeued_idx", condition=REQUEUED),
            # Intake's per-target drain once a full target has room again.
            models.Index(
                fields=["target", "id"],
                name="delivery_target_unfinished_idx",
                condition=models.Q(status__in=["pending", "retrying"]),
            ),
            # An ordered lane's head: its target's first unfinished delivery in
            # event order, one probe however long the lane's backlog.
            models.Index(
                fields=["target", "event"],
                name="delivery_lane_idx",
                condition=models.Q(status__in=["pending", "retrying"]),
            ),
        ]

    def __str__(self):
        return f"delivery {self.pk}"


class DeliveryResult(models.Model):
    RESPONSE_BODY_LIMIT = targets.RESPONSE_BODY_LIMIT

    delivery = models.ForeignKey(Delivery, models.CASCADE, related_name="results")
    # The delivery's target, kept on each attempt so a target's health (success
    # rate, durations, last error over 24 h) reads one index range, not a join
    # through every delivery the target ever had.
    target = models.ForeignKey(
        Target, models.CASCADE, null=True, blank=True, related_name="+", db_index=False
    )
    attempt = models.PositiveIntegerField()
    success = models.BooleanField()
    # The request as sent: its URL and header lines ([[name, value], ...]) with
    # credentials masked (targets.masked_headers), for the delivery page.
    request_url = models.TextField(blank=True, default="")
    request_headers = models.JSONField(default=list, blank=True)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    # The first RESPONSE_HEADERS_LIMIT bytes of the answer's header lines, as text.
    response_headers = models.TextField(blank=True, default="")
    response_body = models.TextField(blank=True)
    error = models.TextField(blank=True)
    # A failed attempt's class, whose fault it was (targets.base.FAILURES).
    failure = models.CharField(
        max_length=16, blank=True, default="", db_default="", choices=FAILURE_CHOICES
    )
    duration_ms = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["delivery", "attempt", "id"]
        indexes = [
            # A target's attempts by time: its health figures in the admin.
            models.Index(fields=["target", "created_at"], name="result_target_created_idx"),
        ]

    def __str__(self):
        return f"attempt {self.attempt}"


class EngineStatusQuerySet(models.QuerySet):
    def current(self, name=None) -> "EngineStatus":
        """The engine's row (`name`; else the one heard from last); a blank unsaved
        one (never beaten, so not alive) before an engine first starts, so readers
        need no case of their own for it."""
        rows = self.filter(name=name) if name else self.order_by("-heartbeat_at", "-id")
        return rows.first() or self.model(name=name or "default")

    def live(self, now) -> list["EngineStatus"]:
        """Every engine alive at `now`, by host and pid."""
        cutoff = now - datetime.timedelta(seconds=self.model.STALE_AFTER)
        rows = self.filter(stopped_at=None, heartbeat_at__gte=cutoff)
        return [row for row in rows.order_by("hostname", "pid", "id") if row.alive(now)]

    def coverage(self, now) -> "Coverage":
        """The live engines, and the partitions none of them holds."""
        engines = self.live(now)
        if any(engine.partitions is None for engine in engines):
            return Coverage(engines, 1, [])
        cluster = EngineCluster.objects.first()
        count = cluster.partitions if cluster else 1
        held = {p for engine in engines for p in engine.partitions or ()}
        # A partition handed over a moment ago is on its way to its next holder:
        # unheld only once its grace is over (Partition.HANDOVER_GRACE).
        moving = set(
            Partition.objects.filter(
                changed_at__gte=now - datetime.timedelta(seconds=Partition.HANDOVER_GRACE)
            ).values_list("number", flat=True)
        )
        return Coverage(engines, count, [p for p in range(count) if p not in held | moving])

    def forgotten(self, now):
        """Rows of engines gone for a day: each start writes a row of its own."""
        return self.filter(heartbeat_at__lt=now - datetime.timedelta(days=1))


@dataclasses.dataclass(frozen=True)
class Coverage:
    """Who delivers: the live engines, the partition count, the partitions nobody
    holds (nothing of theirs is delivered until an engine takes them)."""

    engines: list
    partitions: int
    unheld: list

    @property
    def complete(self) -> bool:
        return bool(self.engines) and not self.unheld


class EngineCluster(models.Model):
    """What every engine sharing this database must agree on: one row, written by
    the first engine that starts (on PostgreSQL; SQLite has one engine and one
    partition). Changing the partition count would move targets between partitions
    under running engines, so a mismatch refuses to start instead."""

    partitions = models.PositiveIntegerField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "engine cluster"

    def __str__(self):
        return f"{self.partitions} partitions"


class Partition(models.Model):
    """A partition's fencing token (PostgreSQL; DESIGN §13): `epoch` grows by one at
    every take, in the same statement that records the new `holder`. Result writes
    carry the epoch their claim was made under, and a write whose epoch is no longer
    current changes nothing (engine/writer.py). `holder` is the engine name holding
    it, blank once it was handed over cleanly (its next holder need not wait out the
    previous holder's lease)."""

    # Seconds a partition may be between two holders before the healthcheck calls
    # it unheld: a planned hand-over moves it within a second.
    HANDOVER_GRACE = 5.0

    number = models.PositiveIntegerField(primary_key=True)
    epoch = models.BigIntegerField(default=0)
    holder = models.CharField(max_length=64, blank=True)
    changed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["number"]

    def __str__(self):
        return f"partition {self.number} (epoch {self.epoch})"


class EngineStatus(models.Model):
    """An engine's heartbeat: one row per running engine (`name` is unique per
    process). The one place that says which engines are alive and which partitions
    they hold (dashboard, /metrics, health)."""

    # Seconds between two writes of the row by the running engine.
    HEARTBEAT_INTERVAL = 5.0
    # Seconds after which the last heartbeat means the engine is gone. Six intervals:
    # a beat or two delayed by a busy database or a paused machine must not make the
    # healthcheck flap, and a dead engine must still show within half a minute.
    STALE_AFTER = HEARTBEAT_INTERVAL * 6

    name = models.CharField(max_length=64, unique=True, default="default")
    pid = models.PositiveIntegerField(null=True)
    hostname = models.CharField(max_length=255, blank=True)
    started_at = models.DateTimeField(null=True)
    heartbeat_at = models.DateTimeField(null=True)
    stopped_at = models.DateTimeField(null=True)
    channel_depth = models.PositiveIntegerField(default=0)
    inflight = models.PositiveIntegerField(default=0)
    busy_workers = models.PositiveIntegerField(default=0)
    # HTTP attempts sent and not yet answered (DELIVERY_INFLIGHT at most).
    attempts_in_flight = models.PositiveIntegerField(default=0)
    workers = models.PositiveIntegerField(default=0)
    open_breakers = models.PositiveIntegerField(default=0)
    # Every breaker that is not closed: {target id: {"state", "since", "until"}},
    # times in ISO 8601; "until" is when the next probe may go.
    breakers = models.JSONField(default=dict, blank=True)
    # The partitions this engine holds (PostgreSQL: the locks it has); None: the whole
    # database, as SQLite's one engine has it.
    partitions = models.JSONField(null=True, blank=True, default=None)
    # PostgreSQL, written by the lock connection's every renewal (server clock): when
    # the lease was last confirmed and when it runs out. Another engine evicts this
    # one when `lease_renewed_at` is older than DELIVERY_EVICT_AFTER, and a taker of
    # its partitions waits for `lease_until` before attempting in them.
    lease_renewed_at = models.DateTimeField(null=True, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    # The lock connection's backend pid (what eviction terminates).
    lock_pid = models.PositiveIntegerField(null=True, blank=True)

    objects = EngineStatusQuerySet.as_manager()

    class Meta:
        verbose_name_plural = "engine status"

    def __str__(self):
        return f"engine {self.name}"

    def heartbeat_age(self, now) -> float | None:
        """Seconds since the last heartbeat, None if there never was one."""
        if self.heartbeat_at is None:
            return None
        return (now - self.heartbeat_at).total_seconds()

    def alive(self, now) -> bool:
        """Running and heard from within STALE_AFTER; a clean stop is not alive."""
        age = self.heartbeat_age(now)
        return self.stopped_at is None and age is not None and age <= self.STALE_AFTER


class AlertQuerySet(OwnedQuerySet):
    owner_path = "target__webhook__owner"


class Alert(models.Model):
    """A notice to a webhook's owner that one of its targets needs attention."""

    class Kind(models.TextChoices):
        PAUSED = "paused", "Target paused itself"
        BREAKER = "breaker", "Circuit breaker stuck open"
        CERTIFICATE = "certificate", "Client certificate expiring"

    # At most one alert of each kind per target in this long.
    INTERVAL = 3600

    target = models.ForeignKey(Target, models.CASCADE, related_name="alerts")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    message = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)
    # How each channel went: "" (not used), "sent", or the error.
    email = models.CharField(max_length=500, blank=True)
    slack = models.CharField(max_length=500, blank=True)

    objects = AlertQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # The one-per-hour check, and a target's alerts in the admin.
            models.Index(fields=["target", "-created_at"], name="alert_target_created_idx"),
        ]

    def __str__(self):
        return f"{self.get_kind_display()}: {self.target_id}"


class ApiKeyQuerySet(OwnedQuerySet):
    owner_path = "user"

    def usable(self, now):
        """Keys that may authenticate at `now`: not revoked, not expired."""
        return self.filter(
            models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=now),
            revoked_at__isnull=True,
        )

    def find(self, key: str, now) -> "ApiKey | None":
        """The usable key `key` is, with its user, or None."""
        if not key.startswith(ApiKey.PREFIX) or len(key) > 200:
            return None
        # Looked up by digest: what the index compares is a hash the caller cannot
        # steer, so the comparison's timing tells nothing about stored keys.
        return self.usable(now).select_related("user").filter(digest=ApiKey.digest_of(key)).first()

    def revoke(self) -> int:
        return self.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())


class ApiKey(Audited, models.Model):
    """A user's key to the REST API: it acts as its user, under the same ownership
    rule as the admin. Only a SHA-256 digest is stored: the key is 256 random bits,
    so a slow password hash would add nothing but a cost to every API request."""

    PREFIX = "whk_"
    # last_used_at is written at most this often per key, so a busy script's reads
    # do not each become a write.
    TOUCH_EVERY = datetime.timedelta(minutes=1)

    user = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=200, help_text="What the key is for, e.g. 'terraform'.")
    prefix = models.CharField(
        max_length=16, editable=False, help_text="The key's first characters, to recognise it."
    )
    digest = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty: never expires.")
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = ApiKeyQuerySet.as_manager()

    class Meta:
        verbose_name = "API key"
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"

    @staticmethod
    def digest_of(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()

    def set_new_key(self) -> str:
        """Give this (unsaved) row a new random key; return the key, which is not
        stored anywhere and so can be shown only now."""
        key = self.PREFIX + secrets.token_urlsafe(32)
        self.prefix = key[: len(self.PREFIX) + 6]
        self.digest = self.digest_of(key)
        return key

    def touch(self, now) -> None:
        """Record a use, at most once per TOUCH_EVERY, with an UPDATE that cannot
        overwrite a revocation or a rename made meanwhile."""
        if self.last_used_at is not None and now - self.last_used_at < self.TOUCH_EVERY:
            return
        ApiKey.objects.filter(pk=self.pk).filter(
            models.Q(last_used_at__isnull=True) | models.Q(last_used_at__lt=now - self.TOUCH_EVERY)
        ).update(last_used_at=now)
        self.last_used_at = now

    def state(self, now) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"


class IdempotentRequest(models.Model):
    """An API POST sent with an `Idempotency-Key`, and what it answered: the same key
    and request again within KEPT answer the same, with no second effect; the same
    key with another request is refused (deliveries/api/idempotency.py)."""

    KEPT = datetime.timedelta(hours=24)

    user = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    # SHA-256 of the method, the path and the body: what "the same request" means.
    fingerprint = models.CharField(max_length=64)
    # None while the first request is still being answered.
    status_code = models.PositiveSmallIntegerField(null=True)
    response = models.BinaryField(default=b"")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "key"], name="idempotent_request_uniq"),
        ]
        indexes = [models.Index(fields=["created_at"], name="idempotent_created_idx")]

    def __str__(self):
        return self.key


class ReplayJobQuerySet(OwnedQuerySet):
    owner_path = "webhook__owner"

    def active(self):
        return self.filter(state__in=ReplayJob.ACTIVE)


class ReplayJob(models.Model):
    """Send again what a webhook received in a time range (deliveries/replays.py).

    Run by the engines, never in a web request: the engine owning partition
    `id % DELIVERY_PARTITIONS` plans it (one ReplayItem per delivery to send, in
    batches), and each item is queued by the engine owning its target's
    partition, at most REPLAY_WINDOW of a job's deliveries per target at a time, so
    pause and cancel take effect within one window and the target's rate limit and
    breaker pace the job.
    """

    class State(models.TextChoices):
        PLANNING = "planning"
        RUNNING = "running"
        PAUSED = "paused"
        CANCELLED = "cancelled"
        DONE = "done"

    ACTIVE = (State.PLANNING, State.RUNNING)
    FINISHED = (State.CANCELLED, State.DONE)

    webhook = models.ForeignKey(Webhook, models.CASCADE, related_name="replays")
    # Events received at or after `since` and before `until`.
    since = models.DateTimeField()
    until = models.DateTimeField()
    # Only the deliveries to this target (None: to any target of the webhook)...
    target = models.ForeignKey(Target, models.CASCADE, null=True, blank=True, related_name="+")
    # ... in these statuses ([]: every finished one; with to_target, any).
    statuses = models.JSONField(default=list, blank=True)
    # None: each matched delivery is sent again to its own target. A target: each
    # matched event is sent to it (a delivery created for it, or set back).
    # (Deleting either target deletes the job: without it the job would select
    # something else than it was asked to.)
    to_target = models.ForeignKey(
        Target, models.CASCADE, null=True, blank=True, related_name="replays_to"
    )
    state = models.CharField(max_length=16, choices=State.choices, default=State.PLANNING)
    # The counts: planned, handed to the engine, and how those ended. `skipped`:
    # already on its way (pending or retrying) when its turn came.
    matched = models.PositiveIntegerField(default=0)
    queued = models.PositiveIntegerField(default=0)
    delivered = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    filtered = models.PositiveIntegerField(default=0)
    skipped = models.PositiveIntegerField(default=0)
    # Planning goes in batches, each in its own transaction: the last (event,
    # target) planned, which the next batch starts after.
    plan_event = models.BigIntegerField(default=0)
    plan_target = models.BigIntegerField(default=0)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    planned_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = ReplayJobQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(
                fields=["state"],
                name="replay_active_idx",
                condition=models.Q(state__in=["planning", "running"]),
            ),
        ]

    def __str__(self):
        return f"replay {self.pk}"

    def is_over(self) -> bool:
        """Done, or cancelled with nothing left on its way. At most one query."""
        if self.state == self.State.DONE:
            return True
        return (
            self.state == self.State.CANCELLED
            and not self.items.filter(state=ReplayItem.State.QUEUED).exists()
        )


class ReplayItem(models.Model):
    """One delivery a replay job sends: waiting its turn, queued (set back to
    pending or created), then done with how it ended. Deleted with its job's event,
    delivery or target."""

    class State(models.IntegerChoices):
        WAITING = 0
        QUEUED = 1
        DONE = 2

    job = models.ForeignKey(ReplayJob, models.CASCADE, related_name="items", db_index=False)
    event = models.ForeignKey(Event, models.CASCADE, related_name="+")
    target = models.ForeignKey(Target, models.CASCADE, related_name="+", db_index=False)
    # None until queued, for an event that had no delivery to the job's to_target.
    delivery = models.ForeignKey(Delivery, models.CASCADE, null=True, related_name="+")
    state = models.PositiveSmallIntegerField(choices=State.choices, default=State.WAITING)
    # delivered, failed, filtered (the delivery's end) or skipped.
    outcome = models.CharField(max_length=16, blank=True, default="")

    class Meta:
        indexes = [
            # A job's items by state and target, in the order they are queued.
            models.Index(fields=["job", "state", "target", "id"], name="replay_item_idx"),
            models.Index(fields=["target"], name="replay_item_target_idx"),
        ]

    def __str__(self):
        return f"replay item {self.pk}"

"""The audit log: who created, changed or deleted a webhook, an entrypoint, a target,
an API key or a user, when, from where and how (django-auditlog's LogEntry rows).

Registered here (apps.ready), recorded by django-auditlog's signals whatever saves
the row — the console, the API, a command — and stamped by AuditMiddleware: the
user (for an API call, the key's user, known only once DRF authenticated it: the
actor is read when the entry is written), the client's address as
TrustedProxyMiddleware decided it (auditlog's own middleware believes any
X-Forwarded-For), and the request id as the entry's correlation id. Each entry
also keeps its object's owner, so a user sees the entries about their own objects
after the objects are gone, and the API key used, if any.

Secrets never reach an entry: encrypted fields and key digests are masked (mask).
Updates through QuerySet.update() send no signals; the few user actions that take
that path (rotating a signing secret, pausing, resuming) log themselves (record).
"""

from __future__ import annotations

import ast
import datetime

from auditlog.middleware import AuditlogMiddleware
from auditlog.models import LogEntry
from auditlog.registry import auditlog
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone
from django.utils.functional import SimpleLazyObject

from deliveries import targets
from deliveries.targets.base import MASK, mask_url
from deliveries.verification import PRESETS
from webhooker import request_context

# The settings of the verification presets that are secrets.
VERIFICATION_SECRETS = {key for preset in PRESETS.values() for key in preset.secret_keys}


def mask(value: str) -> str:
    """A secret field's value as an entry shows it: a config with its credentials
    masked as the API shows them, a URL with its password and path masked, any
    other value masked whole. Only whether it changed is told."""
    if not value:
        return value
    if value.startswith(("http://", "https://")):
        return mask_url(value, path=True)
    # Only a config (a dict's repr) is read: a secret is never run through Python's
    # parser, which warns on stderr about one that begins like "5jor…".
    if not value.startswith("{"):
        return MASK
    try:
        config = ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return MASK
    if not isinstance(config, dict):
        return MASK
    shown = targets.shown_config(config)
    return repr({k: MASK if k in VERIFICATION_SECRETS and v else v for k, v in shown.items()})


def register(Webhook, Entrypoint, Target, ApiKey) -> None:
    """Record these models' rows, and users' (apps.ready, once models are loaded)."""
    masked = {"mask_callable": "deliveries.audit.mask"}
    # Written by the engine or by every save: noise, not changes.
    auditlog.register(Webhook, exclude_fields=["updated_at"], mask_fields=["alert_url"], **masked)
    auditlog.register(Entrypoint, mask_fields=["verification_config"], **masked)
    auditlog.register(
        Target,
        exclude_fields=["updated_at", "failing_since"],
        mask_fields=["config", "signing_secret", "previous_signing_secret"],
        **masked,
    )
    auditlog.register(ApiKey, exclude_fields=["last_used_at"], mask_fields=["digest"], **masked)
    auditlog.register(get_user_model(), exclude_fields=["password", "last_login"])


def owner_of(instance) -> int | None:
    """The id of the user whose object `instance` is (None: a user row, or gone)."""
    for path in ("owner_id", "user_id"):
        if hasattr(instance, path):
            return getattr(instance, path)
    try:
        return instance.webhook.owner_id
    except Exception:
        return None


def additional_data(instance) -> dict:
    """What an entry keeps beside auditlog's columns (models' get_additional_data)."""
    data = {"owner": owner_of(instance)}
    api_key = request_context.api_key.get()
    if api_key:
        data["api_key"] = api_key
    return data


class Audited:
    """A model whose entries keep additional_data() (django-auditlog asks each row)."""

    def get_additional_data(self) -> dict:
        return additional_data(self)


def request_id() -> str | None:
    """The entry's correlation id: the request's id (AUDITLOG_CID_GETTER)."""
    return request_context.request_id.get()


def record(instance, changes: dict) -> None:
    """An entry for a change saved without save() (QuerySet.update()): `changes` as
    {field: [before, after]}, secrets already masked by the caller."""
    LogEntry.objects.log_create(
        instance,
        force_log=True,
        action=LogEntry.Action.UPDATE,
        changes=changes,
        additional_data=additional_data(instance),
    )


def visible_to(user):
    """The entries `user` may read: all for a superuser, else those about their own
    objects (kept with the entry) and those they made."""
    from django.db.models import Q

    entries = LogEntry.objects.all()
    if user.is_superuser:
        return entries
    return entries.filter(Q(additional_data__owner=user.pk) | Q(actor=user))


def prune(now=None) -> int:
    """Delete the entries older than AUDIT_RETENTION_DAYS; how many went."""
    now = now or timezone.now()
    cutoff = now - datetime.timedelta(days=settings.AUDIT_RETENTION_DAYS)
    return LogEntry.objects.filter(timestamp__lt=cutoff).delete()[0]


class AuditMiddleware(AuditlogMiddleware):
    """auditlog's middleware, but: not on the inbound path (it changes nothing
    audited, and connecting a signal per request is not free); the address as
    TrustedProxyMiddleware left it; the actor read when an entry is written."""

    INBOUND = "/webhook/"

    def __call__(self, request):
        if request.path_info.startswith(self.INBOUND):
            return self.get_response(request)
        return super().__call__(request)

    @staticmethod
    def _get_remote_addr(request):
        return request.META.get("REMOTE_ADDR")

    @staticmethod
    def _get_remote_port(request):
        return None

    @staticmethod
    def _get_actor(request):
        user_model = get_user_model()

        def actor():
            user = getattr(request, "user", None)
            return user if isinstance(user, user_model) and user.is_authenticated else None

        return SimpleLazyObject(actor)

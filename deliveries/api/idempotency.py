"""`Idempotency-Key` on every POST of the API (as Svix and Stripe have it): a client
that retries a POST whose answer it lost sends the same key, and gets the first
answer again, with no second effect. The same key with another method, path or
body is a 422; while the first is still being answered, a 409. Keys are the user's,
kept for IdempotentRequest.KEPT (retention.prune_events deletes older ones); an
answer of 500 or more is not kept (the request may be sent again as new)."""

import datetime
import hashlib
import re

from django.db import IntegrityError, transaction
from django.http import HttpResponse
from django.utils import timezone
from rest_framework import exceptions, status

from deliveries.models import IdempotentRequest

HEADER = "Idempotency-Key"
# A first request with no answer after this long never finished: its key is taken
# over (longer than any request is let run: gunicorn's timeout is 30 s).
ABANDONED = datetime.timedelta(minutes=2)
# Printable ASCII, as Stripe's: a UUID, or anything a client makes of its own.
KEY = re.compile(r"[\x21-\x7e]{1,255}\Z")


class Replayed(exceptions.APIException):
    """Not an error: the first answer to this key, answered again (see handle())."""

    def __init__(self, record: IdempotentRequest):
        super().__init__()
        self.record = record


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = f"A request with this {HEADER} is still being answered; try again shortly."


class Mismatch(exceptions.APIException):
    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    default_detail = f"This {HEADER} was used with another request (method, path or body)."


def begin(request) -> IdempotentRequest | None:
    """Before a POST is answered: None without a key; the new record to complete;
    or Replayed, Conflict, Mismatch raised."""
    key = request.headers.get(HEADER)
    if request.method != "POST" or key is None:
        return None
    if not KEY.match(key):
        raise exceptions.ValidationError(
            {HEADER: ["1 to 255 printable ASCII characters, such as a UUID."]}
        )
    fingerprint = hashlib.sha256(
        b"\0".join([request.method.encode(), request.path.encode(), request.body])
    ).hexdigest()
    now = timezone.now()
    user = request.user
    IdempotentRequest.objects.filter(
        user=user, key=key, created_at__lt=now - IdempotentRequest.KEPT
    ).delete()
    try:
        with transaction.atomic():
            return IdempotentRequest.objects.create(
                user=user, key=key, fingerprint=fingerprint, created_at=now
            )
    except IntegrityError:
        pass
    found = IdempotentRequest.objects.filter(user=user, key=key).first()
    if found is None:  # its first request failed and let it go just now
        raise Conflict()
    if found.fingerprint != fingerprint:
        raise Mismatch()
    if found.status_code is None:
        if found.created_at < now - ABANDONED:
            # Its request never finished (the worker killed mid-request): the key
            # is this request's now, or a lost answer would block it for a day.
            found.created_at = now
            found.save(update_fields=["created_at"])
            return found
        raise Conflict()
    raise Replayed(found)


def complete(record: IdempotentRequest | None, response) -> None:
    """After the answer: keep it for the key, or let the key go (a 5xx)."""
    if record is None:
        return
    if response.status_code >= 500:
        record.delete()
        return
    response.render()
    record.status_code = response.status_code
    record.response = response.content
    record.save(update_fields=["status_code", "response"])


def replay(record: IdempotentRequest) -> HttpResponse:
    response = HttpResponse(
        bytes(record.response), status=record.status_code, content_type="application/json"
    )
    response["Idempotent-Replayed"] = "true"
    return response


def abandon(record: IdempotentRequest | None) -> None:
    """The request ended in an error nobody answered (a 500): the key is free."""
    if record is not None:
        IdempotentRequest.objects.filter(pk=record.pk).delete()

import functools
import logging
import time

from django.conf import settings
from django.db import OperationalError
from django.http import Http404, HttpResponseNotAllowed, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from deliveries import ingest, metrics, tracing, verification
from deliveries.models import Rejection
from deliveries.request_body import BodyMalformed, BodyTooLarge, read_body
from webhooker import encryption
from webhooker.request_context import GONE, RAW_HEADERS

logger = logging.getLogger(__name__)

# Seconds a sender is asked to wait when the database cannot take its event (a
# full disk, a writer lock not had in time): long enough for an operator or the
# stalled writer, short enough that senders' own retries are not wasted.
UNAVAILABLE_RETRY_AFTER = 30

# Set by the server, never sent by the client: these describe the request.
_HEADER_KEYS = ("CONTENT_TYPE", "CONTENT_LENGTH")


def _unavailable_is_503(view):
    """A database that cannot store the event right now is the service being
    unavailable, not a bug: 503 with Retry-After and one log line, no traceback."""

    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):
        try:
            return view(request, *args, **kwargs)
        except OperationalError as exc:
            logger.warning("inbound event not stored, database unavailable: %s", exc)
            return _unavailable("temporarily unable to store events, retry later")

    return wrapper


def _unavailable(message):
    response = JsonResponse({"error": message}, status=503)
    response["Retry-After"] = str(UNAVAILABLE_RETRY_AFTER)
    # Logged by the caller if at all: Django would log every 5xx a second time.
    response._has_been_logged = True
    return response


# Times the inbound view decides again when its entrypoint changed under it.
ENTRYPOINT_READS = 3


@csrf_exempt
def receive(request, code):
    """POST /webhook/<code>, in its trace span (tracing.py) when tracing is on."""
    with tracing.inbound(request, "/webhook/{code}") as answered:
        response = _receive(request, code)
        answered(response.status_code)
        return response


@_unavailable_is_503
def _receive(request, code):
    """POST /webhook/<code>: store the event and its deliveries, then answer.

    The entrypoint may come from this process's memory (ingest.find_entrypoint):
    whatever is decided on it is decided again on a fresh read when storing finds
    it changed, and before a verification failure is answered.
    """
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    entrypoint = ingest.find_entrypoint(code)
    body = None
    for _ in range(ENTRYPOINT_READS):
        if entrypoint is None:
            raise Http404("No such entrypoint.")
        if not entrypoint.active:
            return JsonResponse({"error": "this entrypoint is inactive"}, status=410)
        if body is None:
            try:
                body = read_body(request, settings.WEBHOOKER_MAX_BODY_BYTES)
            except BodyTooLarge:
                return JsonResponse(
                    {"error": f"body exceeds {settings.WEBHOOKER_MAX_BODY_BYTES} bytes"},
                    status=413,
                )
            except BodyMalformed as exc:
                return JsonResponse({"error": str(exc)}, status=400)
        try:
            return _store(request, entrypoint, body)
        except ingest.EntrypointChanged:
            entrypoint = ingest.find_entrypoint(code, fresh=True)
    logger.warning("inbound event not stored, its entrypoint kept changing: %s", code)
    return _unavailable("the entrypoint is being changed, retry later")


def _store(request, entrypoint, body):
    header = _header_lookup(request.META)
    if entrypoint.verification != "none":
        if encryption.unreadable(entrypoint.verification_config):
            # Nothing stored, nothing rejected: the sender retries, and the event is
            # taken once the key is back (the entrypoint's page says what is wrong).
            logger.error(
                "entrypoint %s: its verification secret %s", entrypoint.id, encryption.PROBLEM
            )
            return _unavailable("this entrypoint cannot verify requests right now, retry later")
        try:
            verification.check(
                entrypoint.verification, entrypoint.verification_config, header, body, time.time()
            )
        except verification.Rejected as exc:
            if entrypoint.remembered:
                # Perhaps a secret changed a moment ago: decide on the row as it is.
                raise ingest.EntrypointChanged from exc
            return _reject(entrypoint, request, exc)
    gone = request.META.get(GONE)
    try:
        stored = ingest.store_event(
            entrypoint,
            method=request.method,
            headers=request_headers(request.META),
            query_string=_clean(request.META.get("QUERY_STRING", "")),
            body=body,
            content_type=_clean(request.META.get("CONTENT_TYPE", ""))[:255],
            remote_addr=request.META.get("REMOTE_ADDR"),
            provider_id=verification.provider_id(entrypoint.id_source, header, body)
            if entrypoint.id_source
            else "",
            dedup=entrypoint.dedup,
            gone=gone.is_set if gone is not None else None,
        )
    except ingest.SenderGone:
        # Nothing stored: the sender will retry. No one reads this answer, and under
        # a flood a log line for each would be a flood of its own.
        response = JsonResponse({"error": "the sender disconnected"}, status=499)
        response._has_been_logged = True
        return response
    if stored.duplicate:
        metrics.event_duplicate(entrypoint.webhook_code)
        return JsonResponse({"event": str(stored.code), "duplicate": True})
    metrics.event_received(entrypoint.webhook_code, len(body))
    return JsonResponse({"event": str(stored.code), "deliveries": stored.deliveries})


def _reject(entrypoint, request, exc):
    """401 with the reason, kept (the last Rejection.KEEP) and counted."""
    reason = str(exc)
    Rejection.objects.record(
        entrypoint.id, ingest.ip_or_none(request.META.get("REMOTE_ADDR")), reason
    )
    metrics.event_rejected(entrypoint.code)
    response = JsonResponse({"error": f"verification failed: {reason}"}, status=401)
    if exc.challenge:
        response["WWW-Authenticate"] = exc.challenge
    return response


def _header_lookup(environ):
    """A request header by name, as the verification presets ask for them."""

    def header(name: str) -> str | None:
        return environ.get("HTTP_" + name.upper().replace("-", "_"))

    return header


def request_headers(environ) -> list[list[str]]:
    """Every header line as received, in order, as [name, value].

    The edge (webhooker/server/) hands over the raw lines: repeated headers stay
    apart, names keep their spelling and names with "_" are kept. Without it
    (Django's test client, another WSGI server) the CGI variables are all there is.
    """
    raw = environ.get(RAW_HEADERS)
    if raw is not None:
        return [[_clean(name), _clean(value)] for name, value in raw]
    headers = []
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            name = key[5:]
        elif key in _HEADER_KEYS:
            name = key
        else:
            continue
        headers.append([_clean(_title(name.replace("_", "-"))), _clean(value)])
    return headers


def _title(name: str) -> str:
    # CGI variables have lost the names' spelling (HTTP names have no case); stored
    # and forwarded in the usual one.
    return "-".join(part.capitalize() for part in name.split("-"))


def _clean(text: str) -> str:
    # A NUL cannot be stored in PostgreSQL text or jsonb. Real servers refuse it in
    # headers already; anything that slips through is kept visibly, as U+FFFD.
    return text.replace("\x00", "\ufffd")

import time

from django.conf import settings
from django.http import Http404, HttpResponseNotAllowed, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from deliveries import ingest, metrics, verification
from deliveries.models import Rejection
from deliveries.request_body import BodyMalformed, BodyTooLarge, read_body

# Set by the server, never sent by the client: these describe the request.
_HEADER_KEYS = ("CONTENT_TYPE", "CONTENT_LENGTH")


@csrf_exempt
def receive(request, code):
    """POST /webhook/<code>: store the event and its deliveries, then answer."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    entrypoint = ingest.find_entrypoint(code)
    if entrypoint is None:
        raise Http404("No such entrypoint.")
    if not entrypoint.active:
        return JsonResponse({"error": "this entrypoint is inactive"}, status=410)
    try:
        body = read_body(request, settings.WEBHOOKER_MAX_BODY_BYTES)
    except BodyTooLarge:
        return JsonResponse(
            {"error": f"body exceeds {settings.WEBHOOKER_MAX_BODY_BYTES} bytes"}, status=413
        )
    except BodyMalformed as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    header = _header_lookup(request.META)
    if entrypoint.verification != "none":
        try:
            verification.check(
                entrypoint.verification, entrypoint.verification_config, header, body, time.time()
            )
        except verification.Rejected as exc:
            return _reject(entrypoint, request, exc)
    stored = ingest.store_event(
        entrypoint,
        method=request.method,
        headers=request_headers(request.META),
        body=body,
        content_type=_clean(request.META.get("CONTENT_TYPE", ""))[:255],
        remote_addr=request.META.get("REMOTE_ADDR"),
        provider_id=verification.provider_id(entrypoint.id_source, header, body)
        if entrypoint.id_source
        else "",
        dedup=entrypoint.dedup,
    )
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
    """Every header as the WSGI server presents it, in its order, as [name, value]."""
    headers = []
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            name = key[5:]
        elif key in _HEADER_KEYS:
            name = key
        else:
            continue
        headers.append([_clean("-".join(p.capitalize() for p in name.split("_"))), _clean(value)])
    return headers


def _clean(text: str) -> str:
    # A NUL cannot be stored in PostgreSQL text or jsonb. Real servers refuse it in
    # headers already; anything that slips through is kept visibly, as U+FFFD.
    return text.replace("\x00", "\ufffd")

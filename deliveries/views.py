from django.conf import settings
from django.http import Http404, HttpResponseNotAllowed, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from deliveries import ingest, metrics
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
    stored = ingest.store_event(
        entrypoint,
        method=request.method,
        headers=request_headers(request.META),
        body=body,
        content_type=_clean(request.META.get("CONTENT_TYPE", ""))[:255],
        remote_addr=request.META.get("REMOTE_ADDR"),
    )
    metrics.event_received(entrypoint.webhook_code, len(body))
    return JsonResponse({"event": str(stored.code), "deliveries": stored.deliveries})


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

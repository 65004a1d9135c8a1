"""Operators' endpoints: /metrics and /.well-known/healthcheck."""

import base64
import hmac

from django.conf import settings
from django.db import connection
from django.http import Http404, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from deliveries.models import EngineStatus


def _authorized(request) -> bool:
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        username, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
    except ValueError:  # not base64, not ASCII, not UTF-8 (binascii.Error included)
        return False
    # Both compared, in constant time, so timing says nothing about either.
    ok_user = hmac.compare_digest(username.encode(), settings.METRICS_USERNAME.encode())
    ok_pass = hmac.compare_digest(password.encode(), settings.METRICS_PASSWORD.encode())
    return ok_user and ok_pass


@require_GET
def metrics(request):
    if not (settings.METRICS_USERNAME and settings.METRICS_PASSWORD):
        raise Http404("metrics are off: set METRICS_USERNAME and METRICS_PASSWORD")
    if not _authorized(request):
        response = HttpResponse("authentication required\n", status=401)
        response["WWW-Authenticate"] = 'Basic realm="webhooker metrics"'
        return response
    from prometheus_client import CONTENT_TYPE_LATEST

    from deliveries.metrics import render

    return HttpResponse(render(), content_type=CONTENT_TYPE_LATEST)


@require_GET
def healthcheck(request):
    """200 when the database answers and every partition is held by an engine whose
    heartbeat is fresh, else 503 (saying which partitions are not)."""
    body = {"database": "ok"}
    healthy = True
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:
        connection.close()
        body["database"] = f"unreachable: {type(exc).__name__}"
        body["engine"] = {"running": None, "heartbeat_age_seconds": None}
        healthy = False
    else:
        now = timezone.now()
        coverage = EngineStatus.objects.coverage(now)
        engine = EngineStatus.objects.current()
        age = engine.heartbeat_age(now)
        healthy = coverage.complete
        body["engine"] = {
            "running": healthy,
            "heartbeat_age_seconds": round(age, 1) if age is not None else None,
            "pid": engine.pid,
            "partitions": coverage.partitions,
            "unheld_partitions": coverage.unheld,
            "engines": [
                {
                    "host": e.hostname,
                    "pid": e.pid,
                    "partitions": e.partitions,
                    "heartbeat_age_seconds": round(e.heartbeat_age(now), 1),
                    "channel_depth": e.channel_depth,
                    "inflight": e.inflight,
                    "busy_workers": e.busy_workers,
                }
                for e in coverage.engines
            ],
        }
    body["status"] = "ok" if healthy else "unhealthy"
    return JsonResponse(body, status=200 if healthy else 503)

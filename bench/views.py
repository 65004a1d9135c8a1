"""Views the benchmarks compare against; routed only by bench.settings (bench/urls.py)."""

import uuid

from django.conf import settings
from django.db import transaction
from django.http import Http404, HttpResponseNotAllowed, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from deliveries import ingest
from deliveries.models import Delivery
from deliveries.request_body import read_body
from deliveries.views import request_headers


@csrf_exempt
def noop(request):
    """Django's own request handling: same middleware, body read, JSON answer."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    # The same request handling as the inbound view: body read, headers captured.
    read_body(request, settings.WEBHOOKER_MAX_BODY_BYTES)
    request_headers(request.META)
    return JsonResponse({"event": str(uuid.uuid4()), "deliveries": 0})


@csrf_exempt
def celery_receive(request, code):
    """The usual Django alternative: store, then hand each delivery to Celery."""
    from bench.celery_app import deliver

    entrypoint = ingest.find_entrypoint(code)
    if entrypoint is None:
        raise Http404("No such entrypoint.")
    body = read_body(request, settings.WEBHOOKER_MAX_BODY_BYTES)
    stored = ingest.store_event(
        entrypoint,
        method="POST",
        headers=request_headers(request.META),
        body=body,
        content_type=request.META.get("CONTENT_TYPE", ""),
        remote_addr=request.META.get("REMOTE_ADDR"),
    )
    ids = list(Delivery.objects.filter(event_id=stored.event_id).values_list("id", flat=True))
    transaction.on_commit(lambda: [deliver.delay(i) for i in ids])
    return JsonResponse({"event": str(stored.code), "deliveries": stored.deliveries})

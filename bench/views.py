"""Views the benchmarks compare against; routed only by bench.settings (bench/urls.py)."""

import os
import threading
import uuid
from pathlib import Path

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


class _SharedFsyncLog:
    """Append-only files, one per process, whose writers share fsyncs: each append
    returns once an fdatasync begun after its write has finished, and one thread's
    fdatasync covers every record written before it began, as a group commit does."""

    def __init__(self, directory: Path, prefix: str):
        self.directory = directory
        self.prefix = prefix
        self.fd = None
        self.lock = threading.Lock()
        self.synced_cond = threading.Condition(self.lock)
        self.written = 0
        self.synced = 0
        self.syncing = False

    def append(self, record: bytes) -> int:
        """Write the record; return its number once it is on disk."""
        with self.lock:
            if self.fd is None:
                path = self.directory / f"{self.prefix}-{os.getpid()}.log"
                self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.write(self.fd, len(record).to_bytes(4, "big") + record)
            self.written += 1
            mine = self.written
            while self.synced < mine:
                if self.syncing:
                    self.synced_cond.wait()
                    continue
                self.syncing, upto, synced = True, self.written, False
                self.lock.release()
                try:
                    os.fdatasync(self.fd)
                    synced = True
                finally:
                    self.lock.acquire()
                    self.syncing = False
                    if synced:
                        self.synced = upto
                    self.synced_cond.notify_all()
            return mine


_durable_log = _SharedFsyncLog(settings.DATA_DIR, "bench-durable-floor")


@csrf_exempt
def durable_floor(request):
    """The least any ingest that answers only after its event is durable could do
    through this server: the no-op view's work, plus the body appended to a file
    and fsynced (shared by concurrent requests) before the answer. No database, no
    entrypoint, no deliveries: `durable_floor_rps / noop_rps` bounds `ingest_ratio`
    from above on this machine."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    body = read_body(request, settings.WEBHOOKER_MAX_BODY_BYTES)
    request_headers(request.META)
    _durable_log.append(body)
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

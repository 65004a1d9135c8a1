"""OpenTelemetry (issue 30): a span for each inbound POST continuing the sender's
trace, its context stored with the event, a span for every attempt under it with the
target, the attempt number, the status code and the outcome, and the attempt's
traceparent sent to receivers — with the SDK's in-memory exporter, and through real
gunicorn and rundelivery processes to a local OTLP/HTTP receiver."""

import http.server
import threading

import pytest
from django.test import Client
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from deliveries import tracing
from deliveries.models import Delivery, Event, Target
from tests.support.engines import attempt_one, pump, started_engine
from tests.support.processes import start_engine, start_web, wait_until

SENDER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SENDER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{SENDER_TRACE}-{SENDER_SPAN}-01"


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    tracing.setup(exporter=exporter)
    yield exporter
    tracing.stop()


def post(entrypoint, **headers):
    response = Client().post(
        f"/webhook/{entrypoint.code}", b'{"id": 1}', content_type="application/json", **headers
    )
    assert response.status_code == 200, response.content
    return Event.objects.get(code=response.json()["event"])


def traceparents(sink) -> list:
    return [
        next((v for k, v in r.headers.items() if k.lower() == "traceparent"), None)
        for r in sink.requests("/in")
    ]


def named(exporter, name):
    return [span for span in exporter.get_finished_spans() if span.name == name]


@pytest.mark.django_db
def test_one_trace_from_the_senders_post_through_every_attempt(
    spans, entrypoint, make_target, sink
):
    sink.respond("/in", 500, 200)
    make_target(url=sink.url("/in"), max_retries=1)
    event = post(entrypoint, HTTP_TRACEPARENT=TRACEPARENT)

    (inbound,) = named(spans, "POST /webhook/{code}")
    assert format(inbound.context.trace_id, "032x") == SENDER_TRACE
    assert format(inbound.parent.span_id, "016x") == SENDER_SPAN
    assert inbound.attributes["http.response.status_code"] == 200
    # The event keeps the context its attempts continue.
    assert event.traceparent == f"00-{SENDER_TRACE}-{inbound.context.span_id:016x}-01"

    engine = started_engine()
    pump(engine, lambda: Delivery.objects.filter(status="delivered").exists())
    first, second = sorted(
        named(spans, "deliver http"), key=lambda s: s.attributes["webhooker.attempt"]
    )[:2]
    for span in (first, second):
        assert span.parent.span_id == inbound.context.span_id
        assert span.context.trace_id == inbound.context.trace_id
        assert span.attributes["webhooker.target"] == Target.objects.get().pk
    assert first.attributes["http.response.status_code"] == 500
    assert first.attributes["webhooker.outcome"] == "retrying"
    assert first.status.status_code.name == "ERROR" and first.attributes["error.type"] == "status"
    # The receiver was told which attempt it is, in the event's trace.
    assert traceparents(sink) == [
        f"00-{SENDER_TRACE}-{span.context.span_id:016x}-01" for span in (first, second)
    ]


@pytest.mark.django_db
def test_a_target_may_keep_the_senders_traceparent(spans, entrypoint, make_target, sink):
    make_target(url=sink.url("/in"), traceparent=False)
    post(entrypoint, HTTP_TRACEPARENT=TRACEPARENT)
    engine = started_engine()
    pump(engine, lambda: Delivery.objects.filter(status="delivered").exists())
    assert traceparents(sink) == [TRACEPARENT]


@pytest.mark.django_db
def test_without_tracing_nothing_is_stored_or_added(entrypoint, make_target, sink):
    make_target(url=sink.url("/in"))
    event = post(entrypoint)
    assert event.traceparent == ""
    attempt_one(entrypoint)
    assert traceparents(sink) == [None]


class Collector(http.server.BaseHTTPRequestHandler):
    """A local OTLP/HTTP receiver: keeps the span names it is sent."""

    names: list

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/v1/traces":
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    self.names.extend(
                        (
                            span.name,
                            span.trace_id.hex(),
                            dict((a.key, a.value) for a in span.attributes),
                        )
                        for span in scope.spans
                    )
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.django_db(transaction=True)
def test_real_processes_export_to_an_otlp_receiver(entrypoint, make_target, sink, data_dir):
    collector = type("C", (Collector,), {"names": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), collector)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    otel = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_SERVICE_NAME": "webhooker-test",
    }
    make_target(url=sink.url("/in"))
    web, base = start_web(data_dir, workers=1, **otel)
    engine = start_engine(data_dir, **otel)
    try:
        import requests

        answer = requests.post(
            f"{base}/webhook/{entrypoint.code}",
            json={"id": 1},
            headers={"traceparent": TRACEPARENT},
            timeout=10,
        )
        assert answer.status_code == 200
        wait_until(
            lambda: {"POST /webhook/{code}", "deliver http"} <= {n for n, _, _ in collector.names},
            timeout=30,
        )
        traces = {trace for _, trace, _ in collector.names}
        assert traces == {SENDER_TRACE}
    finally:
        engine.stop()
        web.stop()
        server.shutdown()
        server.server_close()

"""OpenTelemetry traces, when the optional extra is installed (`pip install
webhooker[otel]`) and an OTEL_* variable says where spans go (CONFIGURED_BY; off
with OTEL_SDK_DISABLED=true); every function here is a no-op otherwise, and costs
nothing.

One trace follows an event: a server span for its POST (a child of the sender's own
`traceparent` when it sent one), whose context the event stores (Event.traceparent),
and a span per delivery attempt, a child of that context, with the target, the
attempt number, the status code and the outcome; http targets send the attempt's
`traceparent` to the receiver (Target.traceparent, on by default), so the receiver's
own spans join the trace.

Configured by the standard variables: OTEL_SERVICE_NAME (default "webhooker"),
OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER(_ARG), OTEL_TRACES_EXPORTER (`otlp`,
the default, over HTTP: OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, _HEADERS, _TIMEOUT;
`console`; `none`). A tracer provider installed before Django starts (by
`opentelemetry-instrument`, say) is used as it is.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import time

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the extra is not installed
    trace = None

# Tracing starts once one of these says where spans go (OTel's own default, an
# OTLP receiver on localhost, would only log errors where none runs).
CONFIGURED_BY = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
)
_provider = None
_propagator = TraceContextTextMapPropagator() if trace is not None else None
# The traceparent of the inbound request this thread serves (its server span), for
# the event it stores.
current_traceparent: contextvars.ContextVar[str] = contextvars.ContextVar(
    "current_traceparent", default=""
)


def available() -> bool:
    return trace is not None and os.environ.get("OTEL_SDK_DISABLED", "").lower() != "true"


def setup(exporter=None) -> None:
    """Start tracing for this process (apps.ready): the provider installed already,
    else one of our own with the exporter OTEL_TRACES_EXPORTER names (`exporter`,
    an SDK exporter, in its place: tests)."""
    global _provider
    if not available():
        return
    installed = trace.get_tracer_provider()
    if exporter is None and not isinstance(installed, trace.ProxyTracerProvider):
        _provider = installed
        return
    if exporter is None and not any(os.environ.get(name) for name in CONFIGURED_BY):
        return  # installed, with nowhere to send spans: no tracing, nor its cost
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or "webhooker"})
    provider = TracerProvider(resource=resource)
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        chosen = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
        if chosen == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        elif chosen == "otlp":  # the default when only an endpoint is set
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if _provider is not None and hasattr(_provider, "shutdown"):
        _provider.shutdown()
    _provider = provider


def stop() -> None:
    """Stop tracing in this process (tests), exporting what is waiting."""
    global _provider
    provider, _provider = _provider, None
    if provider is not None and hasattr(provider, "shutdown"):
        provider.shutdown()


def flush() -> None:
    """Export what is waiting (before a process exits)."""
    if _provider is not None and hasattr(_provider, "force_flush"):
        _provider.force_flush()


def _tracer():
    return _provider.get_tracer("webhooker") if _provider is not None else None


@contextlib.contextmanager
def inbound(request, route: str):
    """A server span around an inbound request, continuing the sender's trace;
    its traceparent is current_traceparent while it runs. Yields a function that
    records the answer's status code."""
    tracer = _tracer()
    if tracer is None:
        yield lambda status: None
        return
    carrier = {
        name: request.headers[name]
        for name in ("traceparent", "tracestate")
        if name in request.headers
    }
    parent = _propagator.extract(carrier)
    with tracer.start_as_current_span(
        f"{request.method} {route}",
        context=parent,
        kind=trace.SpanKind.SERVER,
        attributes={"http.request.method": request.method, "http.route": route},
    ) as span:
        carried = {}
        _propagator.inject(carried)
        token = current_traceparent.set(carried.get("traceparent", ""))
        try:
            yield lambda status: span.set_attribute("http.response.status_code", status)
        finally:
            current_traceparent.reset(token)


class Attempt:
    """The span of one delivery attempt, a child of its event's stored context."""

    __slots__ = ("span",)

    def __init__(self, span):
        self.span = span

    def headers(self) -> dict:
        """traceparent (and tracestate) naming this attempt, for the receiver."""
        carried = {}
        _propagator.inject(carried, context=trace.set_span_in_context(self.span))
        return carried

    def end(self, outcome, status: str) -> None:
        span = self.span
        if outcome is not None:
            if outcome.status_code is not None:
                span.set_attribute("http.response.status_code", outcome.status_code)
            if not outcome.success:
                span.set_attribute("error.type", outcome.failure or "failed")
                span.set_status(trace.StatusCode.ERROR, outcome.error.split("\n", 1)[0][:200])
        span.set_attribute("webhooker.outcome", status)
        span.end()


def attempt(task) -> Attempt | None:
    """Start the span of the attempt `task` is about to make (None: not tracing)."""
    tracer = _tracer()
    if tracer is None:
        return None
    parent = _propagator.extract({"traceparent": task.traceparent}) if task.traceparent else None
    span = tracer.start_span(
        f"deliver {task.target.type}",
        context=parent,
        kind=trace.SpanKind.CLIENT
        if task.target.type in ("http", "slack")
        else trace.SpanKind.INTERNAL,
        start_time=time.time_ns(),
        attributes={
            "webhooker.event": str(task.event_code),
            "webhooker.delivery": task.delivery_id,
            "webhooker.target": task.target_id,
            "webhooker.target_type": task.target.type,
            "webhooker.attempt": task.attempts + 1,
        },
    )
    return Attempt(span)

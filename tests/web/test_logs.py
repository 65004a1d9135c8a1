"""LOG_FORMAT=json and SENTRY_DSN, in real processes."""

import gzip
import json
import subprocess
import sys

import pytest
import requests

from deliveries.models import Target
from tests.support.processes import ROOT, process_env, start_engine, start_web, wait_until


def json_lines(text: str) -> list[dict]:
    """Every log line, each one JSON object (rundelivery's own words to the
    operator at Ctrl+C are not log lines)."""
    return [
        json.loads(line)
        for line in text.splitlines()
        if line.strip() and not line.startswith("rundelivery: ")
    ]


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_json_logs_carry_the_delivery_and_the_event_as_fields(entrypoint, make_target, data_dir):
    make_target(Target.Type.LOG, name="log")
    web, base = start_web(data_dir, workers=1, LOG_FORMAT="json")
    engine = start_engine(data_dir, verbosity=1, LOG_FORMAT="json")
    try:
        event = requests.post(f"{base}/webhook/{entrypoint.code}", data=b"{}", timeout=10).json()
        code = event["event"]
        # Django's own lines too (its default console handler would print these plain).
        assert requests.get(f"{base}/no-such-page", timeout=10).status_code == 404
        assert requests.get(f"{base}/webhook/{entrypoint.code}", timeout=10).status_code == 405
        wait_until(lambda: code in engine.log(), message="the attempt's log line")
    finally:
        engine.stop()
        web.stop()
    lines = json_lines(engine.log())
    attempt = [e for e in lines if e.get("event") == code and "attempt=" in e["message"]]
    assert attempt and isinstance(attempt[0]["delivery"], int)
    assert {"time", "level", "logger", "message"} <= attempt[0].keys()
    assert json_lines(web.log())


SENTRY_PROBE = """
import logging, django, sentry_sdk
django.setup()
logging.getLogger("deliveries").error("probe for sentry")
sentry_sdk.flush(5)
"""


def sent_to_sentry(probe, sink, data_dir):
    """Run `probe` in a process with SENTRY_DSN pointing at `sink`: the one envelope
    it sent."""
    dsn = f"http://public@127.0.0.1:{sink.port}/1"
    subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        env=process_env(data_dir, SENTRY_DSN=dsn),
        check=True,
        timeout=60,
    )
    [envelope] = sink.wait_for(1)
    return envelope


@pytest.mark.django_db
def test_sentry_dsn_sends_errors_to_sentry(sink, data_dir):
    envelope = sent_to_sentry(SENTRY_PROBE, sink, data_dir)
    assert envelope.path.startswith("/api/1/envelope/")
    assert b"probe for sentry" in gzip.decompress(envelope.body)


SENTRY_SECRETS_PROBE = """
import django, sentry_sdk
django.setup()
from django.test import RequestFactory

def store(request):
    body = b"card 4111111111111111"
    raise RuntimeError("the store failed")

request = RequestFactory().post("/webhook/x?token=query-secret", data=b"{}",
                                content_type="application/json")
# What the Django integration attaches to an event raised in a request.
sentry_sdk.get_isolation_scope().add_event_processor(
    lambda event, hint: {**event, "request": {"url": "http://x/webhook/x",
                                              "query_string": "token=query-secret"}}
)
try:
    store(request)
except RuntimeError:
    sentry_sdk.capture_exception()
sentry_sdk.flush(5)
"""


@pytest.mark.django_db
def test_sentry_gets_no_payload_from_the_stack_or_the_request(sink, data_dir):
    """Events carry their senders' data: neither a traceback's local variables (a
    body, a request object) nor the request's query string is shipped to Sentry."""
    sent = gzip.decompress(sent_to_sentry(SENTRY_SECRETS_PROBE, sink, data_dir).body)
    assert b"the store failed" in sent
    assert b"4111111111111111" not in sent
    assert b"query-secret" not in sent
    assert b"http://x/webhook/x" in sent  # the request's other details still go

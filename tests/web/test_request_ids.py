"""Request ids (issue 30): every answer carries X-Request-Id, a sender's own kept when
it is sane; every log line written serving the request has it; an event stores it."""

import json
import logging

import pytest
from django.test import Client

from deliveries.logs import JsonFormatter, PlainFormatter
from deliveries.models import Event

pytestmark = pytest.mark.django_db


def test_an_inbound_event_keeps_the_senders_request_id(entrypoint, superuser):
    response = Client().post(
        f"/webhook/{entrypoint.code}",
        b'{"ok": true}',
        content_type="application/json",
        HTTP_X_REQUEST_ID="req-abc.123",
    )
    assert response.status_code == 200
    assert response["X-Request-Id"] == "req-abc.123"
    event = Event.objects.get()
    assert event.request_id == "req-abc.123"
    admin = Client()
    admin.force_login(superuser)
    page = admin.get(f"/admin/deliveries/event/{event.pk}/change/")
    assert "req-abc.123" in page.content.decode()


@pytest.mark.parametrize("given", ["", "has space", "x" * 129, 'quote"d', "é"])
def test_an_insane_or_missing_request_id_is_replaced(entrypoint, given):
    headers = {"HTTP_X_REQUEST_ID": given} if given else {}
    response = Client().post(
        f"/webhook/{entrypoint.code}", b"{}", content_type="application/json", **headers
    )
    made = response["X-Request-Id"]
    assert made != given and len(made) == 32 and int(made, 16) >= 0
    assert Event.objects.get().request_id == made


def test_every_answer_has_one_and_the_requests_log_lines_carry_it(caplog, db):
    with caplog.at_level(logging.WARNING, logger="django.request"):
        response = Client().get("/webhook/not-a-code/at-all", HTTP_X_REQUEST_ID="trace-42")
    assert response.status_code == 404
    assert response["X-Request-Id"] == "trace-42"
    (line,) = [r for r in caplog.records if r.name == "django.request"]
    assert line.request_id == "trace-42"
    assert PlainFormatter("%(message)s").format(line).endswith(" request_id=trace-42")
    assert json.loads(JsonFormatter().format(line))["request_id"] == "trace-42"


def test_lines_outside_a_request_carry_none():
    record = logging.getLogger("deliveries.engine").makeRecord(
        "deliveries.engine", logging.INFO, __file__, 1, "attempt", (), None
    )
    assert record.request_id is None
    assert "request_id" not in PlainFormatter("%(message)s").format(record)
    assert "request_id" not in json.loads(JsonFormatter().format(record))

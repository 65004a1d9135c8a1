"""POST /webhook/<code>: status codes, exact storage, atomicity."""

import json
import os
import uuid

import pytest
from django.db import connection
from django.test import Client

from deliveries.ingest import statements as queries
from deliveries.models import Delivery, Event, Target

pytestmark = pytest.mark.django_db


def post(client, entrypoint, body=b"{}", content_type="application/json", **extra):
    return client.generic(
        "POST", f"/webhook/{entrypoint.code}", body, content_type=content_type, **extra
    )


def test_stores_event_and_one_pending_delivery_per_active_target(client, entrypoint, make_target):
    a = make_target(url="http://example.com/a", name="a")
    b = make_target(Target.Type.LOG, name="b")
    make_target(url="http://example.com/c", name="c", active=False)

    response = post(client, entrypoint, b'{"id": 1}')

    assert response.status_code == 200
    data = response.json()
    event = Event.objects.get()
    assert data == {"event": str(event.code), "deliveries": 2}
    assert event.webhook_id == entrypoint.webhook_id
    assert event.entrypoint == entrypoint
    assert event.method == "POST"
    assert event.content_type == "application/json"
    assert event.remote_addr == "127.0.0.1"
    assert event.body_size == 9
    deliveries = Delivery.objects.order_by("target__name")
    assert [(d.target_id, d.status, d.attempts) for d in deliveries] == [
        (a.id, "pending", 0),
        (b.id, "pending", 0),
    ]


def test_webhook_without_active_targets_still_stores_the_event(client, entrypoint):
    response = post(client, entrypoint)
    assert response.status_code == 200
    assert response.json()["deliveries"] == 0
    assert Event.objects.count() == 1


def test_unknown_code_is_404(client, db):
    assert client.post(f"/webhook/{uuid.uuid4()}", b"{}", content_type="x/y").status_code == 404


def test_non_uuid_path_is_404(client, db):
    assert client.post("/webhook/not-a-uuid", b"{}", content_type="x/y").status_code == 404
    assert client.post("/webhook/13", b"{}", content_type="x/y").status_code == 404


def test_inactive_entrypoint_is_410_and_stores_nothing(client, entrypoint):
    entrypoint.active = False
    entrypoint.save()
    response = post(client, entrypoint)
    assert response.status_code == 410
    assert Event.objects.count() == 0


@pytest.mark.parametrize("method", ["GET", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "BREW"])
def test_other_methods_are_405_with_allow_post(client, entrypoint, method):
    response = client.generic(method, f"/webhook/{entrypoint.code}")
    assert response.status_code == 405
    assert response["Allow"] == "POST"
    assert Event.objects.count() == 0


def test_csrf_enforcing_client_is_accepted(entrypoint):
    client = Client(enforce_csrf_checks=True)
    response = post(client, entrypoint)
    assert response.status_code == 200


def test_body_exactly_at_limit_is_accepted(client, entrypoint, settings):
    settings.WEBHOOKER_MAX_BODY_BYTES = 1000
    body = os.urandom(1000)
    response = post(client, entrypoint, body, content_type="application/octet-stream")
    assert response.status_code == 200
    assert bytes(Event.objects.get().body) == body


def test_body_one_over_limit_is_413(client, entrypoint, settings):
    settings.WEBHOOKER_MAX_BODY_BYTES = 1000
    response = post(client, entrypoint, os.urandom(1001))
    assert response.status_code == 413
    assert Event.objects.count() == 0


class CountingStream:
    """A wsgi.input that counts what is read from it."""

    def __init__(self, data):
        self.data = data
        self.read_bytes = 0

    def read(self, size=-1):
        size = len(self.data) - self.read_bytes if size < 0 else size
        chunk = self.data[self.read_bytes : self.read_bytes + size]
        self.read_bytes += len(chunk)
        return chunk

    def readline(self, size=-1):
        return self.read(size)


def test_declared_oversize_body_is_refused_without_reading_it(client, entrypoint, settings):
    settings.WEBHOOKER_MAX_BODY_BYTES = 1000
    stream = CountingStream(b"x" * 5000)
    response = client.generic(
        "POST",
        f"/webhook/{entrypoint.code}",
        b"",
        CONTENT_LENGTH="5000",
        **{"wsgi.input": stream},
    )
    assert response.status_code == 413
    assert stream.read_bytes == 0


def test_chunked_body_over_limit_reads_at_most_limit_plus_one(client, entrypoint, settings):
    settings.WEBHOOKER_MAX_BODY_BYTES = 1000
    stream = CountingStream(b"x" * 500_000)
    environ = {"wsgi.input": stream, "wsgi.input_terminated": True, "CONTENT_LENGTH": ""}
    response = client.generic("POST", f"/webhook/{entrypoint.code}", b"", **environ)
    assert response.status_code == 413
    assert stream.read_bytes <= 1001
    assert Event.objects.count() == 0


def test_chunked_body_within_limit_is_stored(client, entrypoint, settings):
    settings.WEBHOOKER_MAX_BODY_BYTES = 1000
    stream = CountingStream(b"y" * 1000)
    environ = {"wsgi.input": stream, "wsgi.input_terminated": True, "CONTENT_LENGTH": ""}
    response = client.generic("POST", f"/webhook/{entrypoint.code}", b"", **environ)
    assert response.status_code == 200
    assert bytes(Event.objects.get().body) == b"y" * 1000


def test_body_shorter_than_content_length_is_400(client, entrypoint):
    stream = CountingStream(b"z" * 10)
    response = client.generic(
        "POST",
        f"/webhook/{entrypoint.code}",
        b"",
        CONTENT_LENGTH="100",
        **{"wsgi.input": stream},
    )
    assert response.status_code == 400
    assert Event.objects.count() == 0


@pytest.mark.parametrize(
    "body",
    [
        b"",
        os.urandom(4096),
        b"\xff\xfe\x00invalid \xc3\x28 utf-8 \xed\xa0\x80",
        os.urandom(1024 * 1024),
    ],
    ids=["empty", "random-binary", "invalid-utf8", "1MiB"],
)
def test_body_is_stored_byte_for_byte(client, entrypoint, body):
    response = post(client, entrypoint, body, content_type="application/octet-stream")
    assert response.status_code == 200
    event = Event.objects.get()
    assert event.read_body() == body
    assert event.body_size == len(body)


def test_every_header_is_stored_in_order(client, entrypoint):
    sent = [(f"X-Custom-{n}", f"value {n}") for n in range(30)]
    extra = {"HTTP_" + name.upper().replace("-", "_"): value for name, value in sent}
    extra["HTTP_X_GITHUB_EVENT"] = "push"
    response = post(client, entrypoint, b"{}", **extra)
    assert response.status_code == 200
    stored = Event.objects.get().headers
    custom = [tuple(pair) for pair in stored if pair[0].startswith("X-Custom-")]
    assert custom == sent
    assert ["X-Github-Event", "push"] in stored
    assert ["Content-Type", "application/json"] in stored


def test_delivery_creation_failure_leaves_no_event_and_answers_5xx(
    entrypoint, make_target, monkeypatch
):
    make_target(url="http://example.com/a")
    real_statements = queries.for_vendor

    def broken_delivery_table(vendor):
        # The deliveries INSERT fails in the database, after the event's succeeded.
        return {
            name: sql.replace(connection.ops.quote_name("deliveries_delivery"), "no_such_table")
            for name, sql in real_statements(vendor).items()
        }

    monkeypatch.setattr(queries, "for_vendor", broken_delivery_table)
    client = Client(raise_request_exception=False)
    response = post(client, entrypoint)
    assert response.status_code >= 500
    assert Event.objects.count() == 0
    assert Delivery.objects.count() == 0


def test_response_is_json(client, entrypoint):
    response = post(client, entrypoint)
    assert response["Content-Type"] == "application/json"
    json.loads(response.content)


def test_remote_address_is_the_sockets(client, entrypoint):
    post(client, entrypoint, REMOTE_ADDR="203.0.113.9", HTTP_X_FORWARDED_FOR="198.51.100.1")
    assert Event.objects.get().remote_addr == "203.0.113.9"

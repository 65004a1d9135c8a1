"""Whose fault (issue 28): every failed attempt, and every delivery that ends failed,
records the class of its failure — the receiver's (a status, a timeout, a refused
connection, DNS, TLS, an answer that is not HTTP) or ours (an address the guard
blocked, a transform, a configuration, a bug) — each produced for real here."""

import socket
import threading

import pytest
from django.test import Client

from deliveries.models import Delivery, DeliveryResult, Target
from deliveries.targets import TARGET_TYPES
from tests.support.api import client_of
from tests.support.engines import pump, started_engine, store

pytestmark = pytest.mark.django_db


@pytest.fixture
def garbage_server():
    """A listener that answers every request with bytes that are not HTTP."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    stop = threading.Event()

    def serve():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.recv(65536)
            conn.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(5)
    server.close()


def failed_with(entrypoint, target):
    """One event through `target` (fire-and-forget): its delivery, ended."""
    engine = started_engine()
    store(entrypoint)
    pump(engine, lambda: Delivery.objects.filter(target=target, status="failed").exists())
    delivery = Delivery.objects.get(target=target)
    (result,) = DeliveryResult.objects.filter(delivery=delivery)
    assert result.failure == delivery.failure
    return delivery.failure


def unchecked_target(webhook, **fields):
    """A target as the database may hold it, past the form's checks."""
    return Target.objects.create(webhook=webhook, name="t", max_retries=0, **fields)


def test_the_receivers_failures(entrypoint, make_target, sink, garbage_server):
    sink.always("/500", 500)
    sink.hanging.add("/hang")
    cases = {
        "status": {"url": sink.url("/500")},
        "timeout": {"url": sink.url("/hang"), "timeout": 0.3},
        "connection": {"url": "http://127.0.0.1:9/closed"},
        "dns": {"url": "http://nowhere.test/x"},
        "tls": {"url": sink.url("/plain").replace("http://", "https://")},
        "answer": {"url": f"http://127.0.0.1:{garbage_server}/x"},
    }
    try:
        for expected, config in cases.items():
            Target.objects.all().delete()
            target = make_target(config=config)
            assert failed_with(entrypoint, target) == expected, config
    finally:
        sink.hang.set()


def test_our_failures(entrypoint, webhook, monkeypatch):
    cases = {
        "blocked": {"type": "http", "config": {"url": "http://169.254.169.254/latest"}},
        "transform": {
            "type": "http",
            "config": {"url": "http://127.0.0.1:9/"},
            "transform": 'error("no")',
        },
        "config": {"type": "carrier-pigeon", "config": {}},
    }
    for expected, fields in cases.items():
        Target.objects.all().delete()
        target = unchecked_target(webhook, **fields)
        assert failed_with(entrypoint, target) == expected, fields

    def broken(self, task, body):
        raise RuntimeError("a bug")

    monkeypatch.setattr(type(TARGET_TYPES["http"]), "request", broken)
    Target.objects.all().delete()
    target = unchecked_target(webhook, type="http", config={"url": "http://127.0.0.1:9/"})
    assert failed_with(entrypoint, target) == "internal"


def test_a_retried_attempt_keeps_its_class_and_a_delivered_one_has_none(
    entrypoint, make_target, sink
):
    sink.respond("/flaky", 503)
    target = make_target(url=sink.url("/flaky"), max_retries=2, retry_schedule=[0.01])
    engine = started_engine()
    store(entrypoint)
    pump(engine, lambda: Delivery.objects.filter(target=target, status="delivered").exists())
    assert list(DeliveryResult.objects.order_by("attempt").values_list("failure", flat=True)) == [
        "status",
        "",
    ]
    assert Delivery.objects.get().failure == ""


def test_lists_filter_failed_deliveries_by_whose_fault(alice, entrypoint, make_target, webhook):
    webhook.owner = alice
    webhook.save()
    sink_target = make_target(config={"url": "http://127.0.0.1:9/closed"}, name="down")
    ours = unchecked_target(
        webhook, type="http", config={"url": "http://127.0.0.1:9/"}, transform='error("x")'
    )
    engine = started_engine()
    store(entrypoint)
    pump(engine, lambda: Delivery.objects.filter(status="failed").count() == 2)
    client = client_of(alice)
    by_receiver = client.get("/api/v1/deliveries/?fault=receiver").json()["results"]
    by_us = client.get("/api/v1/deliveries/?fault=ours").json()["results"]
    assert [d["target"] for d in by_receiver] == [sink_target.pk]
    assert [(d["target"], d["failure"]) for d in by_us] == [(ours.pk, "transform")]
    assert client.get("/api/v1/deliveries/?failure=connection").json()["results"][0]["target"] == (
        sink_target.pk
    )
    admin = Client()
    admin.force_login(alice)
    page = admin.get("/admin/deliveries/delivery/?fault=ours").content.decode()
    assert "whose fault" in page.lower()
    assert f"/admin/deliveries/delivery/{Delivery.objects.get(target=ours).pk}/" in page
    assert f"/admin/deliveries/delivery/{Delivery.objects.get(target=sink_target).pk}/" not in page

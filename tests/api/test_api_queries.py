"""List endpoints cost the same number of queries for 10 rows as for 1 000."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from deliveries.models import Delivery, DeliveryResult, Entrypoint, Event, Target, Webhook
from tests.support.api import client_of, fresh_throttle  # noqa: F401

pytestmark = pytest.mark.django_db


def grow(owner, n):
    """n rows of every kind for `owner`: webhooks (each with an entrypoint and a
    target), events and their deliveries with one attempt each."""
    start = Webhook.objects.count()
    hooks = Webhook.objects.bulk_create(
        Webhook(name=f"hook-{start + i}", owner=owner) for i in range(n)
    )
    entrypoints = Entrypoint.objects.bulk_create(Entrypoint(webhook=h) for h in hooks)
    targets = Target.objects.bulk_create(
        Target(webhook=h, name="t", type="http", config={"url": "https://example.com/"})
        for h in hooks
    )
    events = Event.objects.bulk_create(
        Event(webhook=h, entrypoint=e, method="POST", headers=[["A", "b"]], body=b"{}")
        for h, e in zip(hooks, entrypoints, strict=True)
    )
    deliveries = Delivery.objects.bulk_create(
        Delivery(event=e, target=t, status="failed", attempts=1)
        for e, t in zip(events, targets, strict=True)
    )
    DeliveryResult.objects.bulk_create(
        DeliveryResult(delivery=d, target_id=d.target_id, attempt=1, success=False)
        for d in deliveries
    )


def queries(client, path):
    with CaptureQueriesContext(connection) as captured:
        response = client.get(path, {"limit": 1000})
    assert response.status_code == 200, response.content
    return len(captured), len(response.json()["results"])


@pytest.mark.parametrize("route", ["webhooks", "entrypoints", "targets", "events", "deliveries"])
def test_lists_cost_the_same_for_10_and_1000_rows(route, alice):
    client = client_of(alice)
    client.get("/api/v1/webhooks/")  # the key's first use is written once a minute
    grow(alice, 10)
    few, listed = queries(client, f"/api/v1/{route}/")
    assert listed == 10
    grow(alice, 990)
    many, listed = queries(client, f"/api/v1/{route}/")
    assert listed == 1000
    assert many == few <= 3

"""Transforms on the running engine: each is handed to the worker processes and the
worker thread goes on (Engine.transform / transformed), so a runaway program holds
no thread and one target's slow transforms hold up no other target."""

import json

import pytest

from deliveries.models import Delivery, DeliveryResult
from tests.support.engines import RunningEngine, store
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

RUNAWAY_ON_THREE = "if .body.n == 3 then last(range(1e15)) else {body: {n: .body.n}} end"


def test_transforms_in_flight_end_each_delivery_once(entrypoint, make_target, sink, settings):
    settings.DELIVERY_TRANSFORM_TIMEOUT = 0.5
    shaped = make_target(url=sink.url("/shaped"), name="shaped", transform=RUNAWAY_ON_THREE)
    plain = make_target(url=sink.url("/plain"), name="plain")
    dropping = make_target(url=sink.url("/dropped"), name="dropping", transform="null")
    for n in range(12):
        store(entrypoint, body=json.dumps({"n": n}).encode())
    with RunningEngine(workers=2) as runner:
        wait_until(
            lambda: not Delivery.objects.unfinished().exists(),
            timeout=60,
            message="every delivery to end",
        )
        engine = runner.engine
        # Each result's task is let go after its COMMIT, on the writer's thread:
        # ownership drains to nothing, and nothing stays counted in flight.
        wait_until(
            lambda: engine.inflight.held() == 0 and engine.sender.in_flight() == 0,
            message="nothing owned or in flight",
        )

    statuses = dict(Delivery.objects.filter(target=shaped).values_list("event__body", "status"))
    assert sorted(statuses.values()) == ["delivered"] * 11 + ["failed"]
    (failed,) = DeliveryResult.objects.filter(delivery__target=shaped, success=False)
    assert failed.error == "transform failed: the transform ran longer than 0.5 s"
    assert sorted(json.loads(r.body)["n"] for r in sink.requests("/shaped")) == [
        n for n in range(12) if n != 3
    ]
    assert len(sink.requests("/plain")) == 12
    assert Delivery.objects.filter(target=plain, status="delivered").count() == 12
    assert Delivery.objects.filter(target=dropping, status="filtered").count() == 12
    assert sink.requests("/dropped") == []

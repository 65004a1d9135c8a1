"""The journey of the README's API section, over real HTTP: create a webhook with an
http target, post an event to its inbound URL, watch the delivery be delivered,
redeliver it, see two attempts. The running engine delivers to a real local sink."""

import io

import pytest
import requests
from django.core.management import call_command

from tests.support.engines import RunningEngine
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_api_journey(live_server, user, sink):
    out = io.StringIO()
    call_command("createapikey", user.username, "--name", "journey", stdout=out)
    key = out.getvalue().splitlines()[-1]
    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {key}"
    base = f"{live_server.url}/api/v1"

    webhook = api.post(f"{base}/webhooks/", json={"name": "orders"}).json()
    inbound = webhook["entrypoints"][0]["url"]
    assert inbound.startswith(live_server.url)
    target = api.post(
        f"{base}/targets/",
        json={
            "webhook": webhook["id"],
            "name": "shop",
            "type": "http",
            "config": {"url": sink.url("/orders")},
        },
    )
    assert target.status_code == 201, target.text

    with RunningEngine(workers=2):
        received = requests.post(inbound, json={"order": 1}, timeout=10).json()
        assert received["deliveries"] == 1

        def delivery():
            page = api.get(f"{base}/deliveries/", params={"event_code": received["event"]})
            [row] = page.json()["results"]
            return row

        wait_until(lambda: delivery()["status"] == "delivered", message="delivered")
        first = delivery()
        queued = api.post(f"{base}/deliveries/redeliver/", json={"ids": [first["id"]]}).json()
        assert queued == {"queued": 1, "matched": 1}

        def detail():
            return api.get(f"{base}/deliveries/{first['id']}/").json()

        wait_until(
            lambda: detail()["status"] == "delivered" and detail()["attempts"] == 2,
            message="delivered twice",
        )
    attempts = detail()["results"]
    assert [(a["attempt"], a["success"], a["status_code"]) for a in attempts] == [
        (1, True, 200),
        (2, True, 200),
    ]
    assert [r.body for r in sink.requests("/orders")] == [b'{"order": 1}'] * 2

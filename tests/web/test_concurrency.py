"""Many senders at once against real gunicorn workers on the real database file."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from deliveries.models import Delivery, Event, Target
from tests.support.processes import start_web

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]

EVENTS = 400
THREADS = 8


def test_concurrent_posts_all_stored(entrypoint, make_target, data_dir):
    make_target(url="http://example.com/a", name="a")
    make_target(Target.Type.LOG, name="b")
    web, base = start_web(data_dir, workers=3, WEB_THREADS=4)
    url = f"{base}/webhook/{entrypoint.code}"
    try:

        def send(n):
            with requests.Session() as session:
                return [
                    session.post(url, json={"n": i}, timeout=60) for i in range(n, EVENTS, THREADS)
                ]

        with ThreadPoolExecutor(THREADS) as pool:
            responses = [r for batch in pool.map(send, range(THREADS)) for r in batch]
    finally:
        web.stop()

    assert len(responses) == EVENTS
    assert {r.status_code for r in responses} == {200}
    codes = {r.json()["event"] for r in responses}
    assert len(codes) == EVENTS
    assert set(map(str, Event.objects.values_list("code", flat=True))) == codes
    assert Delivery.objects.filter(status="pending").count() == 2 * EVENTS
    assert "database is locked" not in web.log()
    assert "Traceback" not in web.log()

"""A signing secret rotated over the API of a real gunicorn, with a real rundelivery
delivering meanwhile: every event sent after the answer is signed with the new
secret (the race found from outside: some carried the old secret's alone)."""

import pytest
import requests
import standardwebhooks

from tests.support.api import key_for
from tests.support.processes import start_engine, start_web

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]

FAST = {"DELIVERY_POLL_INTERVAL": "0.2"}
ROUNDS = 8


def test_events_sent_after_rotate_secret_answers_are_signed_with_the_new_secret(
    user, entrypoint, make_target, sink, data_dir
):
    target = make_target(url=sink.url("/signed"))
    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {key_for(user)}"
    web, base = start_web(data_dir, **FAST)
    engine = start_engine(data_dir, **FAST)
    inbound = f"{base}/webhook/{entrypoint.code}"
    try:
        for n in range(ROUNDS):
            # The engine busy with the target, so its rows were just read.
            assert requests.post(inbound, json={"before": n}, timeout=30).status_code == 200
            sink.wait_for(2 * n + 1, "/signed")
            rotated = api.post(f"{base}/api/v1/targets/{target.pk}/rotate-secret/", timeout=30)
            secret = rotated.json()["signing_secret"]
            assert requests.post(inbound, json={"after": n}, timeout=30).status_code == 200
            after = sink.wait_for(2 * n + 2, "/signed")[-1]
            assert after.body == b'{"after": %d}' % n
            standardwebhooks.Webhook(secret).verify(after.body, after.headers, json_parse=False)
    finally:
        web.stop()
        engine.stop()
    assert "Traceback" not in engine.log()

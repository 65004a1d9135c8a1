"""Replay jobs with real processes: started and cancelled over the API of a real
gunicorn, run by a real rundelivery that is killed -9 mid-job, against a local sink."""

import signal
from collections import Counter

import pytest
import requests

from deliveries.models import Delivery, ReplayJob
from tests.support.api import key_for
from tests.support.history import OUTAGE_END, OUTAGE_START, outage
from tests.support.processes import start_engine, start_web, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]

WINDOW = 20
FAST = {
    "DELIVERY_POLL_INTERVAL": "0.2",
    "DELIVERY_BACKOFF_BASE": "0.05",
    "REPLAY_WINDOW": str(WINDOW),
}


def settled(sink):
    """Wait until what is on the wire has landed: the sink's count stops moving."""
    seen = [-1]

    def still():
        now = len(sink.requests())
        done, seen[0] = now == seen[0], now
        return done

    wait_until(still, timeout=10, interval=0.3, message="sink to settle")


def job_of(response) -> ReplayJob:
    assert response.status_code == 201, response.text
    return ReplayJob.objects.get(pk=response.json()["id"])


def test_a_job_survives_kill_9_and_cancel_stops_it_within_a_window(
    user, webhook, make_target, sink, data_dir
):
    a = make_target(url=sink.url("/a"), name="a", max_retries=3)
    events = outage(webhook, [a], n=1_500, outside=100)
    in_window = {str(e.code) for e in events}
    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {key_for(user)}"
    web, base = start_web(data_dir, **FAST)
    engine = start_engine(data_dir, **FAST)
    window = {"since": OUTAGE_START.isoformat(), "until": OUTAGE_END.isoformat()}
    try:
        asked = {"webhook": webhook.pk, **window, "target": a.pk, "statuses": ["failed"]}
        dry = api.post(f"{base}/api/v1/replays/", json={**asked, "dry_run": True}, timeout=30)
        assert dry.json() == {"matched": 1_500}
        job = job_of(api.post(f"{base}/api/v1/replays/", json=asked, timeout=30))

        wait_until(lambda: len(sink.requests()) >= 400, timeout=120, message="a third sent")
        engine.send(signal.SIGKILL)
        assert engine.wait() == -signal.SIGKILL
        settled(sink)
        # Sent but not recorded: exactly the attempts in flight at the kill.
        received = {r.headers["X-Webhooker-Event"] for r in sink.requests()}
        pending = {
            str(code)
            for code in Delivery.objects.unfinished().values_list("event__code", flat=True)
        }
        in_flight = len(received & pending)
        job.refresh_from_db()
        assert job.state == "running" and job.queued < 1_500, "the kill came too late"

        engine = start_engine(data_dir, **FAST)
        wait_until(
            lambda: (
                api.get(f"{base}/api/v1/replays/{job.pk}/", timeout=30).json()["state"] == "done"
            ),
            timeout=180,
            message="the job to finish",
        )
        shown = api.get(f"{base}/api/v1/replays/{job.pk}/", timeout=30).json()
        assert {k: shown[k] for k in ("matched", "queued", "delivered", "failed")} == {
            "matched": 1_500,
            "queued": 1_500,
            "delivered": 1_500,
            "failed": 0,
        }
        sent = Counter(r.headers["X-Webhooker-Event"] for r in sink.requests())
        assert set(sent) == in_window  # each one, and nothing outside the window
        assert sum(sent.values()) - len(sent) <= in_flight

        # A second job, to a new target that answers slowly: cancelled mid-way,
        # it stops queuing at once; what was queued (one window) still lands.
        b = make_target(url=sink.url("/b"), name="b", max_retries=3)
        sink.delays["/b"] = 0.05
        second = job_of(
            api.post(
                f"{base}/api/v1/replays/",
                json={"webhook": webhook.pk, **window, "to_target": b.pk},
                timeout=30,
            )
        )
        to_b = lambda: sum(1 for r in sink.requests() if r.path == "/b")  # noqa: E731
        wait_until(lambda: to_b() >= 3 * WINDOW, timeout=120, message="the second job going")
        cancelled = api.post(f"{base}/api/v1/replays/{second.pk}/cancel/", timeout=30)
        assert cancelled.json()["state"] == "cancelled"
        at_cancel = to_b()
        settled(sink)
        assert to_b() - at_cancel <= WINDOW
        wait_until(
            lambda: ReplayJob.objects.get(pk=second.pk).is_over(),
            timeout=60,
            message="what was queued to finish",
        )
        second.refresh_from_db()
        assert second.queued < second.matched == 1_500
        assert second.delivered == second.queued == to_b()
        assert engine.stop(signal.SIGTERM) == 0
    finally:
        web.stop()
        engine.stop(signal.SIGKILL)
    assert "Traceback" not in engine.log()

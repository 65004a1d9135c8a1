"""Prometheus metrics: right across gunicorn workers and the engine process."""

import pytest
import requests

from deliveries.models import Delivery, Event
from tests.support.metrics import value
from tests.support.processes import post_events, start_engine, start_web, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

AUTH = ("prometheus", "scrape-secret")
ENV = {"METRICS_USERNAME": AUTH[0], "METRICS_PASSWORD": AUTH[1], "DELIVERY_POLL_INTERVAL": "0.2"}


@pytest.mark.e2e
def test_counts_match_what_was_sent_across_workers_and_engine(
    entrypoint, make_target, sink, data_dir
):
    make_target(url=sink.url("/a"), name="a")
    make_target(url=sink.url("/fail"), name="fail")
    sink.always("/fail", 500)
    web, base = start_web(data_dir, workers=3, **ENV)
    engine = start_engine(data_dir, **ENV)
    try:
        post_events(base, entrypoint, 40)
        wait_until(
            lambda: not Delivery.objects.unfinished().exists(),
            timeout=60,
            message="deliveries to finish",
        )
        code = str(entrypoint.webhook.code)
        # Several scrapes, served by whichever worker: each sees the whole count.
        for _ in range(6):
            text = requests.get(f"{base}/metrics", auth=AUTH, timeout=10).text
            assert value(text, "webhooker_events_received_total", webhook=code) == 40
            assert value(text, "webhooker_event_body_bytes_count", webhook=code) == 40
            assert (
                value(
                    text,
                    "webhooker_delivery_attempts_total",
                    target_type="http",
                    outcome="delivered",
                )
                == 40
            )
            assert (
                value(
                    text, "webhooker_delivery_attempts_total", target_type="http", outcome="failed"
                )
                == 40
            )
            assert (
                value(text, "webhooker_delivery_attempt_duration_seconds_count", target_type="http")
                == 80
            )
            assert value(text, "webhooker_engine_up") == 1
            assert value(text, "webhooker_engine_channel_depth") is not None
        assert requests.get(f"{base}/metrics", timeout=10).status_code == 401
        assert (
            requests.get(f"{base}/metrics", auth=("prometheus", "wrong"), timeout=10).status_code
            == 401
        )
    finally:
        engine.stop()
        web.stop()


def test_metrics_are_off_without_credentials(client, settings):
    settings.METRICS_USERNAME = settings.METRICS_PASSWORD = ""
    assert client.get("/metrics").status_code == 404


def test_junk_authorization_is_refused_not_a_crash(client, settings):
    settings.METRICS_USERNAME, settings.METRICS_PASSWORD = AUTH
    for header in ("Basic é", "Basic !!!", "Basic " + "w6k=", "Bearer x", "Basic"):
        assert client.get("/metrics", HTTP_AUTHORIZATION=header).status_code == 401, header


@pytest.fixture
def full_filesystem(tmp_path):
    """A small tmpfs, filled to the last byte (root only: skipped otherwise)."""
    import subprocess

    mount = tmp_path / "full"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)]).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        with open(mount / "filler", "wb") as filler:
            try:
                while True:
                    filler.write(b"\0" * 65536)
                    filler.flush()
            except OSError:
                pass
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.e2e
def test_a_full_metrics_disk_costs_the_metrics_not_the_worker(
    entrypoint, data_dir, full_filesystem
):
    """prometheus-client's files are sparse: a counter written into a page with no
    block behind it on a full disk killed the worker with SIGBUS, after its event
    was committed and before the 200 (the sender, seeing the connection reset,
    sends a duplicate). Each process's files get their blocks first, or the
    process counts nothing."""
    web, base = start_web(data_dir, workers=1, PROMETHEUS_MULTIPROC_DIR=str(full_filesystem))
    try:
        answers = [
            requests.post(f"{base}/webhook/{entrypoint.code}", data=b"{}", timeout=10).status_code
            for _ in range(3)
        ]
        log = web.log()
    finally:
        web.stop()
    assert answers == [200, 200, 200]
    assert "SIGBUS" not in log
    assert Event.objects.count() == 3

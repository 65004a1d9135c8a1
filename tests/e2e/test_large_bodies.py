"""Twenty 9.9 MiB uploads at once beside 200 small events, through a real gunicorn
and a real rundelivery, on SQLite: the large bodies go to files beside the
database (deliveries/bodies.py), so the one writer never holds one of them, and
every small event is answered 200 (found from outside: small events waited 20 s
for the writer and 16 got 503)."""

import hashlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from django.db import connection

from deliveries.models import Event
from tests.support.processes import start_engine, start_web

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.e2e,
    pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's one writer"),
]

LARGE, LARGE_SIZE, SMALL = 20, int(9.9 * 1024 * 1024), 200
# Small events in flight at once: with the large ones, fewer than one web worker
# admits (WEB_THREADS + WEB_QUEUE), so a 503 here can only be the writer's.
SMALL_AT_ONCE = 10


def database_bytes() -> int:
    """The database file and its WAL."""
    name = str(connection.settings_dict["NAME"])
    return sum(os.path.getsize(p) for p in (name, name + "-wal") if os.path.exists(p))


def test_large_uploads_leave_the_writer_to_small_events(entrypoint, make_target, sink, data_dir):
    make_target(url=sink.url("/in"))
    web, base = start_web(data_dir, workers=3)
    engine = start_engine(data_dir, DELIVERY_POLL_INTERVAL="0.2")
    inbound = f"{base}/webhook/{entrypoint.code}"
    large = [bytes([n]) * LARGE_SIZE for n in range(LARGE)]
    small_answers, lock = [], threading.Lock()
    before = database_bytes()

    def send_large(body):
        # A worker's body budget (WEB_BODY_BUFFER) may refuse a large body with
        # Retry-After while others are held: a sender tries again, as senders do.
        for _ in range(60):
            answer = requests.post(inbound, data=body, timeout=120)
            if answer.status_code != 503:
                return answer.status_code
            time.sleep(0.5)
        return answer.status_code

    def send_small(n):
        answer = requests.post(inbound, json={"small": n}, timeout=120)
        with lock:
            small_answers.append((answer.status_code, answer.text[:80]))

    try:
        with ThreadPoolExecutor(LARGE) as big, ThreadPoolExecutor(SMALL_AT_ONCE) as little:
            large_done = [big.submit(send_large, body) for body in large]
            time.sleep(0.2)  # the large ones arriving
            list(little.map(send_small, range(SMALL)))
            assert [f.result() for f in large_done] == [200] * LARGE
        assert len(small_answers) == SMALL
        assert [a for a in small_answers if a[0] != 200] == []
        received = sink.wait_for(LARGE + SMALL, "/in", timeout=180)
    finally:
        web.stop()
        engine.stop()
    sizes = sorted(len(r.body) for r in received)
    assert sizes[-LARGE:] == [LARGE_SIZE] * LARGE
    digests = {hashlib.sha256(r.body).hexdigest() for r in received if len(r.body) == LARGE_SIZE}
    assert digests == {hashlib.sha256(body).hexdigest() for body in large}
    spilled = Event.objects.filter(body_file__isnull=False)
    assert spilled.count() == LARGE
    # 198 MiB arrived; the database and its WAL hold rows, not bodies.
    assert len(list((data_dir / "bodies").iterdir())) == LARGE
    assert database_bytes() - before < 50 * 1024 * 1024
    assert "Traceback" not in engine.log() and "Traceback" not in web.log()

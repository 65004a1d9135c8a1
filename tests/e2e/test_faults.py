"""The fault suite, short: about thirty faults into real processes on PostgreSQL
(tests/support/faults/suite.py). `make chaos` runs the long one and writes
docs/faults.md. The suite restarts PostgreSQL: a server of its own
(tests.support.postgres), so it runs beside the other tests."""

import os
from pathlib import Path

import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from tests.support.faults.proxy import Proxy
from tests.support.faults.suite import run
from tests.support.postgres import PrivateServer, binaries

pytestmark = pytest.mark.django_db(transaction=True)


def postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("the fault suite runs several engines: PostgreSQL")


def test_a_cut_lock_connection_fails_within_its_deadline():
    """A path that accepts and never answers (what the proxy's cut is): the lock
    connection's round trip fails within its deadline, not after the kernel's
    fifteen minutes, and a healed path carries the same connection on."""
    postgresql_only()
    import time

    from deliveries.engine.lock import open_raw_connection

    s = connection.settings_dict
    proxy = Proxy((s["HOST"] or "127.0.0.1", int(s["PORT"] or 5432)))
    original = dict(s)
    try:
        s.update(HOST="127.0.0.1", PORT=str(proxy.port))
        conn = open_raw_connection(deadline=1.0)
        s.update(original)
        assert conn.execute("SELECT 1").fetchone() == (1,)
        proxy.cut()
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
        assert time.monotonic() - started < 10  # a wide margin over the 1 s deadline
        proxy.heal()
        conn.close()
        s.update(HOST="127.0.0.1", PORT=str(proxy.port))
        again = open_raw_connection(deadline=1.0)
        s.update(original)
        proxy.cut()
        time.sleep(0.2)
        proxy.heal()  # a short cut: what was sent waits, nothing is lost
        assert again.execute("SELECT 2").fetchone() == (2,)
        again.close()
    finally:
        s.update(original)
        proxy.stop()


@pytest.mark.e2e
@pytest.mark.timeout(int(os.environ.get("CHAOS_TIMEOUT", "900")))
def test_faults_lose_nothing_and_duplicate_only_what_was_in_flight(data_dir):
    postgresql_only()
    if binaries() is None:
        pytest.skip("the suite restarts a PostgreSQL server of its own: no initdb here")
    faults = int(os.environ.get("CHAOS_FAULTS", "30"))
    with PrivateServer() as server, server.serving(connection):
        owner = get_user_model().objects.create_user("owner")
        report = run(
            owner,
            data_dir,
            faults=faults,
            interval=float(os.environ.get("CHAOS_INTERVAL", "3.0")),
            seed=int(os.environ.get("CHAOS_SEED", "1")),
            pg_restart=server.restart_command(),
            # make chaos times each isolated fault's hand-over: 15 s of calm after it.
            # make test records no timings, and its faults need no more than 5.
            quiet=float(os.environ.get("CHAOS_QUIET", "5")),
        )
    summary = report.markdown()
    print(summary)
    if os.environ.get("CHAOS_REPORT"):
        Path(os.environ["CHAOS_REPORT"]).write_text(report.page("make chaos"))
    assert sum(report.faults.values()) == faults
    assert report.failed == []
    assert report.acked > 0
    assert report.lost == []
    assert report.set_back == []
    assert report.two_results == []
    assert report.unexplained == []
    assert not any(report.order_violations.values()), report.order_violations

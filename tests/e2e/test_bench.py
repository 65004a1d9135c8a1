"""The benchmark scripts keep working: a tiny run, no assertions on speed."""

import os
import re
import shutil
import subprocess
import sys
import threading

import pytest
from django.db import connection

from tests.support.processes import ROOT

FIGURES = [
    "noop_rps",
    "ingest_rps",
    "ingest_ratio",
    "durable_floor_rps",
    "durable_floor_ratio",
    "noop_cpu_ms",
    "ingest_cpu_ms",
    "ingest_cpu_ratio",
    "durable_floor_cpu_ms",
    "durable_floor_cpu_ratio",
    "ingest_verified_rps",
    "ingest_ratio_verified",
    "ingest_p50_ms",
    "ingest_p99_ms",
    "delivery_rps",
    "http_ceiling_rps",
    "delivery_ratio",
    "instant_receiver_rps",
    "slow_receiver_rps",
    "slow_receiver_ratio",
    "engine_cpu_per_delivery_ratio",
    "engine_rss_mb_5k_inflight",
    "ordered_lane_ratio",
    "transform_ratio",
    "slow_senders_idle_p99_ms",
    "slow_senders_p99_ms",
    "slow_senders_p99_ratio",
    "slow_senders_ok_share",
    "flood_answered_rps",
    "flood_503_share",
    "flood_client_timeouts",
    "flood_recovery_s",
    "flood_unacked_stored",
    "prune_ingest_idle_p95_ms",
    "prune_ingest_p95_ms",
    "prune_ingest_p95_ratio",
    "prune_events_per_s",
    "e2e_p50_ms",
    "e2e_p99_ms",
    "e2e_sustained_rps",
    "e2e_load_p50_ms",
    "e2e_load_p99_ms",
    "engine_rss_mb_10k",
    "celery_rps",
    "celery_e2e_p50_ms",
    "vs_celery_ratio",
]

# PostgreSQL only: many engines on one database (bench/scaleout.py).
SCALEOUT_FIGURES = [
    *(f"scaleout_{sink}_{n}_rps" for sink in ("slow", "instant") for n in (1, 2, 4)),
    "scaleout_ratio_4",
    "failover_s",
]


@pytest.mark.e2e
@pytest.mark.engines
@pytest.mark.timeout(600)
def test_make_bench_prints_every_figure_with_its_baseline():
    """On PostgreSQL only: its run goes through every script and phase SQLite's
    does, and scale-out besides; the same again on SQLite cost CI three minutes."""
    if connection.vendor != "postgresql":
        pytest.skip("run in make test on PostgreSQL, which runs every bench script")
    missing = [tool for tool in ("wrk", "nginx") if not shutil.which(tool)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (.ci/run installs them)")
    env = {**os.environ, "BENCH_SECONDS": "1", "BENCH_DATABASES": "pg", "BENCH_RECORD": "0"}
    env.pop("DATABASE_URL", None)
    env.pop("DATA_DIR", None)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    result = subprocess.run(
        [sys.executable, "bench/run.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for name in FIGURES + SCALEOUT_FIGURES:
        assert re.search(rf"^{name}_pg=\d+(\.\d+)?$", result.stdout, re.M), name


def test_the_durable_floor_answers_each_append_after_an_fsync_that_covers_it(tmp_path, monkeypatch):
    """The floor baseline does what it claims: every record written whole, and no
    append returns before an fdatasync begun after its write has finished."""
    from bench.views import _SharedFsyncLog

    log = _SharedFsyncLog(tmp_path, "floor")
    fsyncs = []
    real_fdatasync = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (fsyncs.append(fd), real_fdatasync(fd)))
    uncovered = []

    def sender(n):
        for i in range(50):
            number = log.append(f"{n}-{i}".encode())
            # synced only ever moves to the count written before an fsync began.
            if log.synced < number:
                uncovered.append(number)

    threads = [threading.Thread(target=sender, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    data = (tmp_path / f"floor-{os.getpid()}.log").read_bytes()
    records = []
    while data:
        size = int.from_bytes(data[:4], "big")
        records.append(data[4 : 4 + size].decode())
        data = data[4 + size :]
    assert sorted(records) == sorted(f"{n}-{i}" for n in range(8) for i in range(50))
    assert uncovered == []
    assert log.synced == 400
    # Concurrent appends shared fsyncs.
    assert len(fsyncs) < 400

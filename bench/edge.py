"""The inbound edge under hostile load, measured for bench/suite.py: slow senders,
a flood past capacity, a large prune, and the sustained end-to-end rate.

All load goes to 127.0.0.1, bounded in connections and time.
"""

import contextlib
import http.client
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def percentile(values, p):
    values = sorted(values)
    if not values:
        return float("nan")
    k = max(0, min(len(values) - 1, round(p / 100 * (len(values) - 1))))
    return values[k]


def latencies(port, path, body, rate, seconds, threads=8, timeout=30.0):
    """Open-loop posts at `rate` per second: [(ms from the scheduled send, status)].

    Unlike suite.fixed_rate, a refusal (503) or a timeout is a result, not an error.
    """
    # Here, not at the top: the Trickler runs this file as a script, outside the package.
    from bench import load

    return load.open_loop(
        rate,
        seconds,
        threads=threads,
        lead=0.1,
        sender=lambda: _Poster(port, path, body, timeout),
    )


class _Poster:
    """One thread's connection; a failure is status 0, and a new connection next."""

    def __init__(self, port, path, body, timeout):
        self.port, self.path, self.body, self.timeout = port, path, body, timeout
        self.conn = None

    def __call__(self, due):
        try:
            self.conn = self.conn or http.client.HTTPConnection(
                "127.0.0.1", self.port, timeout=self.timeout
            )
            self.conn.request("POST", self.path, self.body, {"Content-Type": "application/json"})
            response = self.conn.getresponse()
            response.read()
            status = response.status
            if response.getheader("Connection", "").lower() == "close":
                self.close()
        except OSError:
            status = 0
            self.close()
        return (time.monotonic() - due) * 1000, status

    def close(self):
        if self.conn is not None:
            self.conn.close()
        self.conn = None


class Trickler:
    """`n` senders that send their headers, then one body byte a second each,
    reconnecting when the server gives up on them (its body deadline).

    They run in a process of their own (`python bench/edge.py trickle PORT PATH N`):
    in the measuring process their 500 sends a second would take the GIL from the
    threads timing the normal senders, and count against the server. Each sender
    has its own moment in the second (i/n), as independent clients would."""

    def __init__(self, port, path, n):
        self.args = [sys.executable, __file__, "trickle", str(port), path, str(n)]
        self.process = None

    def __enter__(self):
        self.process = subprocess.Popen(self.args, stdout=subprocess.PIPE, text=True)
        # A child that fails to connect exits, and readline then returns "".
        if self.process.stdout.readline().strip() != "connected":
            self.__exit__()
            raise RuntimeError("the slow senders could not connect")
        return self

    def __exit__(self, *exc):
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()


def trickle(port, path, n):
    """The slow senders' process (Trickler)."""

    def connect():
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Content-Length: 100000\r\n\r\n".encode()
        )
        return sock

    parent = os.getppid()
    socks = [connect() for _ in range(n)]
    print("connected", flush=True)
    while os.getppid() == parent:  # a bench killed outright leaves no sender behind
        started = time.monotonic()
        for i, sock in enumerate(socks):
            pause = started + i / n - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            try:
                sock.sendall(b" ")
            except OSError:
                sock.close()
                with contextlib.suppress(OSError):
                    socks[i] = connect()
        time.sleep(max(0.0, started + 1.0 - time.monotonic()))


def slow_senders(port, path, body, seconds, n=500, rate=50, rounds=2):
    """Normal senders' p99 with `n` slow senders connected, against it without.

    In interleaved rounds, each condition's samples pooled: a p99 of a few hundred
    samples is its few worst, and a stall of the machine (or of the disk's fsync)
    in one phase alone would otherwise decide the ratio."""
    idle, loaded = [], []
    for _ in range(rounds):
        idle += [ms for ms, status in latencies(port, path, body, rate, seconds / rounds)]
        with Trickler(port, path, n):
            loaded += latencies(port, path, body, rate, seconds / rounds)
    ok = sum(1 for _, status in loaded if status == 200)
    p99_idle = percentile(idle, 99)
    p99_loaded = percentile([ms for ms, _ in loaded], 99)
    return {
        "slow_senders_idle_p99_ms": p99_idle,
        "slow_senders_p99_ms": p99_loaded,
        "slow_senders_p99_ratio": p99_loaded / p99_idle,
        "slow_senders_ok_share": ok / len(loaded),
    }


def wrk_counts(url, seconds, body_file, connections, timeout="2s"):
    """A closed-loop wrk run that counts refusals instead of failing on them:
    (completed responses, non-2xx among them, timeouts)."""
    out = subprocess.run(
        [
            "wrk",
            "-t2",
            f"-c{connections}",
            f"-d{max(1, int(seconds))}s",
            "--timeout",
            timeout,
            "-s",
            str(ROOT / "bench/post.lua"),
            url,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "BENCH_BODY_FILE": str(body_file)},
        check=True,
    ).stdout
    done = int(re.search(r"(\d+) requests in", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    timeouts = re.search(r"timeout (\d+)", out)
    return done, int(non2xx.group(1)) if non2xx else 0, int(timeouts.group(1)) if timeouts else 0


def flood(port, path, body, seconds, count_events, connections=256):
    """wrk with `connections` connections as fast as they are answered, clients
    giving up after 2 s; then how long until a normal request is answered
    promptly again, and how many events were stored that no sender saw a 200 for."""
    body_file = Path(tempfile.mkstemp(suffix=".json")[1])
    body_file.write_bytes(body)
    before = count_events()
    try:
        done, refused, timeouts = wrk_counts(
            f"http://127.0.0.1:{port}{path}", seconds, body_file, connections
        )
    finally:
        body_file.unlink()
    ended = time.monotonic()
    probes_ok = 0
    recovered = None
    while time.monotonic() - ended < 60:
        ms, status = probe(port, path, body)
        probes_ok += status == 200
        if status == 200 and ms < 100:
            recovered = time.monotonic() - ended
            break
        time.sleep(0.02)
    # Requests the server had admitted when wrk stopped finish within the queue's
    # few tens of milliseconds; a second is ample before counting.
    time.sleep(1)
    stored = count_events() - before
    return {
        "flood_answered_rps": done / seconds,
        "flood_503_share": refused / max(done, 1),
        "flood_client_timeouts": timeouts,
        "flood_recovery_s": recovered if recovered is not None else float("inf"),
        "flood_unacked_stored": max(0, stored - (done - refused) - probes_ok),
    }


def probe(port, path, body, timeout=5.0):
    """One post on a new connection: (ms, status); status 0 if it failed."""
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        status = response.status
    except OSError:
        status = 0
    finally:
        conn.close()
    return (time.monotonic() - started) * 1000, status


def old_events(webhook, targets, n, body):
    """`n` delivered events past their webhook's retention, each with a delivery
    per target and two attempt results per delivery (the issue's proportions)."""
    import datetime

    from django.utils import timezone

    from bench.data import event_batches
    from deliveries.models import Delivery, DeliveryResult

    then = timezone.now() - datetime.timedelta(days=webhook.retention_days + 1)
    for events in event_batches(webhook, n, body, then):
        deliveries = Delivery.objects.bulk_create(
            Delivery(
                event=e, target=t, status="delivered", attempts=2, created_at=then, updated_at=then
            )
            for e in events
            for t in targets
        )
        DeliveryResult.objects.bulk_create(
            DeliveryResult(
                delivery=d,
                target_id=d.target_id,
                attempt=a,
                success=a == 2,
                status_code=500 if a == 1 else 200,
                created_at=then,
            )
            for d in deliveries
            for a in (1, 2)
        )


def prune_during_ingest(port, path, body, seconds, count_old, rate=100):
    """Inbound p95 while `manage.py pruneevents` deletes, against p95 without it.
    The backlog to prune is made by the caller beforehand; `count_old()` counts it.

    Measuring starts once the first batch is gone: the command's start (a Python
    process importing Django, a second of CPU on a 2-core machine) is not the prune.
    """
    idle = [ms for ms, _ in latencies(port, path, body, rate, seconds)]
    started = time.monotonic()
    prune = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "pruneevents"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    before = count_old()
    while count_old() == before and prune.poll() is None:
        time.sleep(0.05)
    during = latencies(port, path, body, rate, seconds)
    still_running = prune.poll() is None
    out, _ = prune.communicate(timeout=3600)
    prune_s = time.monotonic() - started
    pruned = int(re.search(r"Pruned (\d+) events", out).group(1))
    p95_idle = percentile(idle, 95)
    p95_during = percentile([ms for ms, _ in during], 95)
    return {
        "prune_ingest_idle_p95_ms": p95_idle,
        "prune_ingest_p95_ms": p95_during,
        "prune_ingest_p95_ratio": p95_during / p95_idle,
        "prune_events_per_s": pruned / prune_s,
        # 1: the prune outlasted the measurement, as it should for a fair figure.
        "prune_outlasted_measurement": float(still_running),
    }


def sustained_e2e(port, path, body, seconds, sink):
    """Events per second that go all the way to the sink while senders post as fast
    as they are answered (16 connections): accepted events over the time from the
    first post to the last receipt."""
    body_file = Path(tempfile.mkstemp(suffix=".json")[1])
    body_file.write_bytes(body)
    before = set(sink.receipts())
    started = time.time()
    try:
        done, refused, _ = wrk_counts(
            f"http://127.0.0.1:{port}{path}", seconds, body_file, 16, timeout="10s"
        )
    finally:
        body_file.unlink()
    accepted = done - refused
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        new = {c: t for c, t in sink.receipts().items() if c not in before}
        if len(new) >= accepted:
            break
        time.sleep(0.2)
    return len(new) / max(max(new.values(), default=started) - started, 1e-3)


if __name__ == "__main__" and sys.argv[1:2] == ["trickle"]:
    trickle(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))

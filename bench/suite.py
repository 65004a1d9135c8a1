"""Every benchmark figure for one database, each beside its baseline from the same run.

Run by bench/run.py once per database (DATABASE_URL picks it); prints name=value
lines. Everything runs on loopback: nginx as the sink, gunicorn as `make run`
configures it, rundelivery, a Celery worker on the local Redis.
"""

import hashlib
import hmac
import http.client
import itertools
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import typing
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The processes start as the end-to-end tests start them (tests/support/processes.py).
from bench import data, edge, inflight, load, scaleout  # noqa: E402
from tests.support.processes import Process, free_port, start_engine, start_web, wait_until  # noqa: E402

SECONDS = float(os.environ.get("BENCH_SECONDS", "10"))
# 1 KiB JSON, every benchmark's event body.
BODY = data.BODY
drained_rate = data.drained_rate
wait_delivered = data.wait_delivered


def log(message):
    print(f"# {message}", file=sys.stderr, flush=True)


class Nginx:
    """The sink: answers 200 at once, logs the receipt time of every event."""

    def __init__(self, data_dir):
        self.dir = data_dir / "nginx"
        self.dir.mkdir()
        self.port = free_port()
        self.log = self.dir / "received.log"
        temp = " ".join(
            f"{k}_temp_path {self.dir}/{k};"
            for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        (self.dir / "nginx.conf").write_text(f"""
worker_processes 1; daemon off; pid {self.dir}/nginx.pid; error_log {self.dir}/error.log;
events {{ worker_connections 4096; }}
http {{
  {temp}
  log_format recv '$msec $http_x_webhooker_event';
  server {{
    listen 127.0.0.1:{self.port} backlog=4096; client_max_body_size 20m;
    keepalive_requests 1000000; keepalive_timeout 120s;
    location / {{ access_log {self.log} recv buffer=256k flush=200ms; return 200 "ok"; }}
  }}
}}""")

    def start(self):
        argv = ["nginx", "-c", str(self.dir / "nginx.conf"), "-p", str(self.dir)]
        self.proc = Process(argv, os.environ, self.dir / "nginx.log")
        wait_until(lambda: _connectable(self.port), timeout=10, message="nginx")
        return self

    def url(self, path="/hook"):
        return f"http://127.0.0.1:{self.port}{path}"

    def receipts(self):
        """event code -> first receipt time (seconds since the epoch)."""
        seen = {}
        if self.log.exists():
            for line in self.log.read_text().splitlines():
                stamp, _, code = line.partition(" ")
                if code and code != "-":
                    seen.setdefault(code, float(stamp))
        return seen

    def stop(self):
        self.proc.stop(signal.SIGQUIT)


def _connectable(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


class Blackhole:
    """Accepts connections and never answers: deliveries to it stay in the engine."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self):
        self.sock.close()
        for conn in self.conns:
            conn.close()


def serve(data_dir):
    """gunicorn with `make run`'s workers; returns (process, port) once every worker is warm."""
    web, base = start_web(data_dir, workers=None)
    port = urlsplit(base).port
    # Warm every worker's connection and imports before measuring.
    for _ in range(30):
        _post(port, "/bench/noop", BODY)
    return web, port


def start_quiet_engine(data_dir):
    # Per-delivery log lines would cost the engine time the figures should not include.
    return start_engine(data_dir, verbosity=0)


def _post(port, path, body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data


# The GitHub secret of the verified ingest benchmark's entrypoint.
GITHUB_SECRET = "bench-github-secret"
_runs = itertools.count()


def signed():
    """wrk's environment for GitHub-signed posts, each with its own delivery id."""
    signature = hmac.new(GITHUB_SECRET.encode(), BODY, hashlib.sha256).hexdigest()
    return {"BENCH_SIGNATURE": f"sha256={signature}", "BENCH_RUN": str(next(_runs))}


class Load(typing.NamedTuple):
    """A wrk run: requests answered per second, and the machine's CPU per request."""

    rps: float
    # Milliseconds of CPU the whole machine (server, database, wrk) spent busy per
    # request, not counting time the hypervisor gave to other guests (steal).
    cpu_ms: float


def busy_jiffies() -> int:
    """CPU time the machine has spent busy, in clock ticks (/proc/stat's first line:
    user, nice, system, irq and softirq; idle, iowait and steal left out)."""
    user, nice, system, _idle, _iowait, irq, softirq = map(
        int, Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]
    )
    return user + nice + system + irq + softirq


def wrk(url, seconds, env=None) -> Load:
    body_file = Path(tempfile.mkstemp(suffix=".json")[1])
    body_file.write_bytes(BODY)
    busy = busy_jiffies()
    out = subprocess.run(
        [
            "wrk",
            "-t2",
            "-c16",
            f"-d{max(1, int(seconds))}s",
            "-s",
            str(ROOT / "bench/post.lua"),
            url,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "BENCH_BODY_FILE": str(body_file), **(env or {})},
        check=True,
    ).stdout
    busy = busy_jiffies() - busy
    body_file.unlink()
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if non2xx:
        raise RuntimeError(f"wrk saw {non2xx.group(1)} failed responses:\n{out}")
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    return Load(
        rps=float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        cpu_ms=busy * 1000 / os.sysconf("SC_CLK_TCK") / max(1, requests),
    )


def median_ratio(runs, baselines, *, by_cpu=False):
    """The median over interleaved rounds of run / baseline: by requests per second,
    or (by_cpu) by how many requests a millisecond of the machine's CPU serves."""
    if by_cpu:
        return statistics.median(b.cpu_ms / r.cpu_ms for r, b in zip(runs, baselines, strict=True))
    return statistics.median(r.rps / b.rps for r, b in zip(runs, baselines, strict=True))


def fixed_rate(port, path, rate, seconds, threads=16):
    """Open-loop load at `rate` requests/s (bench/load.py). Returns [(scheduled
    latency ms, answer time, response json)]; any answer but 200 is an error."""

    def sender():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

        def send(due):
            conn.request("POST", path, BODY, {"Content-Type": "application/json"})
            response = conn.getresponse()
            data = response.read()
            answered = time.time()
            latency = (time.monotonic() - due) * 1000
            if response.status != 200:
                raise RuntimeError(f"status {response.status}: {data[:200]}")
            return latency, answered, json.loads(data)

        send.close = conn.close
        return send

    return load.open_loop(rate, seconds, threads=threads, lead=0.2, sender=sender)


def backlog(webhook, target, n):
    """n events with 1 KiB bodies, each with a pending delivery to `target`."""
    from django.utils import timezone

    from deliveries.models import Delivery

    now = timezone.now()
    created = []
    for events in data.event_batches(webhook, n, BODY, now):
        created += Delivery.objects.bulk_create(
            Delivery(event=e, target=target, created_at=now, updated_at=now) for e in events
        )
    return [d.id for d in created]


def vacuum_between_phases():
    """VACUUM ANALYZE when the PostgreSQL server runs without autovacuum (this
    machine's does; no deployment should: the engine warns at start). The phases
    before delete and update hundreds of thousands of rows; a server with
    autovacuum would have reclaimed them by now, so they do not bill the next
    phase here either."""
    from django.db import connection

    from deliveries.engine.partition_manager import autovacuum_off

    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        if not autovacuum_off(cursor):
            return
        log("autovacuum is off on this server: VACUUM ANALYZE before the next phase")
        cursor.execute("VACUUM ANALYZE")


def ceiling(url, n, threads=10):
    """The same POSTs from the same number of threads with requests, no database."""
    import requests

    counter = iter(range(n))
    lock = threading.Lock()

    def run():
        with requests.Session() as session:
            while True:
                with lock:
                    if next(counter, None) is None:
                        return
                session.post(
                    url, data=BODY, headers={"Content-Type": "application/json"}, timeout=10
                ).raise_for_status()

    started = time.monotonic()
    workers = [threading.Thread(target=run) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return n / (time.monotonic() - started)


def e2e(port, path, sink, rate, seconds, threads):
    sent = fixed_rate(port, path, rate, seconds, threads=threads)
    codes = {r[2]["event"]: r[1] for r in sent}

    def arrived():
        got = sink.receipts()
        return all(c in got for c in codes) and got

    received = wait_until(arrived, timeout=120, message="every event at the sink")
    return [(received[c] - t) * 1000 for c, t in codes.items()]


def engine_rss(data_dir, webhook_factory, n):
    from deliveries.models import EngineStatus, Target

    hole = Blackhole()
    webhook = webhook_factory("rss")
    target = Target.objects.create(
        webhook=webhook,
        name="hole",
        type="http",
        config={"url": f"http://127.0.0.1:{hole.port}/", "timeout": 300},
    )
    backlog(webhook, target, n)
    engine = start_quiet_engine(data_dir)
    try:
        wait_until(
            lambda: EngineStatus.objects.filter(inflight__gte=n, stopped_at=None).exists(),
            timeout=120,
            message="the engine to hold every task",
        )
        status = Path(f"/proc/{engine.popen.pid}/status").read_text()
        rss_kb = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))
    finally:
        engine.stop(signal.SIGKILL)
        hole.close()
    return rss_kb / 1024


def main():
    data_dir = Path(os.environ["DATA_DIR"])
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command

    from deliveries.models import Target, Webhook

    call_command("migrate", verbosity=0)
    owner = User.objects.create_user("bench")

    def webhook(name):
        hook = Webhook.objects.create(name=name, owner=owner)
        hook.ensure_entrypoint()
        return hook

    figures = {}
    sink = Nginx(data_dir).start()
    web, port = serve(data_dir)
    engine = None
    try:
        # --- ingest -------------------------------------------------------------
        ingest_hook = webhook("ingest")
        for name in ("a", "b"):
            Target.objects.create(
                webhook=ingest_hook, name=name, type="http", config={"url": sink.url("/ingest")}
            )
        code = ingest_hook.entrypoints.get().code
        verified = ingest_hook.entrypoints.create(
            description="verified",
            verification="github",
            verification_config={"secret": GITHUB_SECRET},
            dedup=True,
        )
        log(
            "ingest: no-op baseline, durable floor, /webhook/<code>, and signed posts to a "
            "plain and to a GitHub-verified deduplicating entrypoint by wrk, interleaved in "
            "3 rounds"
        )
        # Interleaved rounds and medians: on a shared machine a burst of someone
        # else's load then hits both sides of the ratio, not one.
        noop, floor, ingest, plain_signed, verified_signed = [], [], [], [], []
        for _ in range(3):
            noop.append(wrk(f"http://127.0.0.1:{port}/bench/noop", SECONDS / 3))
            floor.append(wrk(f"http://127.0.0.1:{port}/bench/durable-floor", SECONDS / 3))
            ingest.append(wrk(f"http://127.0.0.1:{port}/webhook/{code}", SECONDS / 3))
            # Both sides of the verified ratio send the same requests (headers and
            # the client's per-request script): only the server's work differs.
            for target, runs in ((code, plain_signed), (verified.code, verified_signed)):
                runs.append(wrk(f"http://127.0.0.1:{port}/webhook/{target}", SECONDS / 3, signed()))
        figures["noop_rps"] = statistics.median(r.rps for r in noop)
        figures["ingest_rps"] = statistics.median(r.rps for r in ingest)
        figures["ingest_ratio"] = median_ratio(ingest, noop)
        figures["durable_floor_rps"] = statistics.median(r.rps for r in floor)
        figures["durable_floor_ratio"] = median_ratio(floor, noop)
        # The same comparisons by the machine's CPU per request: what the rps ratio
        # would be on a machine of our own, saturated, whatever the hypervisor took.
        figures["noop_cpu_ms"] = statistics.median(r.cpu_ms for r in noop)
        figures["ingest_cpu_ms"] = statistics.median(r.cpu_ms for r in ingest)
        figures["ingest_cpu_ratio"] = median_ratio(ingest, noop, by_cpu=True)
        figures["durable_floor_cpu_ms"] = statistics.median(r.cpu_ms for r in floor)
        figures["durable_floor_cpu_ratio"] = median_ratio(floor, noop, by_cpu=True)
        figures["ingest_verified_rps"] = statistics.median(r.rps for r in verified_signed)
        figures["ingest_ratio_verified"] = median_ratio(verified_signed, plain_signed)
        log("ingest latency at half the measured rate")
        lat = [
            r[0] for r in fixed_rate(port, f"/webhook/{code}", figures["ingest_rps"] / 2, SECONDS)
        ]
        figures["ingest_p50_ms"] = edge.percentile(lat, 50)
        figures["ingest_p99_ms"] = edge.percentile(lat, 99)

        # --- the edge under hostile load (bench/edge.py) ------------------------
        from deliveries.models import Event

        path = f"/webhook/{code}"
        log("500 slow senders: normal senders' p99 with them connected, against without")
        figures.update(edge.slow_senders(port, path, BODY, max(2.0, SECONDS)))
        log("a flood past capacity (256 connections, 2 s client timeout), then recovery")
        figures.update(edge.flood(port, path, BODY, max(2.0, SECONDS / 2), Event.objects.count))
        prune_hook = webhook("prune")
        prune_hook.retention_days = 1
        prune_hook.save()
        old = int(min(160_000, 4000 * SECONDS))
        log(f"retention: pruning {old} events (2 deliveries, 4 results each) while senders post")
        edge.old_events(
            prune_hook,
            [
                Target.objects.create(
                    webhook=prune_hook, name=n, type="http", config={"url": sink.url("/p")}
                )
                for n in "ab"
            ],
            old,
            BODY,
        )
        figures.update(
            edge.prune_during_ingest(
                port,
                path,
                BODY,
                max(2.0, SECONDS / 2),
                Event.objects.filter(webhook=prune_hook).count,
            )
        )
        Target.objects.filter(webhook=ingest_hook).update(active=False)
        from deliveries.models import Delivery

        Delivery.objects.filter(target__webhook=ingest_hook).delete()

        # --- delivery throughput ----------------------------------------------
        vacuum_between_phases()
        n = int(max(1000, min(50_000, 300 * SECONDS)))
        out_hook = webhook("delivery")
        target = Target.objects.create(
            webhook=out_hook, name="sink", type="http", config={"url": sink.url("/deliver")}
        )
        ids = backlog(out_hook, target, n)
        log(f"delivery: a backlog of {n} to nginx, then the requests ceiling")
        engine = start_quiet_engine(data_dir)
        wait_delivered(ids, 600)
        figures["delivery_rps"] = drained_rate(ids)
        figures["http_ceiling_rps"] = ceiling(sink.url("/ceiling"), n)
        figures["delivery_ratio"] = figures["delivery_rps"] / figures["http_ceiling_rps"]

        # --- end to end ---------------------------------------------------------
        e2e_code = out_hook.entrypoints.get().code
        log("end to end at idle (one event every 50 ms)")
        idle = e2e(port, f"/webhook/{e2e_code}", sink, 20, max(2.0, SECONDS / 2), threads=1)
        figures["e2e_p50_ms"] = edge.percentile(idle, 50)
        figures["e2e_p99_ms"] = edge.percentile(idle, 99)
        log("end to end: the sustained rate (posting as fast as answered), then at half of it")
        figures["e2e_sustained_rps"] = edge.sustained_e2e(
            port, f"/webhook/{e2e_code}", BODY, SECONDS, sink
        )
        load = e2e(
            port,
            f"/webhook/{e2e_code}",
            sink,
            figures["e2e_sustained_rps"] / 2,
            SECONDS,
            threads=32,
        )
        figures["e2e_load_p50_ms"] = edge.percentile(load, 50)
        figures["e2e_load_p99_ms"] = edge.percentile(load, 99)
        engine.stop()
        engine = None

        # --- many engines on one database (PostgreSQL; bench/scaleout.py) -------
        from django.db import connection

        if connection.vendor == "postgresql":
            vacuum_between_phases()
            log("scale-out: 1, 2 and 4 engines, 50 ms and instant receivers; failover")
            figures.update(
                scaleout.run(
                    data_dir, webhook, sink, SECONDS, backlog, drained_rate, wait_delivered
                )
            )

        # --- attempts in flight (bench/inflight.py) -------------------------------
        vacuum_between_phases()
        log("in flight: 200 targets answering at once and after 500 ms; an ordered lane; RSS")
        figures.update(inflight.run(data_dir, webhook, SECONDS))

        # --- memory ---------------------------------------------------------------
        log("engine memory with 10 000 tasks queued")
        figures["engine_rss_mb_10k"] = engine_rss(data_dir, webhook, 10_000)

        # --- the Celery alternative ---------------------------------------------
        log("celery: the same backlog through a Celery worker (threads, Redis)")
        figures.update(celery(data_dir, webhook, sink, port, n, figures["delivery_rps"]))
    finally:
        if engine is not None:
            engine.stop()
        web.stop()
        sink.stop()
    for name, value in figures.items():
        print(f"{name}={value:.3f}" if isinstance(value, float) else f"{name}={value}")


def celery(data_dir, webhook_factory, sink, port, n, delivery_rps):
    import redis

    from bench.celery_app import deliver
    from deliveries.models import Target

    redis.Redis.from_url(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/15")).flushdb()
    worker = Process(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "bench.celery_app",
            "worker",
            "--pool",
            "threads",
            "--concurrency",
            "10",
            "--loglevel",
            "WARNING",
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
        ],
        os.environ,
        data_dir / "celery.log",
    )
    try:
        hook = webhook_factory("celery")
        target = Target.objects.create(
            webhook=hook, name="sink", type="http", config={"url": sink.url("/celery")}
        )
        ids = backlog(hook, target, n)
        for delivery_id in ids:
            deliver.delay(delivery_id)
        wait_delivered(ids, 900)
        rps = drained_rate(ids)
        code = hook.entrypoints.get().code
        idle = e2e(port, f"/bench/celery/{code}", sink, 20, max(2.0, SECONDS / 2), threads=1)
    finally:
        worker.stop()
    return {
        "celery_rps": rps,
        "celery_e2e_p50_ms": edge.percentile(idle, 50),
        "vs_celery_ratio": delivery_rps / rps,
    }


if __name__ == "__main__":
    main()

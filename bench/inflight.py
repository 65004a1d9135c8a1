"""Attempts in flight (issue 26): one engine with default settings against slow
receivers, each figure beside a baseline from the same run.

- slow_receiver_rps / instant_receiver_rps: a backlog spread over 200 targets,
  drained by one engine, the receiver answering after 500 ms / at once (the same
  asyncio server, bench/slowsink.py, in a process of its own); their quotient is
  slow_receiver_ratio (goal >= 0.85).
- engine_cpu_per_delivery_ratio: the engine's CPU per delivery against the 500 ms
  receiver over the CPU of one bare urllib3 POST to the instant receiver
  (bench/clients.py, before and after the drains, averaged; goal <= 1.5).
  These ratios are the medians of ROUNDS rounds (one under BENCH_SECONDS=3), each
  against its own round's baseline; _min and _max print the worst round.
- engine_rss_mb_5k_inflight: the engine's RSS with 5 000 attempts in flight
  (DELIVERY_INFLIGHT=5000, receivers that answer after a minute; goal <= 250).
- ordered_lane_ratio: one ordered target, receiver answering after 20 ms:
  deliveries/s x 0.020 (goal >= 0.8).
- transform_ratio: the instant receiver's backlog again, through targets with a
  small jq transform, over the same round's instant drain (goal >= 0.7): a third
  drain in each round, its median and (_min) its worst round.

Run by bench/suite.py, or alone: `DATA_DIR=... python bench/inflight.py`.
"""

import os
import re
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import clients, data  # noqa: E402
from tests.support.processes import start_engine, wait_until  # noqa: E402

TARGETS = 200
SLOW = 0.5
LANE_LATENCY = 0.020
# Alternated rounds of the instant, slow and transform drains (run()).
ROUNDS = 3
# What a receiver of three fields asks for (README, Transformations).
SMALL_TRANSFORM = '{body: {id: .body.id, type: .body.type}, headers: {"X-Source": "bench"}}'


def engine_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def engine_rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024


def spread_backlog(webhook, targets, n, body):
    """n events, each with one pending delivery, to `targets` in turn."""
    from django.utils import timezone

    from deliveries.models import Delivery

    now = timezone.now()
    ids, turn = [], 0
    for events in data.event_batches(webhook, n, body, now):
        rows = []
        for event in events:
            rows.append(
                Delivery(
                    event=event, target=targets[turn % len(targets)], created_at=now, updated_at=now
                )
            )
            turn += 1
        ids += [d.id for d in Delivery.objects.bulk_create(rows)]
    return ids


def make_targets(webhook, port, count, **fields):
    from deliveries.models import Target

    return [
        Target.objects.create(
            webhook=webhook,
            name=f"t{i}",
            type="http",
            config={"url": f"http://127.0.0.1:{port}/t/{i}", "timeout": 120},
            # As the issue measured: the figure is the engine's own cost.
            signing=False,
            **fields,
        )
        for i in range(count)
    ]


def drain(data_dir, ids, **env):
    """Start an engine on the backlog; (deliveries/s, engine CPU seconds per delivery)."""
    from deliveries.models import EngineStatus

    engine = start_engine(data_dir, verbosity=0, **env)
    try:
        # Its first heartbeat is written before it claims anything: the CPU spent
        # until then is the process starting (Django, imports), not deliveries.
        wait_until(
            lambda: EngineStatus.objects.filter(stopped_at=None).exists(),
            timeout=60,
            interval=0.02,
            message="the engine's heartbeat",
        )
        started = engine_cpu_seconds(engine.popen.pid)
        data.wait_delivered(ids, 900)
        used = engine_cpu_seconds(engine.popen.pid) - started
    finally:
        engine.stop(signal.SIGTERM)
    rate, cpu = data.drained_rate(ids), used / len(ids)
    # Each drain's own figures, for reading a run whose medians moved.
    print(f"# drain: {len(ids)}, {rate:.0f}/s, {cpu * 1000:.3f} ms CPU each", file=sys.stderr)
    return rate, cpu


def run(data_dir, webhook_factory, seconds):
    from deliveries.models import Delivery, EngineStatus

    figures = {}
    instant, instant_port = clients.start_sink(0.0)
    slow, slow_port = clients.start_sink(SLOW)
    lane, lane_port = clients.start_sink(LANE_LATENCY)
    try:
        n = int(max(1000, min(20_000, 1000 * seconds)))
        # Rounds of the instant, slow and transform drains, alternated, each round's ratios
        # taken against its own instant drain and the bare baseline measured around
        # it; the figures are the rounds' medians. On two shared cores one drain's
        # CPU per delivery and the baseline each moved by a quarter from run to run,
        # as much as a figure's distance to its goal.
        rounds = ROUNDS if seconds >= 3 else 1
        bare = clients.measure("urllib3_serial", instant_port, 3000, 1)["cpu_ms"] / 1000
        measured = []
        for _ in range(rounds):
            rates = {}
            # The transform drain (issue 27) goes through the instant receiver too,
            # its targets each with a small jq program run in a worker process.
            for label, port, fields in (
                ("instant", instant_port, {}),
                ("slow", slow_port, {}),
                ("transform", instant_port, {"transform": SMALL_TRANSFORM}),
            ):
                hook = webhook_factory(f"inflight-{label}")
                targets = make_targets(hook, port, TARGETS, **fields)
                rates[label] = drain(data_dir, spread_backlog(hook, targets, n, data.BODY))
            after = clients.measure("urllib3_serial", instant_port, 3000, 1)["cpu_ms"] / 1000
            print(f"# bare urllib3 POST: {after * 1000:.3f} ms CPU", file=sys.stderr)
            measured.append((rates, (bare + after) / 2))
            bare = after
        median = statistics.median
        figures["instant_receiver_rps"] = median(r["instant"][0] for r, _ in measured)
        figures["slow_receiver_rps"] = median(r["slow"][0] for r, _ in measured)
        ratios = [r["slow"][0] / r["instant"][0] for r, _ in measured]
        figures["slow_receiver_ratio"] = median(ratios)
        figures["slow_receiver_ratio_min"] = min(ratios)
        figures["bare_post_cpu_ms"] = median(b for _, b in measured) * 1000
        figures["engine_cpu_per_delivery_ms"] = median(r["slow"][1] for r, _ in measured) * 1000
        cpu = [r["slow"][1] / b for r, b in measured]
        figures["engine_cpu_per_delivery_ratio"] = median(cpu)
        figures["engine_cpu_per_delivery_ratio_max"] = max(cpu)
        figures["transform_rps"] = median(r["transform"][0] for r, _ in measured)
        transform = [r["transform"][0] / r["instant"][0] for r, _ in measured]
        figures["transform_ratio"] = median(transform)
        figures["transform_ratio_min"] = min(transform)

        # One ordered target: each head goes once the previous result commits.
        hook = webhook_factory("inflight-lane")
        lane_ids = spread_backlog(
            hook,
            make_targets(hook, lane_port, 1, ordered=True),
            int(max(100, 40 * seconds)),
            data.BODY,
        )
        figures["ordered_lane_rps"] = drain(data_dir, lane_ids)[0]
        figures["ordered_lane_ratio"] = figures["ordered_lane_rps"] * LANE_LATENCY

        # 5 000 attempts in flight: receivers that answer after a minute.
        slow.kill()
        slow, slow_port = clients.start_sink(60.0)
        hook = webhook_factory("inflight-rss")
        spread_backlog(hook, make_targets(hook, slow_port, TARGETS), 5000, data.BODY)
        engine = start_engine(
            data_dir, verbosity=0, DELIVERY_INFLIGHT="5000", DELIVERY_TARGET_CONCURRENCY="25"
        )
        try:
            wait_until(
                lambda: EngineStatus.objects.filter(
                    attempts_in_flight__gte=5000, stopped_at=None
                ).exists(),
                timeout=180,
                message="5 000 attempts in flight",
            )
            figures["engine_rss_mb_5k_inflight"] = engine_rss_mb(engine.popen.pid)
        finally:
            engine.stop(signal.SIGKILL)
        Delivery.objects.filter(target__webhook=hook).delete()
    finally:
        for proc in (instant, slow, lane):
            proc.kill()
    return figures


def main():
    import tempfile

    data_dir = Path(os.environ.get("DATA_DIR") or tempfile.mkdtemp(prefix="inflight-"))
    os.environ["DATA_DIR"] = str(data_dir)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webhooker.settings")
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command

    from deliveries.models import Webhook

    call_command("migrate", verbosity=0)
    owner, _ = User.objects.get_or_create(username="bench-inflight")

    def webhook(name):
        hook = Webhook.objects.create(name=f"{name}-{time.time_ns()}", owner=owner)
        hook.ensure_entrypoint()
        return hook

    seconds = float(os.environ.get("BENCH_SECONDS", "10"))
    figures = run(data_dir, webhook, seconds)
    for name, value in figures.items():
        print(f"{name}={value:.3f}")


if __name__ == "__main__":
    main()

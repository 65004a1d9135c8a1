"""Scale-out figures (PostgreSQL): delivery throughput with 1, 2 and 4 engines
against a receiver that answers after 50 ms and against the instant one (nginx),
and the failover time when one of three engines is killed.

Called by bench/suite.py inside its Django process; the engines are real
`rundelivery` processes (tests/processes.py), as `manage.py serve --engines N`
starts them.
"""

import signal
import subprocess
import sys

from django.db import connection, transaction
from django.utils import timezone

from deliveries import wake
from deliveries.engine.partitions import fair_share, lock_holders
from tests.support.processes import ROOT, free_port, start_engine, wait_until

# The latency-bound receiver: real receivers take tens of milliseconds.
SLOW_SECONDS = 0.05
ENGINES = (1, 2, 4)


class SlowSink:
    def __init__(self, delay: float):
        self.port = free_port()
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "slowsink.py"), str(self.port), str(delay)]
        )
        wait_until(self._up, timeout=30, message="the slow sink")

    def _up(self):
        import socket

        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def url(self, path="/"):
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self):
        self.process.terminate()
        self.process.wait(10)


def holders() -> dict:
    with connection.cursor() as cursor:
        return lock_holders(cursor)


def balanced(n: int, count: int) -> bool:
    """Every partition held, by `n` engines, none above its fair share."""
    found = holders()
    if set(found) != set(range(count)) or any(len(p) != 1 for p in found.values()):
        return False
    per_engine = {}
    for pids in found.values():
        per_engine[pids[0]] = per_engine.get(pids[0], 0) + 1
    return len(per_engine) == n and max(per_engine.values()) <= fair_share(count, n)


def grow(data_dir, running: list, n: int, count: int, **env) -> None:
    """Start engines until `n` run, and wait until they share the partitions
    fairly. Growing the same engines 1, 2, 4 (as an operator scales out) rather
    than starting each count afresh: a start's imports and setup cost CPU before
    the engine claims anything, taken from the engines being measured."""
    running += [start_engine(data_dir, verbosity=0, **env) for _ in range(n - len(running))]
    wait_until(lambda: balanced(n, count), timeout=120, message=f"{n} engines sharing")


def stop(running: list, n: int) -> None:
    """Stop (SIGTERM) the last engines until `n` run."""
    while len(running) > n:
        running.pop().stop(signal.SIGTERM, timeout=120)


def targets_for(webhook, url: str, count: int):
    """One target per partition (consecutive ids), all pointing at `url`."""
    from deliveries.models import Target

    return [
        Target.objects.create(webhook=webhook, name=f"p{i}", type="http", config={"url": url})
        for i in range(count)
    ]


def spread_backlog(backlog, webhook, targets, n):
    """n deliveries spread evenly over the targets (backlog: suite.backlog), then
    the wake hint, as the inbound view sends it. One transaction: the engines see
    the whole backlog at once, rather than start on its first part while this
    process is still writing the rest and taking CPU from them."""
    ids = []
    per = max(1, n // len(targets))
    with transaction.atomic():
        for target in targets:
            ids += backlog(webhook, target, per)
        with connection.cursor() as cursor:
            cursor.execute(f"NOTIFY {wake.CHANNEL}")
    return ids


def throughput(webhook, targets, backlog, drained_rate, wait_delivered, n):
    """Deliveries/s of the running engines draining a backlog of n over the targets."""
    from deliveries.models import Delivery

    try:
        ids = spread_backlog(backlog, webhook, targets, n)
        wait_delivered(ids, 900)
        return drained_rate(ids)
    finally:
        Delivery.objects.filter(target__in=targets).delete()


def failover(running, webhook, targets, backlog, wait_delivered):
    """Seconds from kill -9 of one of the three `running` engines (sharing the
    partitions) to the first delivery in one of its partitions by another: one
    delivery per target is stored right after the kill, so the figure is the
    handover itself (the lock released with the dead connection, the next
    rebalance, the take's recovery, one attempt), not the wait behind a backlog
    the survivors already hold."""
    from deliveries.models import Delivery, DeliveryResult

    count = len(targets)
    victim = running[0]
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s",
                [f"webhooker engine %:{victim.pid}:%"],
            )
            lock_pid = cursor.fetchone()[0]
        theirs = {p for p, pids in holders().items() if pids == [lock_pid]}
        their_targets = [t.pk for t in targets if t.pk % count in theirs]
        killed_at = timezone.now()
        victim.send(signal.SIGKILL)
        victim.wait()
        ids = spread_backlog(backlog, webhook, targets, count)
        first = wait_until(
            lambda: (
                DeliveryResult.objects.filter(target_id__in=their_targets)
                .order_by("created_at")
                .values_list("created_at", flat=True)
                .first()
            ),
            timeout=120,
            interval=0.01,
            message="another engine delivering the dead one's partitions",
        )
        wait_delivered(ids, 300)
        return (first - killed_at).total_seconds()
    finally:
        Delivery.objects.filter(target__in=targets).delete()


def run(data_dir, webhook_factory, nginx, seconds, backlog, drained_rate, wait_delivered):
    """Every scale-out figure, as {name: value}."""
    from django.conf import settings

    count = settings.DELIVERY_PARTITIONS
    figures = {}
    slow = SlowSink(SLOW_SECONDS)
    try:
        # Against the 50 ms receiver each engine keeps 10 attempts in flight: one
        # engine is then bound by the receiver's latency (10 / 0.05 s = 200/s) and
        # never by this machine's 2 cores, so the ratio measures how the partitions
        # share the work among engines, as it did when an engine had 10 worker
        # threads. With the default 2 000 in flight one engine alone takes both
        # cores (bench/RESULTS.md, 2026-12-04), and 4 engines can only share them.
        # The instant receiver's engines run with the defaults, as the failover's
        # do: after their figures one is stopped, and one of the three left is
        # killed, against the 50 ms receiver's targets.
        runs = (
            ("slow", slow.url("/slow"), 200, {"DELIVERY_INFLIGHT": "10"}),
            ("instant", nginx.url("/scaleout"), 1000, {}),
        )
        for label, url, per_engine_rate, env in runs:
            hook = webhook_factory(f"scaleout-{label}")
            targets = targets_for(hook, url, count)
            if label == "slow":
                failover_targets = (hook, targets)
            running = []
            try:
                for engines in ENGINES:
                    grow(data_dir, running, engines, count, **env)
                    # About `seconds` of work for the engines, whatever their number.
                    n = int(max(count * 10, per_engine_rate * engines * seconds))
                    figures[f"scaleout_{label}_{engines}_rps"] = throughput(
                        hook, targets, backlog, drained_rate, wait_delivered, n
                    )
                if label == "instant":
                    stop(running, 3)
                    grow(data_dir, running, 3, count)
                    figures["failover_s"] = failover(
                        running, *failover_targets, backlog, wait_delivered
                    )
            finally:
                stop(running, 0)
        figures["scaleout_ratio_4"] = (
            figures["scaleout_slow_4_rps"] / figures["scaleout_slow_1_rps"]
        )
    finally:
        slow.stop()
    return figures

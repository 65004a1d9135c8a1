"""The fault suite: gunicorn, several engines on PostgreSQL and a recording
receiver under steady load, with faults injected into the real processes, then a
check of what the receiver got against what the database holds.

`run(...)` is called by tests/e2e/test_faults.py: a short run in `make test` (on
PostgreSQL), the full one by `make chaos`, which writes docs/faults.md.

Faults, each aimed at one engine unless said:

| kind           | what is done                                                          |
|----------------|-----------------------------------------------------------------------|
| kill_engine    | SIGKILL, started again a second later                                |
| restart_engine | SIGTERM (graceful leave), started again once it exited               |
| freeze         | SIGSTOP for 1-15 s, then SIGCONT (past 10 s it is evicted)           |
| partition      | its TCP path to PostgreSQL cut for 1-20 s; past 11 s the server side |
|                | is closed, as the server's keepalive would                           |
| reset          | cut, and the server side closed at once (a middlebox's reset), 2-8 s |
| terminate_lock | its lock session ended with pg_terminate_backend                     |
| kill_web       | SIGKILL of a gunicorn worker (all engines untouched)                 |
| pg_restart     | PostgreSQL restarted (every process's connections)                   |
"""

from __future__ import annotations

import collections
import contextlib
import json
import random
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import requests
from django.conf import settings
from django.db import connection

from deliveries.engine.lock import open_raw_connection
from deliveries.engine.partitions import LOCK_NAMESPACE
from deliveries.models import Delivery, DeliveryResult, Event, Partition, Target, Webhook
from tests.support.faults.proxy import Proxy
from tests.support.faults.receiver import Receiver
from tests.support.processes import children, start_engine, start_web, wait_until

PARTITIONS = 64
LEASE = float(settings.DELIVERY_LEASE_SECONDS)
ENGINE_ENV = {
    "DELIVERY_POLL_INTERVAL": "0.2",
    "DELIVERY_BACKOFF_BASE": "0.2",
    "DELIVERY_BACKOFF_CAP": "2",
    "DELIVERY_HTTP_TIMEOUT": "5",
    "DELIVERY_PARTITIONS": str(PARTITIONS),
}
# Fault kind -> weight in the draw.
WEIGHTS = {
    "kill_engine": 4,
    "restart_engine": 3,
    "freeze": 4,
    "partition": 4,
    "reset": 2,
    "terminate_lock": 3,
    "kill_web": 2,
    "pg_restart": 1,
}
ENGINE_FAULTS = {"kill_engine", "restart_engine", "freeze", "partition", "reset", "terminate_lock"}
# Past this long cut off, the proxy closes the server side (PostgreSQL's keepalive).
SERVER_NOTICES = 11.0
# The faults timed alone at the start of a run (kind, length), and the quiet after each.
ISOLATED = [
    ("kill_engine", None),
    ("restart_engine", None),
    ("terminate_lock", None),
    ("freeze", 10.0),
    ("partition", 14.0),
]
QUIET = 15.0


@dataclass
class Fault:
    kind: str
    engine: str | None  # the slot's name; None: every engine (pg_restart) or none
    started: float
    ended: float | None = None
    # How long a freeze or a partition lasts; None: drawn.
    length: float | None = None
    # Alone: no other fault near it, so its hand-over is measured (handover_times).
    isolated: bool = False
    # The faulted engine's lock session when it began.
    lock_pid: int | None = None
    # Why the fault could not be injected (or undone) as drawn; None: it was.
    failed: str | None = None

    def window(self) -> tuple[float, float]:
        """When an attempt in flight at this fault may have been sent twice."""
        end = self.ended if self.ended is not None else self.started
        return self.started - 1.5, end + LEASE + 2.0


class Slot:
    """One engine's place: its proxy to PostgreSQL and its current process."""

    def __init__(self, name, data_dir, upstream):
        self.name = name
        self.data_dir = data_dir
        self.proxy = Proxy(upstream)
        self.process = None
        self.busy = threading.Lock()  # one fault at a time per engine

    def database_url(self) -> str:
        s = connection.settings_dict
        return f"postgres://{s['USER']}@127.0.0.1:{self.proxy.port}/{s['NAME']}"

    def start(self):
        self.process = start_engine(
            self.data_dir, verbosity=1, DATABASE_URL=self.database_url(), **ENGINE_ENV
        )

    @property
    def pid(self):
        return self.process.pid if self.process else None


class Load:
    """Senders posting numbered events; the acknowledged ones (200) are kept."""

    def __init__(self, urls: dict[str, tuple[str, int]]):
        # webhook label -> (url, concurrent senders); "ordered" has one sender.
        self.urls = urls
        self.acked: dict[str, set[int]] = collections.defaultdict(set)
        self.failed = collections.Counter()
        self.stop = threading.Event()
        self._seq = collections.defaultdict(int)
        self._lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._send, args=(label,), daemon=True)
            for label, (_, senders) in urls.items()
            for _ in range(senders)
        ]

    def start(self):
        for thread in self.threads:
            thread.start()

    def finish(self):
        self.stop.set()
        for thread in self.threads:
            thread.join(60)

    def _send(self, label, rate=5.0):
        url = self.urls[label][0]
        session = requests.Session()
        while not self.stop.is_set():
            with self._lock:
                self._seq[label] += 1
                seq = self._seq[label]
            try:
                answer = session.post(url, json={"seq": seq}, timeout=30)
                ok = answer.status_code == 200
            except requests.RequestException:
                ok = False
                session = requests.Session()
            if ok:
                with self._lock:
                    self.acked[label].add(seq)
            else:
                self.failed[label] += 1
            self.stop.wait(1 / rate)


class Sampler(threading.Thread):
    """Who holds which partition, several times a second (pg_locks)."""

    INTERVAL = 0.2

    def __init__(self):
        super().__init__(daemon=True)
        self.samples: list[tuple[float, dict[int, int]]] = []  # (time, {partition: pid})
        self.stop = threading.Event()

    def run(self):
        conn = None
        while not self.stop.wait(self.INTERVAL):
            try:
                if conn is None:
                    conn = open_raw_connection()
                rows = conn.execute(
                    "SELECT l.objid, l.pid FROM pg_locks l WHERE l.locktype = 'advisory' "
                    "AND l.classid = %s AND l.objsubid = 2 AND l.granted AND l.database = "
                    "(SELECT oid FROM pg_database WHERE datname = current_database())",
                    (LOCK_NAMESPACE,),
                ).fetchall()
                self.samples.append((time.time(), dict(rows)))
            except Exception:
                with contextlib.suppress(Exception):
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()

    def holders(self, partition: int, since: float, until: float) -> set[int]:
        """The lock holders' backend pids from the last sample before `since` to
        the last before `until`."""
        found, last = set(), None
        for sampled, holders in self.samples:
            if sampled > until:
                break
            if sampled >= since:
                found.add(holders.get(partition))
            last = holders.get(partition)
        found.add(last)
        found.discard(None)
        return found


class Cluster:
    def __init__(self, data_dir: Path, engines: int):
        s = connection.settings_dict
        upstream = (s["HOST"] or "127.0.0.1", int(s["PORT"] or 5432))
        self.data_dir = data_dir
        self.slots = [Slot(f"engine-{n}", data_dir, upstream) for n in range(engines)]
        self.web = None
        self.base = None
        # lock backend pid -> slot name, learned from pg_stat_activity as engines run
        self.lock_pids: dict[int, str] = {}
        self.engine_pids: dict[int, str] = {}  # engine process pid -> slot name

    def start(self):
        self.web, self.base = start_web(self.data_dir, workers=2)
        for slot in self.slots:
            slot.start()
            self.engine_pids[slot.pid] = slot.name

    def learn_lock_pids(self):
        """Map the engines' lock sessions to their slots (application_name has the
        process id: `webhooker engine host:pid:...`)."""
        with contextlib.suppress(Exception), open_raw_connection() as conn:
            rows = conn.execute(
                "SELECT pid, application_name FROM pg_stat_activity "
                "WHERE application_name LIKE 'webhooker engine %%' "
                "AND datname = current_database()"
            ).fetchall()
            for backend, name in rows:
                parts = name.split(":")
                if len(parts) >= 2 and parts[1].isdigit():
                    slot = self.engine_pids.get(int(parts[1]))
                    if slot:
                        self.lock_pids[backend] = slot

    def lock_pid_of(self, slot: Slot) -> int | None:
        self.learn_lock_pids()
        for backend, name in self.lock_pids.items():
            if name == slot.name:
                with contextlib.suppress(Exception), open_raw_connection() as conn:
                    alive = conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (backend,)
                    ).fetchone()[0]
                    if alive:
                        return backend
        return None

    def restart_slot(self, slot: Slot):
        slot.start()
        self.engine_pids[slot.pid] = slot.name

    def web_workers(self) -> list[int]:
        return children(self.web.pid)

    def stop(self):
        for slot in self.slots:
            if slot.process is not None:
                with contextlib.suppress(Exception):
                    slot.process.send(signal.SIGCONT)
                slot.proxy.heal()
                slot.process.stop(signal.SIGTERM, timeout=60)
            slot.proxy.stop()
        if self.web is not None:
            self.web.stop()


class Injector:
    def __init__(self, cluster: Cluster, rng: random.Random, *, pg_restart: list[str] | None):
        self.cluster = cluster
        self.rng = rng
        self.faults: list[Fault] = []
        self.threads: list[threading.Thread] = []
        self.pg_restart = pg_restart
        self.global_lock = threading.Lock()

    def inject(self, kind=None, length=None, isolated=False) -> Fault | None:
        if kind is None:
            kinds = [k for k in WEIGHTS if k != "pg_restart" or self.pg_restart]
            kind = self.rng.choices(kinds, [WEIGHTS[k] for k in kinds])[0]
        if kind in ENGINE_FAULTS:
            free = [slot for slot in self.cluster.slots if not slot.busy.locked()]
            if not free:
                return None
            slot = self.rng.choice(free)
            slot.busy.acquire()
            lock_pid = self.cluster.lock_pid_of(slot)
            fault = Fault(kind, slot.name, time.time(), length=length, isolated=isolated)
            fault.lock_pid = lock_pid
            thread = threading.Thread(target=self._engine_fault, args=(fault, slot), daemon=True)
        elif kind == "pg_restart":
            if not self.global_lock.acquire(blocking=False):
                return None
            fault = Fault(kind, None, time.time())
            thread = threading.Thread(target=self._pg_restart, args=(fault,), daemon=True)
        else:
            fault = Fault(kind, None, time.time())
            thread = threading.Thread(target=self._kill_web, args=(fault,), daemon=True)
        self.faults.append(fault)
        self.threads.append(thread)
        thread.start()
        return fault

    def finish(self):
        for thread in self.threads:
            thread.join(120)

    def _engine_fault(self, fault: Fault, slot: Slot):
        rng = random.Random(self.rng.random())
        try:
            getattr(self, "_" + fault.kind)(fault, slot, rng)
        except Exception as exc:
            fault.failed = f"{type(exc).__name__}: {exc}"
        finally:
            fault.ended = fault.ended or time.time()
            slot.busy.release()

    def _kill_engine(self, fault, slot, rng):
        slot.process.send(signal.SIGKILL)
        slot.process.wait(30)
        slot.process.stop()
        fault.ended = time.time()
        time.sleep(1.0)
        self.cluster.restart_slot(slot)

    def _restart_engine(self, fault, slot, rng):
        slot.process.stop(signal.SIGTERM, timeout=60)
        fault.ended = time.time()
        self.cluster.restart_slot(slot)

    def _freeze(self, fault, slot, rng):
        slot.process.send(signal.SIGSTOP)
        time.sleep(fault.length or rng.uniform(1, 15))
        slot.process.send(signal.SIGCONT)

    def _partition(self, fault, slot, rng):
        length = fault.length or rng.uniform(1, 20)
        slot.proxy.cut()
        if length > SERVER_NOTICES:
            time.sleep(SERVER_NOTICES)
            slot.proxy.close_server_side()
            time.sleep(length - SERVER_NOTICES)
        else:
            time.sleep(length)
        slot.proxy.heal()

    def _reset(self, fault, slot, rng):
        slot.proxy.cut()
        slot.proxy.close_server_side()
        time.sleep(rng.uniform(2, 8))
        slot.proxy.heal()

    def _terminate_lock(self, fault, slot, rng):
        backend = self.cluster.lock_pid_of(slot)
        if backend is not None:
            with open_raw_connection() as conn:
                conn.execute("SELECT pg_terminate_backend(%s)", (backend,))

    def _kill_web(self, fault):
        workers = self.cluster.web_workers()
        if workers:
            subprocess.run(["kill", "-9", str(self.rng.choice(workers))], check=False)
        fault.ended = time.time()

    def _pg_restart(self, fault):
        try:
            subprocess.run(self.pg_restart, check=True, capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as exc:
            fault.failed = f"{type(exc).__name__}: {exc}"
        finally:
            fault.ended = time.time()
            self.global_lock.release()


@dataclass
class Report:
    faults: collections.Counter
    acked: int
    deliveries: int
    receipts: int
    lost: list
    duplicates: int
    unexplained: list
    set_back: list
    two_results: list
    order_violations: dict
    handover: dict
    seconds: float
    # Faults drawn but not injected as drawn (the kind and why): a run that
    # injected less than it says proves less.
    failed: list

    def clean(self) -> bool:
        return not (
            self.lost or self.unexplained or self.set_back or self.two_results or self.failed
        ) and not any(self.order_violations.values())

    def page(self, command: str) -> str:
        """docs/faults.md: what ran, and its figures."""
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        return (
            "# Faults: the last recorded run\n\n"
            f"`{command}` at {commit or 'an uncommitted tree'}, "
            f"{time.strftime('%Y-%m-%d', time.gmtime())}, on this project's 2-core machine "
            "(PostgreSQL, gunicorn with 2 workers, 3 engines, each through a proxy of the "
            'suite\'s own; README "Faults we test" says what each fault is).\n\n'
            + self.markdown()
            + "\n\nHand-over times are from `pg_locks` sampled every 0.2 s, for each kind "
            "injected alone at the start: when the faulted engine's partitions were locked by "
            "another session. A partition taken from an engine that did not hand it over is "
            "used once that engine's lease is over (at most `DELIVERY_LEASE_SECONDS` after its "
            "last renewal); a frozen or cut-off engine's partitions move once it is evicted "
            "(`DELIVERY_EVICT_AFTER`).\n"
        )

    def markdown(self) -> str:
        lines = [
            f"- faults injected: {sum(self.faults.values())} in {self.seconds / 60:.1f} minutes "
            f"({', '.join(f'{k} {v}' for k, v in sorted(self.faults.items()))})",
            f"- acknowledged events: {self.acked}; deliveries: {self.deliveries}; "
            f"requests the receiver answered: {self.receipts}",
            f"- acknowledged events lost: {len(self.lost)}",
            f"- duplicates (a delivery answered 2xx more than once): {self.duplicates}, "
            f"of which not explained by an attempt in flight at a fault: {len(self.unexplained)}",
            f"- deliveries set back after success: {len(self.set_back)}",
            f"- attempts with two results: {len(self.two_results)}",
            f"- order violations per ordered target: {self.order_violations}",
            f"- faults not injected as drawn: {len(self.failed)}",
        ]
        for kind, figures in sorted(self.handover.items()):
            lines.append(f"- {kind}: " + ", ".join(f"{k} {v}" for k, v in figures.items()))
        return "\n".join(lines)


def check(load: Load, receiver: Receiver, injector: Injector, sampler: Sampler, cluster, seconds):
    receipts = receiver.snapshot()
    targets = {t.id: t for t in Target.objects.select_related("webhook")}
    path_of = {t.id: "/" + t.config["url"].split("/", 3)[3] for t in targets.values()}
    label_of_hook = {t.webhook_id: t.webhook.name for t in targets.values()}

    # What the database holds: events by (webhook label, seq).
    stored = {}
    for event_id, hook_id, body in Event.objects.values_list("id", "webhook_id", "body"):
        with contextlib.suppress(ValueError, AttributeError):
            stored[(label_of_hook[hook_id], json.loads(bytes(body))["seq"])] = event_id

    ok = collections.defaultdict(list)  # (path, message id) -> times answered 2xx
    first_ok = {}  # (path, seq) -> time
    for r in receipts:
        if r.status == 200:
            ok[(r.path, r.message_id)].append(r.at)
            first_ok.setdefault((r.path, r.seq), r.at)

    lost = []
    for label, seqs in load.acked.items():
        paths = [path_of[t.id] for t in targets.values() if t.webhook.name == label]
        for seq in sorted(seqs):
            if (label, seq) not in stored:
                lost.append((label, seq, "not stored"))
                continue
            lost += [(label, seq, path) for path in paths if (path, seq) not in first_ok]

    duplicates, unexplained = 0, []
    target_by_path = {path: tid for tid, path in path_of.items()}
    for (path, message_id), times in ok.items():
        if len(times) < 2:
            continue
        duplicates += len(times) - 1
        first = min(times)
        partition = target_by_path[path] % PARTITIONS
        # Who may have sent it first: an engine whose lock was released under it
        # (its session ended, or cut off) attempts on until its lease runs out, so
        # any holder of the partition during the lease before the first send.
        pids = sampler.holders(partition, first - LEASE - 1.0, first)
        senders = {cluster.lock_pids.get(pid) for pid in pids}
        if not any(
            f.window()[0] <= first <= f.window()[1]
            and f.kind != "kill_web"
            and (f.engine is None or not senders or None in senders or f.engine in senders)
            for f in injector.faults
        ):
            unexplained.append((path, message_id, times))

    set_back, two_results = [], []
    success = set(DeliveryResult.objects.filter(success=True).values_list("delivery_id", flat=True))
    last_result = dict(
        DeliveryResult.objects.order_by("delivery_id", "id").values_list("delivery_id", "success")
    )
    for delivery_id, status in Delivery.objects.filter(id__in=success).values_list("id", "status"):
        if status != "delivered" or not last_result.get(delivery_id, True):
            set_back.append(delivery_id)
    counts = collections.Counter(DeliveryResult.objects.values_list("delivery_id", "attempt"))
    two_results = [key for key, n in counts.items() if n > 1]

    order = {}
    acked_ordered = load.acked.get("ordered", set())
    for t in targets.values():
        if not t.ordered:
            continue
        path = path_of[t.id]
        seen = sorted(
            (at, seq) for (p, seq), at in first_ok.items() if p == path and seq in acked_ordered
        )
        highest, violations = 0, 0
        for _, seq in seen:
            if seq < highest:
                violations += 1
            highest = max(highest, seq)
        order[path] = violations

    return Report(
        faults=collections.Counter(f.kind for f in injector.faults),
        acked=sum(len(s) for s in load.acked.values()),
        deliveries=Delivery.objects.count(),
        receipts=len(receipts),
        lost=lost,
        duplicates=duplicates,
        unexplained=unexplained,
        set_back=set_back,
        two_results=two_results,
        order_violations=order,
        handover=handover_times(injector.faults, sampler, cluster),
        seconds=seconds,
        failed=[f"{f.kind}: {f.failed}" for f in injector.faults if f.failed],
    )


def handover_times(faults, sampler: Sampler, cluster) -> dict:
    """For each isolated engine fault, from the lock samples: when the faulted
    engine's partitions were first, and all, locked by another session, and the
    longest any of them stayed unlocked in between. (A partition taken from an
    engine that did not hand it over is then used once that engine's lease is over:
    at most DELIVERY_LEASE_SECONDS after its last renewal.)"""
    figures = {}
    for fault in faults:
        if not fault.isolated or fault.lock_pid is None:
            continue
        before = [h for t, h in sampler.samples if t <= fault.started]
        if not before:
            continue
        theirs = {p for p, pid in before[-1].items() if pid == fault.lock_pid}
        moved, last_old, gap = {}, {}, 0.0
        for t, holders in sampler.samples:
            if t < fault.started - 1 or t > fault.started + 60:
                continue
            for p in theirs - set(moved):
                pid = holders.get(p)
                if pid == fault.lock_pid:
                    last_old[p] = t
                elif pid is not None and t >= fault.started:
                    moved[p] = t
                    gap = max(gap, t - last_old.get(p, fault.started) - Sampler.INTERVAL)
        if theirs and len(moved) == len(theirs):
            figures[fault.kind] = {
                "partitions": len(theirs),
                "first moved (s)": round(min(moved.values()) - fault.started, 1),
                "all moved (s)": round(max(moved.values()) - fault.started, 1),
                "longest unlocked (s)": round(max(gap, 0.0), 1),
            }
        else:
            figures[fault.kind] = {"partitions": len(theirs), "moved": len(moved)}
    return figures


def stuck(cluster) -> str:
    """What is left unfinished, and who holds its partition: the record of a run
    that did not settle."""
    cluster.learn_lock_pids()
    lines = []
    with open_raw_connection() as conn:
        holders = dict(
            conn.execute(
                "SELECT objid, pid FROM pg_locks WHERE locktype = 'advisory' AND classid = %s "
                "AND objsubid = 2 AND granted AND database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())",
                (LOCK_NAMESPACE,),
            ).fetchall()
        )
    epochs = {p.number: (p.epoch, p.holder) for p in Partition.objects.all()}
    rows = Delivery.objects.filter(status__in=Delivery.UNFINISHED).order_by("id")
    for d in rows.values("id", "target_id", "status", "attempts", "next_attempt_at", "updated_at"):
        p = d["target_id"] % PARTITIONS
        pid = holders.get(p)
        lines.append(
            f"{d} partition={p} holder={pid}/{cluster.lock_pids.get(pid)} epoch={epochs.get(p)}"
        )
    return "\n".join(lines) + "\n"


def make_targets(user, receiver: Receiver) -> dict[str, tuple[str, int]]:
    """Two webhooks: "many" (plain, failing-first and rate-limited targets, two
    concurrent senders) and "ordered" (ordered targets, one sequential sender:
    the order kept is the order of its acknowledged events)."""
    many = Webhook.objects.create(name="many", owner=user)
    ordered = Webhook.objects.create(name="ordered", owner=user)
    kinds = [
        (many, "plain", 4, {}),
        (many, "fail", 2, {}),
        (many, "rate", 2, {"rate_limit": 30}),
        (ordered, "ordered", 3, {"ordered": True}),
    ]
    for hook, kind, count, fields in kinds:
        for n in range(count):
            url = receiver.url(f"/{kind}/{n}")
            Target.objects.create(
                webhook=hook, name=f"{kind}{n}", config={"url": url}, max_retries=8, **fields
            )
    urls = {}
    for hook, senders in ((many, 2), (ordered, 1)):
        hook.ensure_entrypoint()
        urls[hook.name] = (hook.entrypoints.get().code, senders)
    return urls


def run(
    user,
    data_dir: Path,
    *,
    faults: int,
    interval: float,
    engines: int = 3,
    seed: int = 1,
    pg_restart: list[str] | None = None,
    quiet: float = QUIET,
):
    """Run the suite; return the Report. `pg_restart`: the command that restarts
    the PostgreSQL server (tests.support.postgres.PrivateServer's), None for no
    pg_restart fault. `quiet`: seconds of calm after each isolated fault, which its
    hand-over timing needs (make chaos); a short run that records no timings may
    keep it short."""
    rng = random.Random(seed)
    receiver = Receiver()
    codes = make_targets(user, receiver)
    cluster = Cluster(data_dir, engines)
    sampler = Sampler()
    load = None
    injector = Injector(cluster, rng, pg_restart=pg_restart)
    began = time.time()
    try:
        cluster.start()
        load = Load(
            {label: (f"{cluster.base}/webhook/{code}", n) for label, (code, n) in codes.items()}
        )
        wait_until(lambda: cluster.lock_pid_of(cluster.slots[-1]), timeout=60, message="engines")
        sampler.start()
        load.start()
        # The engines share the partitions before the first fault.
        wait_until(
            lambda: (
                all(cluster.lock_pid_of(slot) for slot in cluster.slots)
                and len(set(sampler.samples[-1][1].values())) == len(cluster.slots)
                if sampler.samples
                else False
            ),
            timeout=60,
            message="every engine holding partitions",
        )
        # Each kind alone first, a quiet spell after it: their hand-overs are what
        # the report times. A freeze and a partition outlast DELIVERY_EVICT_AFTER.
        for kind, length in ISOLATED:
            cluster.learn_lock_pids()
            injector.inject(kind, length=length, isolated=True)
            time.sleep(quiet)
        while len(injector.faults) < faults:
            injector.inject()
            cluster.learn_lock_pids()
            time.sleep(interval)
        injector.finish()
        load.finish()
        connection.close()  # PostgreSQL may have restarted under it
        for slot in cluster.slots:  # whatever a fault left: everything runs again
            slot.proxy.heal()
            slot.process.send(signal.SIGCONT)
        try:
            wait_until(
                lambda: not Delivery.objects.filter(status__in=Delivery.UNFINISHED).exists(),
                timeout=300,
                interval=1.0,
                message="every delivery finished",
            )
        except AssertionError:
            (data_dir / "unfinished.txt").write_text(stuck(cluster))
            raise
        time.sleep(1.0)
        cluster.learn_lock_pids()
        return check(load, receiver, injector, sampler, cluster, time.time() - began)
    finally:
        sampler.stop.set()
        if load is not None:
            load.stop.set()
        cluster.stop()
        receiver.stop()
        connection.close()

"""The engine's steps, driven synchronously on the test's thread."""

import datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from deliveries.engine.intake import Gaps
from deliveries.models import Delivery, DeliveryResult, Event, Target
from tests.support.engines import attempt_one, make_engine, pump, started_engine, store

pytestmark = pytest.mark.django_db


def statuses():
    return dict(Delivery.objects.values_list("id", "status"))


# --- recovery -----------------------------------------------------------------


def test_recovery_at_start_takes_every_pending_and_retrying(entrypoint, make_target):
    target = make_target(url="http://127.0.0.1:9/x", max_retries=3)
    store(entrypoint, n=3)
    retrying = Delivery.objects.first()
    soon = timezone.now() + datetime.timedelta(seconds=30)
    Delivery.objects.filter(id=retrying.id).update(status="retrying", next_attempt_at=soon)
    Delivery.objects.create(
        event=retrying.event, target=make_target(name="done"), status="delivered"
    )
    engine = make_engine()

    assert engine.recover_once(at_start=True) == 3

    assert engine.channel.depth() == 2  # the pending ones, now
    assert engine.scheduler.pending() == 1  # the retrying one, at its time
    assert engine.inflight.held() == 3
    assert target.id in {t.target_id for t in engine.channel.drain()}


def test_retrying_is_scheduled_after_what_is_left_of_its_backoff(entrypoint, make_target):
    make_target(url="http://127.0.0.1:9/x", max_retries=3)
    store(entrypoint, n=2)
    first, second = Delivery.objects.order_by("id")
    now = timezone.now()
    Delivery.objects.filter(id=first.id).update(
        status="retrying", next_attempt_at=now + datetime.timedelta(seconds=40)
    )
    Delivery.objects.filter(id=second.id).update(
        status="retrying", next_attempt_at=now - datetime.timedelta(seconds=40)
    )
    clock = [500.0]
    engine = make_engine(clock=lambda: clock[0])

    engine.recover_once(at_start=True)

    dues = [(due, task.delivery_id) for due, task in engine.scheduler.scheduled()]
    assert dues[0] == (500.0, second.id)  # overdue: now
    assert dues[1][1] == first.id
    assert 538 < dues[1][0] <= 540.0
    assert engine.scheduler.release_due() == 1
    clock[0] += 41
    assert engine.scheduler.release_due() == 1


def test_tick_takes_only_stale_pending_at_most_the_batch(entrypoint, make_target):
    make_target(url="http://127.0.0.1:9/x", max_retries=3)
    store(entrypoint, n=12)
    ids = list(Delivery.objects.order_by("id").values_list("id", flat=True))
    now = timezone.now()
    old = now - datetime.timedelta(seconds=1000)
    Delivery.objects.filter(id__in=ids[:8]).update(updated_at=old)  # stale
    Delivery.objects.filter(id=ids[8]).update(status="retrying", updated_at=old)  # not pending
    engine = make_engine(stale_after=900, recovery_batch=5)

    assert engine.recover_once(now=now) == 5
    taken = {t.delivery_id for t in engine.channel.drain()}
    assert taken == set(ids[:5])  # oldest first, at most the batch

    assert engine.recover_once(now=now) == 3  # owned ones skipped, the rest taken
    assert engine.inflight.held() == 8
    assert engine.recover_once(now=now) == 0


def test_tick_never_takes_what_the_engine_owns(entrypoint, make_target):
    make_target(url="http://127.0.0.1:9/x")
    store(entrypoint, n=3)
    Delivery.objects.update(updated_at=timezone.now() - datetime.timedelta(hours=1))
    engine = make_engine(stale_after=0)
    ids = list(Delivery.objects.values_list("id", flat=True))
    engine.inflight.retain_idle(ids[0])
    assert engine.recover_once() == 2
    assert ids[0] not in {t.delivery_id for t in engine.channel.drain()}


# --- intake ----------------------------------------------------------------------


def test_intake_takes_new_rows_once(entrypoint, make_target):
    make_target(url="http://127.0.0.1:9/x")
    engine = started_engine()
    store(entrypoint, n=4)
    assert engine.intake_once() == 4
    assert engine.intake_once() == 0
    assert engine.inflight.held() == 4


def test_intake_reads_no_more_than_the_channel_takes(entrypoint, make_target):
    make_target(url="http://127.0.0.1:9/x")
    engine = started_engine(channel_size=3)
    store(entrypoint, n=5)
    assert engine.intake_once() == 3
    assert engine.intake_once() == 0
    engine.channel.drain()
    assert engine.intake_once() == 2


def test_intake_takes_a_delivery_committed_out_of_order(entrypoint, make_target):
    """An id below the cursor that appears later (a PostgreSQL sequence race)."""
    target = make_target(url="http://127.0.0.1:9/x")
    engine = started_engine()
    store(entrypoint, n=3)
    middle = Delivery.objects.order_by("id")[1]
    late_id, late_event = middle.id, middle.event_id
    middle.delete()  # as if its transaction had not committed yet
    assert engine.intake_once() == 2
    assert late_id in engine.intake.gaps
    Delivery.objects.create(id=late_id, event_id=late_event, target=target)  # commits now
    assert engine.intake_once() == 1
    assert engine.inflight.owns(late_id)
    assert not engine.intake.gaps


def test_gaps_that_never_fill_are_forgotten(entrypoint, make_target):
    make_target(url="http://127.0.0.1:9/x")
    clock = [0.0]
    engine = started_engine(clock=lambda: clock[0])
    store(entrypoint, n=3)
    Delivery.objects.order_by("id")[1].delete()  # a rolled-back insert
    engine.intake_once()
    assert len(engine.intake.gaps) == 1
    clock[0] += engine.intake.GAP_TTL + 1
    engine.intake_once()
    assert not engine.intake.gaps


def test_a_run_of_missing_ids_is_looked_up_as_one_range(entrypoint, make_target):
    """Recent deliveries deleted (a target removed, a backlog cleared) leave a run of
    ids the cursor passes over. It is still watched for GAP_TTL seconds, but as one
    range: looking each id up by name cost one bound parameter per id on every pass
    (10 000 of them, a third of an engine's CPU in the scale-out benchmark)."""
    target = make_target(url="http://127.0.0.1:9/x")
    engine = started_engine()
    store(entrypoint, n=1)
    assert engine.intake_once() == 1
    events = store(entrypoint, n=300)
    Delivery.objects.filter(event__in=events[:-1]).delete()
    assert engine.intake_once() == 1
    assert len(engine.intake.gaps) == 299
    with CaptureQueriesContext(connection) as queries:
        assert engine.intake_once() == 0
    gap_lookups = [q["sql"] for q in queries if "BETWEEN" in q["sql"] or " IN (" in q["sql"]]
    assert gap_lookups and all(len(sql) < 1_000 for sql in gap_lookups), gap_lookups
    missing = sorted(engine.intake.gaps)
    # A delivery committed late into the middle of the run.
    Delivery.objects.create(id=missing[100], event=events[100], target=target)
    assert engine.intake_once() == 1
    assert engine.inflight.owns(missing[100])
    assert missing[100] not in engine.intake.gaps
    assert missing[99] in engine.intake.gaps and missing[101] in engine.intake.gaps
    assert len(engine.intake.gaps) == 298


def test_gap_runs_rotate_split_expire_and_are_bounded():
    gaps = Gaps(limit=5, per_lookup=2)
    gaps.note(10, 19, now=1.0)
    assert gaps.next_runs() == ([(10, 19)], 0)  # all of them while they fit
    gaps.note(30, 30, now=2.0)
    gaps.note(40, 44, now=3.0)
    # Past per_lookup: the newest run every time, the older ones in turn.
    assert gaps.next_runs() == ([(10, 19), (40, 44)], 1)
    assert gaps.next_runs() == ([(10, 19), (40, 44)], 1)  # not moved on until looked up
    gaps.looked_up(1)
    assert gaps.next_runs() == ([(30, 30), (40, 44)], 1)
    gaps.looked_up(1)
    assert gaps.next_runs()[0] == [(10, 19), (40, 44)]  # wrapped around
    gaps.looked_up(1)
    gaps.discard(15)  # filled inside a run: it splits, and the rotation keeps its place
    assert 15 not in gaps and 14 in gaps and 16 in gaps and len(gaps) == 15
    assert gaps.next_runs()[0] == [(30, 30), (40, 44)]  # both halves were looked up
    gaps.discard(30)  # a run of one filled: it goes, and the rotation starts over
    assert gaps.next_runs()[0] == [(10, 14), (40, 44)]
    gaps.note(50, 50, now=4.0)
    gaps.note(60, 60, now=5.0)
    gaps.note(70, 70, now=6.0)  # six runs past a limit of five: the oldest goes
    assert 14 not in gaps and 16 in gaps and 70 in gaps
    gaps.expire(cutoff=3.5)
    assert list(gaps) == [50, 60, 70]


def test_intake_takes_a_redelivered_delivery(entrypoint, make_target, sink):
    make_target(url=sink.url("/r"))
    engine = started_engine()
    store(entrypoint)
    pump(engine, lambda: set(statuses().values()) == {"delivered"})
    assert engine.intake_once() == 0
    Delivery.objects.update(status="pending", updated_at=timezone.now())  # the admin
    assert engine.intake_once() == 1
    pump(engine, lambda: set(statuses().values()) == {"delivered"})
    delivery = Delivery.objects.get()
    assert delivery.attempts == 2
    assert len(sink.requests("/r")) == 2
    assert engine.inflight.held() == 0


def test_intake_takes_a_redelivered_filtered_delivery_that_was_never_attempted(
    entrypoint, make_target, sink
):
    """A filtered delivery was never attempted (attempts 0), and intake's sweep of
    set-back rows read only attempted ones: redelivered, it waited for the
    recovery tick (DELIVERY_STALE_AFTER, 15 minutes)."""
    make_target(url=sink.url("/f"))
    engine = started_engine()
    store(entrypoint, body=b'{"n": 1}')
    assert engine.intake_once() == 1
    # As the engine's filters leave it (their rule since changed, say).
    Delivery.objects.update(status="filtered", reason="filters did not match")
    engine.release(engine.channel.get(0))
    assert Delivery.objects.all().redeliver() == 1
    assert engine.intake_once() == 1
    pump(engine, lambda: set(statuses().values()) == {"delivered"})
    assert Delivery.objects.get().reason == ""
    assert len(sink.requests("/f")) == 1


def test_a_full_target_waits_in_the_database(entrypoint, make_target, sink):
    small = make_target(url=sink.url("/small"), name="small", max_queue_size=2)
    other = make_target(url=sink.url("/other"), name="other")
    engine = started_engine()
    store(entrypoint, n=5)
    assert engine.intake_once() == 7  # 2 of small, 5 of other
    assert engine.targets.held(small.id) == 2
    assert engine.targets.held(other.id) == 5
    pump(engine, lambda: not Delivery.objects.unfinished().exists())
    assert len(sink.requests("/small")) == 5
    assert engine.inflight.held() == 0


# --- attempts ----------------------------------------------------------------


def test_http_attempt_writes_result_and_status(entrypoint, make_target, sink):
    make_target(url=sink.url("/hook"))
    engine = attempt_one(entrypoint, body=b'{"a": 1}')
    event, delivery = Event.objects.get(), Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("delivered", 1)
    result = delivery.results.get()
    assert (result.attempt, result.success, result.status_code) == (1, True, 200)
    assert result.response_body == "ok"
    [got] = sink.requests("/hook")
    assert got.body == b'{"a": 1}'
    assert got.headers["X-Webhooker-Event"] == str(event.code)
    assert got.headers["X-Webhooker-Delivery"] == str(delivery.id)
    assert engine.inflight.held() == 0


def test_retries_until_success(entrypoint, make_target, sink):
    make_target(url=sink.url("/flaky"), max_retries=3)
    sink.respond("/flaky", 500, 500, 200)
    engine = started_engine()
    store(entrypoint)
    pump(engine, lambda: Delivery.objects.get().status == "delivered")
    delivery = Delivery.objects.get()
    assert delivery.attempts == 3
    assert [(r.attempt, r.success, r.status_code) for r in delivery.results.all()] == [
        (1, False, 500),
        (2, False, 500),
        (3, True, 200),
    ]
    assert len(sink.requests("/flaky")) == 3
    assert engine.inflight.held() == 0


def test_retrying_status_and_next_attempt_between_attempts(entrypoint, make_target, sink):
    make_target(url=sink.url("/flaky"), max_retries=3)
    sink.respond("/flaky", 500)
    engine = attempt_one(entrypoint, make_engine(backoff_base=60, backoff_cap=3600))
    delivery = Delivery.objects.get()
    assert delivery.status == "retrying"
    gap = (delivery.next_attempt_at - delivery.results.get().created_at).total_seconds()
    assert 54 <= gap <= 66
    assert engine.inflight.owns(delivery.id)  # the scheduler holds it


def test_fire_and_forget_fails_after_one_attempt(entrypoint, make_target, sink):
    make_target(url=sink.url("/down"), max_retries=0)
    sink.always("/down", 500)
    engine = attempt_one(entrypoint)
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.results.count()) == ("failed", 1, 1)
    assert engine.scheduler.pending() == 0
    assert engine.inflight.held() == 0


def test_410_is_permanent(entrypoint, make_target, sink):
    make_target(url=sink.url("/gone"), max_retries=5)
    sink.always("/gone", 410)
    engine = attempt_one(entrypoint)
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("failed", 1)
    assert engine.inflight.held() == 0


def test_retry_after_is_respected(entrypoint, make_target, sink):
    make_target(url=sink.url("/busy"), max_retries=2)
    sink.respond("/busy", (503, {"Retry-After": "7"}))
    clock = [0.0]
    engine = attempt_one(
        entrypoint, make_engine(clock=lambda: clock[0], backoff_base=0.01, backoff_cap=3600)
    )
    [(due, _task)] = engine.scheduler.scheduled()
    assert 7.0 <= due <= 7.01
    clock[0] = 6.9
    assert engine.scheduler.release_due() == 0
    clock[0] = 7.01
    assert engine.scheduler.release_due() == 1
    engine.process_one()
    assert Delivery.objects.get().status == "delivered"


def test_redirects_are_not_followed(entrypoint, make_target, sink):
    make_target(url=sink.url("/moved"))
    sink.always("/moved", 302, {"Location": sink.url("/elsewhere")})
    attempt_one(entrypoint)
    result = DeliveryResult.objects.get()
    assert (result.success, result.status_code) == (False, 302)
    assert "redirect" in result.error
    assert sink.requests("/elsewhere") == []


def test_hop_by_hop_headers_are_stripped_and_extras_added(entrypoint, make_target, sink):
    make_target(config={"url": sink.url("/h"), "headers": {"X-Token": "secret"}})
    headers = [
        ["Content-Type", "application/json"],
        ["Content-Length", "2"],
        ["Host", "in.example"],
        ["Connection", "keep-alive, X-Private"],
        ["X-Private", "drop me"],
        ["Keep-Alive", "300"],
        ["Transfer-Encoding", "chunked"],
        ["Upgrade", "h2c"],
        ["X-Github-Event", "push"],
        ["X-Webhooker-Event", "spoofed"],
    ]
    attempt_one(entrypoint, body=b"{}", headers=headers)
    event = Event.objects.get()
    [got] = sink.requests("/h")
    names = {k.lower() for k in got.headers}
    assert not names & {"x-private", "keep-alive", "transfer-encoding", "upgrade"}
    assert got.headers["Host"] == f"127.0.0.1:{sink.port}"
    assert got.headers["X-Github-Event"] == "push"
    assert got.headers["X-Token"] == "secret"
    assert got.headers["X-Webhooker-Event"] == str(event.code)
    assert got.headers["Content-Type"] == "application/json"


def test_unreachable_target_records_the_error(entrypoint, make_target):
    make_target(url="http://127.0.0.1:9/closed")
    attempt_one(entrypoint)
    result = DeliveryResult.objects.get()
    assert not result.success and result.status_code is None
    assert result.error.startswith("connection refused\n")


def test_breaker_defers_without_counting_attempts(entrypoint, make_target, sink):
    make_target(url=sink.url("/dead"), max_retries=10)
    sink.always("/dead", 500)
    clock = [0.0]
    engine = started_engine(clock=lambda: clock[0], backoff_base=0.001, backoff_cap=0.001)
    store(entrypoint)
    engine.intake_once()
    for _ in range(5):
        engine.process_one()
        clock[0] += 0.01
        engine.scheduler.release_due()
    assert Delivery.objects.get().attempts == 5
    assert len(engine.targets.not_closed()) == 1
    engine.process_one()  # deferred by the open breaker
    assert Delivery.objects.get().attempts == 5
    assert len(sink.requests("/dead")) == 5
    [(due, _task)] = engine.scheduler.scheduled()
    assert due >= clock[0] + 29
    sink.always("/dead", 200)
    clock[0] = due
    engine.scheduler.release_due()
    engine.process_one()  # the probe
    assert Delivery.objects.get().status == "delivered"
    assert engine.targets.not_closed() == {}


@pytest.mark.parametrize("type_", [Target.Type.DATABASE, Target.Type.LOG])
def test_database_and_log_targets_deliver(entrypoint, make_target, type_, caplog):
    make_target(type_)
    with caplog.at_level("INFO", logger="deliveries"):
        attempt_one(entrypoint, body=b'{"x": "logged"}')
    assert Delivery.objects.get().status == "delivered"
    if type_ == Target.Type.LOG:
        assert any('{"x": "logged"}' in r.getMessage() for r in caplog.records)


def test_an_inactive_target_holds_its_queued_deliveries(entrypoint, make_target, sink):
    target = make_target(url=sink.url("/off"))
    engine = started_engine()
    store(entrypoint)
    engine.intake_once()  # claimed while the target is active
    target.active = False
    target.save()
    engine.refresh_targets(force=True)
    engine.process_one()
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("pending", 0)  # held, not failed
    assert sink.requests("/off") == []
    assert engine.inflight.held() == 0  # it waits in the database, not in memory


def test_large_bodies_are_read_at_attempt_time(entrypoint, make_target, sink):
    make_target(url=sink.url("/big"))
    body = b"B" * (64 * 1024)
    engine = started_engine()
    store(entrypoint, body=body, content_type="application/octet-stream")
    engine.intake_once()
    [task] = engine.channel.drain()
    assert task.body is None  # not held in the channel
    engine.process(task)
    assert sink.requests("/big")[0].body == body


def test_one_log_line_per_attempt(entrypoint, make_target, sink, caplog):
    make_target(url=sink.url("/l"))
    engine = started_engine()
    store(entrypoint)
    engine.intake_once()
    with caplog.at_level("INFO", logger="deliveries.engine"):
        engine.process_one()
    [line] = [r.getMessage() for r in caplog.records if r.name == "deliveries.engine"]
    delivery = Delivery.objects.get()
    assert f"delivery={delivery.id}" in line
    assert f"target={delivery.target_id}" in line
    assert "outcome=delivered" in line and "status_code=200" in line
    assert "duration_ms=" in line


def test_an_unknown_response_charset_is_still_a_success(entrypoint, make_target, sink):
    make_target(url=sink.url("/charset"))
    sink.always("/charset", 200, {"Content-Type": "text/plain; charset=bogus"})
    attempt_one(entrypoint)
    assert Delivery.objects.get().status == "delivered"


def test_retry_after_parsing():
    from deliveries.targets.transport import parse_retry_after

    assert parse_retry_after("120") == 120
    assert parse_retry_after("²") is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412480) == 0


def test_a_receiver_that_drips_its_answer_is_cut_off_at_the_timeout(entrypoint, make_target):
    """Each byte arrives well within the per-read timeout; only the whole-attempt
    deadline ends the attempt (without it this test would hang)."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()

    def drip():
        conn, _ = server.accept()
        conn.recv(65536)
        for byte in b"HTTP/1.1 200 OK\r\n" * 1000:
            if stop.wait(0.2):
                break
            try:
                conn.send(bytes([byte]))
            except OSError:
                break
        conn.close()

    threading.Thread(target=drip, daemon=True).start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}/drip"
    make_target(config={"url": url, "timeout": 1})
    try:
        attempt_one(entrypoint)
    finally:
        stop.set()
        server.close()
    result = DeliveryResult.objects.get()
    assert not result.success
    assert result.error == "timed out after 1 s"


# --- the claim's statements ---------------------------------------------------


def orm_tasks(ids):
    """Tasks read through the ORM, as the claim read them before its statements
    were built once: what those statements must give, value for value."""
    from django.db.models import BinaryField, Case, F, Value, When

    from deliveries.engine.statements import TASK_COLUMNS
    from deliveries.engine.task import INLINE_BODY_LIMIT, Task

    lookups = {
        field: ("inline_body" if field == "body" else name if alias == "d" else f"event__{name}")
        for field, (alias, name) in TASK_COLUMNS.items()
    }
    for field in ("event_id", "target_id", "webhook_id", "entrypoint_id"):
        lookups[field] = lookups[field].removesuffix("_id") + "_id"
    rows = (
        Delivery.objects.filter(id__in=ids, status__in=Delivery.UNFINISHED)
        .annotate(
            inline_body=Case(
                When(event__body_size__lte=INLINE_BODY_LIMIT, then=F("event__body")),
                default=Value(None),
                output_field=BinaryField(),
            )
        )
        .values_list(*lookups.values())
        .order_by("id")
    )
    tasks = []
    for row in rows:
        fields = dict(zip(lookups, row, strict=True))
        fields["body"] = None if fields["body"] is None else bytes(fields["body"])
        tasks.append(Task(**fields))
    return tasks


def test_a_claim_loads_tasks_as_the_orm_reads_them(entrypoint, make_target):
    """Every column of a task, on both databases: datetimes aware, the code a UUID,
    header lines decoded, small bodies inline and large ones left for attempt time."""
    from deliveries.engine.claims import load_tasks
    from deliveries.engine.task import INLINE_BODY_LIMIT

    make_target(url="http://127.0.0.1:9/x", max_retries=3)
    small, large = store(
        entrypoint, headers=[["Content-Type", "application/json"], ["X-Ünïcode", "ö ✓"]]
    ) + store(entrypoint, body=b"x" * (INLINE_BODY_LIMIT + 1))
    Event.objects.filter(id=small.id).update(
        query_string="a=1&b=%C3%B6",
        event_type="order.paid",
        provider_id="evt_1",
        traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01",
    )
    first = Delivery.objects.get(event=small)
    Delivery.objects.filter(id=first.id).update(
        status="retrying", attempts=2, next_attempt_at=timezone.now()
    )
    done = Delivery.objects.get(event=large)
    store(entrypoint)
    Delivery.objects.exclude(event__in=[small, large]).update(status="delivered")
    ids = list(Delivery.objects.order_by("id").values_list("id", flat=True))

    tasks = load_tasks(ids)

    assert tasks == orm_tasks(ids)
    assert [t.delivery_id for t in tasks] == [first.id, done.id]  # the delivered one is not
    assert tasks[0].body == small.body and tasks[1].body is None
    assert tasks[0].headers[1] == ["X-Ünïcode", "ö ✓"]
    assert tasks[0].next_attempt_at.tzinfo is not None


def test_the_claims_statements_are_built_once(entrypoint, make_target):
    """A claim of one row and one of many run the same statement text, and an
    ordered lane's next head is one statement: nothing built per claim."""
    from deliveries.engine.claims import load_tasks

    target = make_target(url="http://127.0.0.1:9/x", ordered=True)
    store(entrypoint, n=3)
    ids = list(Delivery.objects.order_by("id").values_list("id", flat=True))
    texts = []

    def record(execute, sql, params, many, context):
        texts.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        load_tasks(ids[:1])
        load_tasks(ids)
        load_tasks(ids[1:])
    assert len(texts) == 3 and len(set(texts)) == 1

    engine = make_engine()
    engine.targets.load({target.id})
    texts.clear()
    with connection.execute_wrapper(record):
        assert engine.intake.head(target.id) == 1
    assert [task.delivery_id for task in engine.channel.drain()] == ids[:1]
    # The head's row and its task in one statement: a lane reads nothing else
    # between one result's commit and the next attempt.
    assert len(texts) == 1, texts


def test_a_lanes_head_is_its_oldest_events_delivery_whenever_that_was_made(entrypoint, make_target):
    """A replay to an ordered target makes deliveries for older events after newer
    events' deliveries already wait: the lane goes by event, not by delivery."""
    older, newer = store(entrypoint, n=2)
    target = make_target(url="http://127.0.0.1:9/x", ordered=True)
    for event in (newer, older):
        Delivery.objects.create(event=event, target=target)
    engine = make_engine()
    engine.targets.load({target.id})

    assert engine.intake.head(target.id) == 1
    assert [task.event_id for task in engine.channel.drain()] == [older.id]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's prepared plans")
def test_a_lanes_head_a_load_and_an_overflow_are_each_planned_once(entrypoint, make_target):
    """A load looks ids up by primary key, and a head takes the first entry of its
    target's range of the lane index (the target's unfinished deliveries by event),
    an overflow the first entries of its target's unfinished deliveries by id: one
    plan serves every run of each, so they are prepared. The head's and the
    overflow's statuses are literals, so the partial indexes serve them; the load's
    are parameters, so its generic plan cannot scan a partial index whole for the
    ids."""
    from deliveries.engine import statements
    from deliveries.engine.claims import load_tasks
    from tests.support.database import generic_plan, prepared

    target = make_target(url="http://127.0.0.1:9/x", ordered=True)
    store(entrypoint, n=2)
    for _ in range(7):  # past psycopg's and PostgreSQL's thresholds for a plan kept
        assert statements.run("head", [target.id])
        assert statements.run("overflow", [target.id, 0, 10])
        load_tasks(Delivery.objects.values_list("id", flat=True))
    text = statements.for_vendor("postgresql")

    assert prepared(text["head"]) == 1
    assert prepared(text["load"]) == 1
    assert prepared(text["overflow"]) == 1
    overflow = generic_plan(text["overflow"], f"({target.id}, 0, 10)")
    assert "delivery_target_unfinished_idx" in overflow and "Sort" not in overflow, overflow
    head, load = (
        generic_plan(text["head"], f"({target.id})"),
        generic_plan(text["load"], "('{1,2,3}', 'pending', 'retrying')"),
    )
    # The head: one probe of the lane index, nothing sorted, whatever the backlog.
    assert "delivery_lane_idx" in head and "Sort" not in head, head
    # (Which index the load picks over a test's few rows is the planner's guess;
    # what the parameters rule out is a partial index, which it would scan whole.)
    assert "unfinished_idx" not in load and "lane_idx" not in load, load


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's planner; see the test")
def test_the_claims_statements_use_the_indexes(entrypoint, make_target):
    """The ids of a load come as a JSON array on SQLite: it must still look each up
    (never scan the deliveries), and a lane's head must be the first entry of its
    target's range of the lane index: nothing sorted, whatever the backlog."""
    from deliveries.engine import statements

    make_target(url="http://127.0.0.1:9/x", ordered=True)
    store(entrypoint, n=3)
    with connection.cursor() as cursor:
        sql = statements.for_vendor("sqlite")
        cursor.execute("EXPLAIN QUERY PLAN " + sql["load"], ["[1, 2, 3]", *Delivery.UNFINISHED])
        load = " / ".join(row[-1] for row in cursor.fetchall())
        cursor.execute("EXPLAIN QUERY PLAN " + sql["head"], [1])
        head = " / ".join(row[-1] for row in cursor.fetchall())
        cursor.execute("EXPLAIN QUERY PLAN " + sql["overflow"], [1, 1, 10])
        overflow = " / ".join(row[-1] for row in cursor.fetchall())
    assert "SEARCH d USING" in load and "SCAN d" not in load, load
    assert "SEARCH d USING INDEX delivery_lane_idx" in head, head
    assert "SCAN d" not in head and "TEMP B-TREE" not in head, head
    # An overflow: its target's unfinished deliveries from an id on, by id.
    assert "SEARCH d USING INDEX delivery_target_unfinished_idx" in overflow, overflow
    assert "TEMP B-TREE" not in overflow, overflow


# --- the result writer --------------------------------------------------------


def test_written_results_read_back_exactly(entrypoint, make_target):
    """Every column of every result survives the writer's statement (arrays on
    PostgreSQL: NULLs, JSON header lines, text past ASCII), in attempt order, and
    a delivery deleted meanwhile gets no result and no status."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from deliveries.engine.attempts import AttemptResult
    from deliveries.engine.claims import load_tasks
    from deliveries.engine.writer import write_results
    from deliveries.targets.base import Outcome

    make_target(url="http://127.0.0.1:9/x", max_retries=3)
    store(entrypoint, n=3)
    first, second, gone = load_tasks(Delivery.objects.order_by("id").values_list("id", flat=True))
    Delivery.objects.filter(id=gone.delivery_id).delete()
    outcomes = [
        Outcome(
            success=True,
            status_code=200,
            response_body="ök ✓",
            request_url="http://127.0.0.1:9/x?a=1",
            request_headers=(("X-A", "1"), ("X-A", "2")),
            response_headers="Server: x",
        ),
        Outcome(success=False, error="connection refused\nConnectionError: …", failure="network"),
        Outcome(success=True, status_code=204),
    ]
    batch = [
        AttemptResult(task, outcome, status, delay, duration_ms=ms)
        for task, outcome, status, delay, ms in zip(
            (first, second, gone),
            outcomes,
            ("delivered", "retrying", "delivered"),
            (None, 30.0, None),
            (12, 0, 1),
            strict=True,
        )
    ]

    with CaptureQueriesContext(connection) as queries:
        existing, written = write_results(batch)

    assert existing == written == {first.delivery_id, second.delivery_id}
    if connection.vendor == "postgresql":
        assert len(queries) == 1  # statuses and results: one statement, one round trip
        from tests.support.database import prepared

        assert prepared(queries[0]["sql"]) == 1  # on the server, once
    else:  # the statements built once: the existing ids, then each batch of rows
        statements = [q["sql"].split(": ", 1)[-1].split(" ", 1)[0] for q in queries]
        assert [s for s in statements if s in ("SELECT", "UPDATE", "INSERT")] == [
            "SELECT",
            "UPDATE",
            "INSERT",
        ], queries
    rows = list(
        DeliveryResult.objects.order_by("id").values(
            "delivery_id",
            "target_id",
            "attempt",
            "success",
            "status_code",
            "response_body",
            "request_url",
            "request_headers",
            "response_headers",
            "error",
            "failure",
            "duration_ms",
            "created_at",
        )
    )
    written_at = {row.pop("created_at") for row in rows}
    assert len(written_at) == 1 and abs(timezone.now() - written_at.pop()).total_seconds() < 60
    assert rows == [
        {
            "delivery_id": first.delivery_id,
            "target_id": first.target_id,
            "attempt": 1,
            "success": True,
            "status_code": 200,
            "response_body": "ök ✓",
            "request_url": "http://127.0.0.1:9/x?a=1",
            "request_headers": [["X-A", "1"], ["X-A", "2"]],
            "response_headers": "Server: x",
            "error": "",
            "failure": "",
            "duration_ms": 12,
        },
        {
            "delivery_id": second.delivery_id,
            "target_id": second.target_id,
            "attempt": 1,
            "success": False,
            "status_code": None,
            "response_body": "",
            "request_url": "",
            "request_headers": [],
            "response_headers": "",
            "error": "connection refused\nConnectionError: …",
            "failure": "network",
            "duration_ms": 0,
        },
    ]
    assert statuses() == {first.delivery_id: "delivered", second.delivery_id: "retrying"}


def test_a_nul_in_the_receivers_answer_is_written_not_failing_the_batch(entrypoint, make_target):
    """PostgreSQL text cannot hold a NUL; a binary answer must not make its batch
    fail forever (each retry of the write would fail the same way)."""
    from deliveries.engine.attempts import AttemptResult
    from deliveries.engine.claims import load_tasks
    from deliveries.engine.writer import write_results
    from deliveries.targets.base import Outcome

    make_target(url="http://127.0.0.1:9/x", max_retries=3)
    store(entrypoint)
    [task] = load_tasks(Delivery.objects.values_list("id", flat=True))
    outcome = Outcome(success=True, status_code=200, response_body="\x1f\x8b\x00\x00gz")

    assert write_results([AttemptResult(task, outcome, "delivered", None, 3)]) == (
        {task.delivery_id},
        {task.delivery_id},
    )
    assert DeliveryResult.objects.get().response_body == "\x1f\x8b\ufffd\ufffdgz"


# --- the result writer's batches ---------------------------------------------------


class RecordingWriter:
    """A ResultWriter on its own thread whose writes are recorded, not made; a
    result of an ordered target is awaited."""

    def __init__(self, linger, max_batch):
        import threading

        from deliveries.engine.writer import ResultWriter

        outer = self
        self.batches, self.wrote, self.stop = [], threading.Event(), threading.Event()

        class Writer(ResultWriter):
            LINGER, MAX_BATCH = linger, max_batch

            def write(self, batch):
                outer.batches.append(batch)
                outer.wrote.set()

        self.writer = Writer(on_written=None, awaited=lambda item: item.task.target.ordered)
        self.thread = threading.Thread(target=self.writer.run, args=(self.stop,), daemon=True)
        self.thread.start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)
        assert not self.thread.is_alive()


def result(delivery_id, *, ordered=False, target_id=1):
    from types import SimpleNamespace

    from deliveries.engine.attempts import AttemptResult

    task = SimpleNamespace(
        delivery_id=delivery_id, target_id=target_id, target=SimpleNamespace(ordered=ordered)
    )
    return AttemptResult(task, None, "delivered", None, 1)


def test_results_arriving_one_by_one_share_a_batch():
    """A result is not written alone the moment it arrives: at 50 ms a receiver,
    ten workers finish one every 5 ms, and batches of one cost several times as
    much per result. Here only the batch limit can end the gathering."""
    with RecordingWriter(linger=60, max_batch=3) as w:
        items = [result(i) for i in range(3)]
        for item in items[:2]:
            w.writer.submit(item)
            assert not w.wrote.wait(0.05)
        w.writer.submit(items[2])
        assert w.wrote.wait(10)
    assert w.batches == [items]


def test_a_batch_is_written_when_its_gathering_time_is_up():
    with RecordingWriter(linger=0.5, max_batch=100) as w:
        items = [result(1), result(2)]
        for item in items:
            w.writer.submit(item)
        assert w.wrote.wait(10)
    assert w.batches == [items]


def test_a_result_something_waits_for_is_written_at_once():
    """The item `awaited` names ends the gathering, with what gathered before it."""
    with RecordingWriter(linger=60, max_batch=100) as w:
        plain, ordered = result(1), result(2, ordered=True)
        w.writer.submit(plain)
        assert not w.wrote.wait(0.05)
        w.writer.submit(ordered)
        assert w.wrote.wait(10)
        w.wrote.clear()
        alone = result(3, ordered=True)
        w.writer.submit(alone)
        assert w.wrote.wait(10)
    assert w.batches == [[plain, ordered], [alone]]


def test_the_engine_awaits_results_of_ordered_and_of_full_targets(make_target):
    """Their next delivery is claimed only once this one is released, after its
    write: an ordered target's next head, a target at max_queue_size's next row."""
    from deliveries.engine.writer import NotBefore

    engine = make_engine()
    full = make_target().pk
    engine.targets.load([full])
    assert not engine.turns.awaited(result(1, target_id=full))
    assert engine.turns.awaited(result(1, target_id=full, ordered=True))
    engine.targets.note_overflow(full, 100)
    assert engine.turns.awaited(result(1, target_id=full))
    assert not engine.turns.awaited(NotBefore(target_id=full, at=timezone.now()))

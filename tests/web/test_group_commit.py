"""Group commit (webhooker.db.sqlite.group_commit): concurrent inbound events in one process share
one SQLite transaction, each still answered only after its own rows are committed."""

import os
import shutil
import signal
import threading
import uuid
from pathlib import Path

import pytest
import requests
from django.db import (
    DatabaseError,
    IntegrityError,
    OperationalError,
    connection,
    connections,
    transaction,
)

from deliveries.models import Event
from tests.support.processes import children, start_web, wait_until
from webhooker.db.sqlite.group_commit import GroupCommit

pytestmark = pytest.mark.django_db(transaction=True)


def _event(webhook, code):
    return Event.objects.create(webhook=webhook, code=code, method="POST", body=b"{}")


def _in_thread(function, outcomes, key):
    def run():
        try:
            outcomes[key] = function()
        except Exception as exc:
            outcomes[key] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def leading(group, webhook, outcomes):
    """A first caller leading its own group, held open until the returned event is
    set, so that the callers queued meanwhile make the next group together;
    returns (its thread, the event)."""
    release = threading.Event()

    def lead():
        release.wait(10)
        return _event(webhook, uuid.uuid4()).code

    thread = _in_thread(lambda: group.run(lead), outcomes, "lead")
    wait_until(lambda: group.groups == 1, message="leading")
    return thread, release


def queue(group, outcomes, key, store):
    """A caller of group.run on a thread of its own, once it is waiting in line."""
    waiting = len(group._waiting)
    thread = _in_thread(lambda: group.run(store), outcomes, key)
    wait_until(lambda: len(group._waiting) > waiting, message=f"{key} waiting")
    return thread


def test_a_failing_event_fails_its_own_request_only(webhook):
    """A leads alone while B, C and D queue; B leads their group of three, where
    C's insert fails: B and D are stored and committed together, C fails alone."""
    group = GroupCommit()
    release = threading.Event()
    taken = uuid.uuid4()
    _event(webhook, taken)

    def a():
        release.wait(10)
        return _event(webhook, uuid.uuid4()).code

    outcomes = {}
    threads = [_in_thread(lambda: group.run(a), outcomes, "a")]
    wait_until(lambda: group.groups == 1, message="A leading")
    codes = {"b": uuid.uuid4(), "d": uuid.uuid4()}
    threads.append(
        _in_thread(lambda: group.run(lambda: _event(webhook, codes["b"]).code), outcomes, "b")
    )
    wait_until(lambda: len(group._waiting) == 1, message="B waiting")
    threads.append(
        _in_thread(lambda: group.run(lambda: _event(webhook, taken).code), outcomes, "c")
    )
    wait_until(lambda: len(group._waiting) == 2, message="C waiting")
    threads.append(
        _in_thread(lambda: group.run(lambda: _event(webhook, codes["d"]).code), outcomes, "d")
    )
    wait_until(lambda: len(group._waiting) == 3, message="D waiting")
    release.set()
    for thread in threads:
        thread.join(20)

    assert group.groups == 2
    assert isinstance(outcomes["c"], IntegrityError)
    assert outcomes["b"] == codes["b"] and outcomes["d"] == codes["d"]
    assert Event.objects.filter(code__in=[codes["b"], codes["d"]]).count() == 2
    assert Event.objects.count() == 4


def test_a_group_runs_without_savepoints(webhook, monkeypatch):
    """Inside a savepoint SQLite journals every page a statement changes: the
    events of a group, alone or several, run in the transaction itself."""
    wrapper = type(connections["default"])
    real_savepoint, savepoints = wrapper.savepoint, []

    def savepoint(self):
        savepoints.append(threading.current_thread().name)
        return real_savepoint(self)

    monkeypatch.setattr(wrapper, "savepoint", savepoint)
    code = uuid.uuid4()
    assert GroupCommit().run(lambda: _event(webhook, code).code) == code
    group = GroupCommit()
    outcomes = {}
    lead, release = leading(group, webhook, outcomes)
    codes = {key: uuid.uuid4() for key in "ab"}
    threads = [lead] + [
        queue(group, outcomes, key, lambda key=key: _event(webhook, codes[key]).code)
        for key in "ab"
    ]
    release.set()
    for thread in threads:
        thread.join(20)
    assert group.groups == 2
    assert [outcomes[key] for key in "ab"] == [codes[key] for key in "ab"]
    assert savepoints == []


def test_an_event_alone_that_fails_leaves_none_of_its_rows(webhook):
    """Its first statement stored a row, its second failed: the transaction is
    rolled back whole, the caller gets its own error, and the next group works."""
    group = GroupCommit()
    taken, first = uuid.uuid4(), uuid.uuid4()
    _event(webhook, taken)

    def half_stored():
        _event(webhook, first)
        return _event(webhook, taken).code

    with pytest.raises(IntegrityError):
        group.run(half_stored)
    assert not Event.objects.filter(code=first).exists()
    after = uuid.uuid4()
    assert group.run(lambda: _event(webhook, after).code) == after


def test_a_failed_commit_fails_every_event_of_the_group(webhook, monkeypatch):
    """COMMIT itself fails (a full disk): no event of the group is stored, and every
    one of its requests gets the error."""
    group = GroupCommit()
    wrapper = type(connections["default"])
    real_rollback = wrapper._rollback

    def commit_fails(self):
        real_rollback(self)
        raise OperationalError("database or disk is full")

    monkeypatch.setattr(wrapper, "_commit", commit_fails)
    codes = [uuid.uuid4(), uuid.uuid4()]
    outcomes = {}
    release = threading.Event()

    def first():
        release.wait(10)
        return _event(webhook, codes[0]).code

    threads = [_in_thread(lambda: group.run(first), outcomes, "a")]
    wait_until(lambda: group.groups == 1, message="A leading")
    threads.append(
        _in_thread(lambda: group.run(lambda: _event(webhook, codes[1]).code), outcomes, "b")
    )
    wait_until(lambda: len(group._waiting) == 1, message="B waiting")
    release.set()
    for thread in threads:
        thread.join(20)
    monkeypatch.undo()
    assert all(isinstance(outcomes[k], OperationalError) for k in "ab"), outcomes
    assert not Event.objects.filter(code__in=codes).exists()


def test_a_group_rolled_back_without_an_error_fails_every_event(webhook):
    """A job that leaves the transaction unusable (here: the connection lost in it)
    makes Django roll the group back without raising: its neighbours must not be
    answered as stored."""
    group = GroupCommit()
    outcomes = {}

    def lose_connection():
        connection.close()
        return None

    lead, release = leading(group, webhook, outcomes)
    threads = [lead]
    code = uuid.uuid4()
    threads.append(queue(group, outcomes, "a", lambda: _event(webhook, code).code))
    threads.append(queue(group, outcomes, "b", lose_connection))
    release.set()
    for thread in threads:
        thread.join(20)
    assert group.groups == 2
    assert isinstance(outcomes["a"], Exception), outcomes
    assert not Event.objects.filter(code=code).exists()


def test_a_full_disk_mid_group_fails_its_event_as_unavailable_and_stores_the_rest(webhook):
    """SQLite may abandon the whole transaction when the disk fills mid-statement:
    that event gets the database's error (the view's 503), not Django's complaint
    about a broken transaction (a 500), and the rest of its group is stored again
    in a new transaction (here the disk has room again), each event once."""
    group = GroupCommit()
    outcomes = {}

    def disk_fills():
        _event(webhook, uuid.uuid4())
        connection.connection.execute("ROLLBACK")  # as SQLite does on SQLITE_FULL
        raise OperationalError("database or disk is full")

    lead, release = leading(group, webhook, outcomes)
    threads = [lead]
    codes = [uuid.uuid4(), uuid.uuid4()]
    threads.append(queue(group, outcomes, "a", lambda: _event(webhook, codes[0]).code))
    threads.append(queue(group, outcomes, "full", disk_fills))
    threads.append(queue(group, outcomes, "b", lambda: _event(webhook, codes[1]).code))
    release.set()
    for thread in threads:
        thread.join(20)
    assert group.groups == 2
    assert isinstance(outcomes["full"], OperationalError), outcomes
    assert [outcomes["a"], outcomes["b"]] == codes
    assert Event.objects.filter(code__in=codes).count() == 2
    assert Event.objects.count() == 3  # the leader's, a's and b's


def test_a_group_whose_every_event_fails_ends_with_each_ones_error(webhook):
    """Each round leaves the failing event out; when none is left, every caller
    has its own error and nothing is stored."""
    group = GroupCommit()
    outcomes = {}
    taken = uuid.uuid4()
    _event(webhook, taken)

    def clash(key):
        def store():
            _event(webhook, uuid.uuid4())
            if key == "b":
                raise ValueError("b's own failure")
            return _event(webhook, taken).code

        return store

    lead, release = leading(group, webhook, outcomes)
    threads = [lead] + [queue(group, outcomes, key, clash(key)) for key in "abc"]
    release.set()
    for thread in threads:
        thread.join(20)
    assert isinstance(outcomes["a"], IntegrityError) and isinstance(outcomes["c"], IntegrityError)
    assert isinstance(outcomes["b"], ValueError), outcomes
    assert Event.objects.count() == 2  # the first event and the leader's


def test_events_arriving_while_the_leader_waits_for_the_writer_join_its_group(webhook, monkeypatch):
    """Another writer (another web worker, the engine) holds SQLite's writer lock; the
    leader waits for it at BEGIN, and B and C arrive meanwhile: all three are stored
    in the leader's one transaction, not A alone and then B and C in a second."""
    if connection.vendor != "sqlite":
        pytest.skip("only SQLite's BEGIN waits for a writer lock")
    group = GroupCommit()
    codes = {key: uuid.uuid4() for key in "abc"}
    connected, holding, release = threading.Event(), threading.Event(), threading.Event()

    def store(key):
        return lambda: _event(webhook, codes[key]).code

    def lead():
        # Connected before the other writer holds the lock: connecting would wait.
        connection.ensure_connection()
        connected.set()
        holding.wait(10)
        return group.run(store("a"))

    def other_writer():
        connected.wait(10)
        with transaction.atomic():
            _event(webhook, uuid.uuid4())
            holding.set()
            release.wait(10)

    wrapper = type(connections["default"])
    real_take_writer, leader_waits = wrapper._take_writer, threading.Event()

    def take_writer(self):
        if holding.is_set():
            leader_waits.set()
        real_take_writer(self)

    monkeypatch.setattr(wrapper, "_take_writer", take_writer)
    outcomes = {}
    threads = [_in_thread(lead, outcomes, "a"), _in_thread(other_writer, outcomes, "other")]
    assert leader_waits.wait(10)
    threads.append(queue(group, outcomes, "b", store("b")))
    threads.append(queue(group, outcomes, "c", store("c")))
    release.set()
    for thread in threads:
        thread.join(20)
    assert [outcomes[key] for key in "abc"] == [codes[key] for key in "abc"], outcomes
    assert group.groups == 1
    assert Event.objects.filter(code__in=codes.values()).count() == 3


@pytest.mark.e2e
def test_kill_9_during_group_commits_loses_no_acknowledged_event(entrypoint, data_dir):
    """Sixteen senders post as fast as they are answered to one worker whose
    threads group their commits; the worker is killed with SIGKILL mid-stream.
    Every event a sender got a 200 for is in the database."""
    if connection.vendor != "sqlite":
        pytest.skip("group commit is SQLite's (PostgreSQL stores each event in one statement)")
    web, base = start_web(data_dir, workers=1)
    url = f"{base}/webhook/{entrypoint.code}"
    acknowledged, stop = [], threading.Event()

    def sender():
        with requests.Session() as session:
            while not stop.is_set():
                try:
                    response = session.post(url, data=b'{"n": 1}', timeout=5)
                except requests.RequestException:
                    continue
                if response.status_code == 200:
                    acknowledged.append(response.json()["event"])

    senders = [threading.Thread(target=sender) for _ in range(16)]
    try:
        for thread in senders:
            thread.start()
        wait_until(lambda: len(acknowledged) >= 300, timeout=60, message="events acknowledged")
        workers = children(web.pid)
        assert workers
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        # The senders go on against the workers gunicorn starts in their place.
        before = len(acknowledged)
        wait_until(lambda: len(acknowledged) >= before + 50, timeout=60, message="new workers")
        stop.set()
        for thread in senders:
            thread.join(20)
    finally:
        stop.set()
        web.stop()
    # The file itself is sound: one CI run found it "malformed" here, once, and its
    # evidence was gone by the time it was looked at. A failure keeps the database
    # and the server's log where `make test` leaves its data (.pytest-data).
    try:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA integrity_check")
            checked = [row[0] for row in cursor.fetchall()]
    except DatabaseError as exc:  # "database disk image is malformed"
        checked = [str(exc)]
    if checked != ["ok"]:
        kept = _keep_evidence(web.log_path)
        pytest.fail(f"the database failed its integrity check: {checked[:5]}; kept in {kept}")
    stored = set(Event.objects.values_list("code", flat=True))
    lost = [code for code in acknowledged if uuid.UUID(code) not in stored]
    assert not lost, f"{len(lost)} of {len(acknowledged)} acknowledged events lost"


def _keep_evidence(log_path) -> Path:
    """Copies of the database's files and of the server's log, for a post-mortem."""
    name = Path(connection.settings_dict["NAME"])
    # Closed first: closing a copied file would drop the locks of its connection.
    connections.close_all()
    kept = Path(os.environ.get("DATA_DIR", name.parent)) / f"evidence-{uuid.uuid4().hex[:8]}"
    kept.mkdir(parents=True)
    for path in [log_path, *name.parent.glob(name.name + "*")]:
        if path.is_file():
            shutil.copy2(path, kept / path.name)
    return kept

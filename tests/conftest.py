import fcntl
import importlib
import os
import socket
import tempfile
from pathlib import Path

import pytest
import trustme
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db import connections

from deliveries import ssrf, tracing
from deliveries.models import Target, Webhook
from tests.support import egress
from tests.support.database import file_locked_by_this_process
from tests.support.keys import KEY_A
from tests.support.sink import Sink

# Tracing only where a test turns it on (tests/web/test_tracing.py), here or in the
# processes tests start, whatever OTEL_* variables the machine has.
for _name in tracing.CONFIGURED_BY:
    os.environ.pop(_name, None)


SERIAL_HOME = Path(__file__).parent / "e2e"


def pytest_collection_modifyitems(items):
    """The tests that start real processes (marked e2e) first: some take minutes,
    and one handed out last would keep a worker busy long after the others had
    finished (pytest-xdist hands tests out in this order; make test lets an idle
    worker take the rest of another's share).

    Before them, the tests that take turns (marked engines, engines_take_turns):
    at the head of one worker's share they run one after another on that worker,
    since an idle worker takes from the tail of another's share (from them only
    once all behind them is taken). Handed out further down, they were spread over
    the workers, and a worker that took one sat idle in the turn's lock: 3.6 of a
    PostgreSQL run's 22 worker-minutes.

    A test marked serial must live in tests/e2e: make test's serial run collects
    that folder alone."""
    strays = [
        item.nodeid
        for item in items
        if item.get_closest_marker("serial") and SERIAL_HOME not in item.path.parents
    ]
    if strays:
        raise pytest.UsageError(f"marked serial outside tests/e2e: {', '.join(strays)}")
    items.sort(
        key=lambda item: (
            item.get_closest_marker("engines") is None,
            item.get_closest_marker("e2e") is None,
        )
    )


@pytest.fixture(autouse=True)
def engines_take_turns(request):
    """Tests marked `engines` start several engines (and the benchmarks' a web side
    besides) on the test PostgreSQL server, each engine holding a connection per
    thread that uses the database. Two of them at once on parallel workers passed the
    server's max_connections (100: "too many clients"), so they take turns across the
    workers, on a lock beside the run's data."""
    if request.node.get_closest_marker("engines") is None:
        yield
        return
    lock = Path(os.environ.get("DATA_DIR") or tempfile.gettempdir()) / "engines.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # released when closed
        yield


@pytest.fixture(autouse=True)
def sqlite_keeps_its_locks():
    """After each test, this process still holds its SQLite connection's lock on the
    database file: a test that opened the file itself (to read or copy it) would have
    dropped it, and a server process closing its connection later would then delete
    the WAL under this one (tests.support.database.sqlite_file_bytes reads it safely)."""
    yield
    connection = connections["default"]
    if connection.vendor != "sqlite" or connection.connection is None:
        return
    path = connection.settings_dict["NAME"]
    # A read first: a connection holds its lock from its first read on, and SQLite
    # takes it then only if it believes it does not hold it already.
    try:
        connection.connection.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
    except connection.Database.Error:  # a connection the test left closed or broken
        return
    if os.path.exists(path) and not file_locked_by_this_process(path):
        connection.close()  # the next test's connection takes the lock again
        pytest.fail(
            f"this process no longer holds SQLite's lock on {path}: the test opened and "
            "closed the database file with a connection open "
            "(use tests.support.database.sqlite_file_bytes)"
        )


@pytest.fixture(scope="session", autouse=True)
def no_tracing():
    tracing.stop()


# Names the tests use, resolved without a network (this machine has none).
FAKE_DNS = {
    "example.com": ["93.184.215.14"],
    "hooks.example.com": ["93.184.215.14"],
    "hooks.slack.com": ["3.33.152.147"],
}


@pytest.fixture(autouse=True)
def dns(monkeypatch):
    """A resolver tests can program: name -> addresses (others resolve for real)."""
    table = dict(FAKE_DNS)
    real = ssrf.resolve

    def resolve(host, port):
        if host in table:
            answer = table[host]
            return answer() if callable(answer) else list(answer)
        if host.endswith(".test"):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, port)

    monkeypatch.setattr(ssrf, "resolve", resolve)
    return table


@pytest.fixture
def full_listener():
    """The port of a listener whose accept queue is full: the kernel drops further
    SYNs, and a connect hangs."""
    server = socket.create_server(("127.0.0.1", 0), backlog=0)
    waiting = []
    for _ in range(3):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(server.getsockname())
        waiting.append(sock)
    yield server.getsockname()[1]
    for sock in waiting:
        sock.close()
    server.close()


@pytest.fixture(scope="session", autouse=True)
def static_root():
    """What `collectstatic` makes before `make run` or a deployment serves: without
    it, whitenoise warns (rightly, for a deployment) on every test client."""
    django_settings.STATIC_ROOT.mkdir(parents=True, exist_ok=True)


@pytest.fixture(autouse=True)
def allow_loopback_targets(settings):
    """The test receivers listen on 127.0.0.1, which is refused by default."""
    settings.WEBHOOKER_ALLOWED_TARGET_NETWORKS = ["127.0.0.0/8"]
    # Logins in tests need not cost half a second of PBKDF2 each.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def user(db):
    return get_user_model().objects.create_user("owner", password="pw-owner-123!")


@pytest.fixture
def superuser(db):
    return get_user_model().objects.create_superuser("root", password="pw-root-12345!")


def staff_user(name):
    """A staff user in the group the admin's permissions are given to."""
    user = get_user_model().objects.create_user(name, password=f"pw-{name}-12345!", is_staff=True)
    user.groups.add(webhook_users())
    return user


def webhook_users():
    """The group migrations 0002, 0005 and 0024 make, made again as they make it when a
    transactional test before this one flushed the tables (the flush runs
    post_migrate, which makes the permissions again, but not the migrations' rows)."""
    group, made = Group.objects.get_or_create(name="Webhook users")
    if made:
        granted = importlib.import_module("deliveries.migrations.0002_webhook_users_group")
        codenames = [
            f"{a}_{model}" for model, actions in granted.PERMISSIONS.items() for a in actions
        ]
        codenames += [
            f"{a}_{model}"
            for model in ("apikey", "replayjob")  # 0005, 0024
            for a in ("add", "change", "delete", "view")
        ]
        group.permissions.set(
            Permission.objects.filter(content_type__app_label="deliveries", codename__in=codenames)
        )
    return group


@pytest.fixture
def alice(db):
    return staff_user("alice")


@pytest.fixture
def bob(db):
    return staff_user("bob")


@pytest.fixture
def webhook(user):
    hook = Webhook.objects.create(name="orders", owner=user)
    hook.ensure_entrypoint()
    return hook


@pytest.fixture
def entrypoint(webhook):
    return webhook.entrypoints.get()


@pytest.fixture
def make_target(webhook):
    def make(type_=Target.Type.HTTP, *, url=None, hook=None, **fields):
        config = fields.pop("config", None)
        # Fire-and-forget unless a test asks for retries: most tests count attempts,
        # and a receiver scripted to fail would otherwise be retried (the model's
        # default is 5).
        fields.setdefault("max_retries", 0)
        if config is None:
            config = {"url": url} if type_ == Target.Type.HTTP else {}
        return Target.objects.create(
            webhook=hook or webhook,
            name=fields.pop("name", f"{type_}-target"),
            type=type_,
            config=config,
            **fields,
        )

    return make


@pytest.fixture
def sink():
    server = Sink().start()
    yield server
    server.stop()


@pytest.fixture
def servers():
    """Local HTTP(S) servers a test starts: start(handler, configure=None)."""
    yield from egress.local_servers()


@pytest.fixture
def proxy(servers):
    """A local forward proxy recording what it forwarded: (port, forwarded)."""
    return egress.forward_proxy(servers)


@pytest.fixture
def keys(settings):
    """keys(*keys) sets the encryption keys in force; KEY_A alone to begin with."""

    def use(*keys):
        settings.ENCRYPTION_KEYS = list(keys)

    use(KEY_A)
    return use


@pytest.fixture
def ca():
    """A test certificate authority (trustme)."""
    return trustme.CA()


@pytest.fixture(scope="session", autouse=True)
def worker_data_dir(worker_id):
    """Under pytest-xdist each worker keeps its engines' wake socket and lock apart
    (pytest-django gives each worker's test database a suffix of its own)."""
    if worker_id != "master":
        path = django_settings.DATA_DIR / worker_id
        path.mkdir(parents=True, exist_ok=True)
        django_settings.DATA_DIR = path


@pytest.fixture
def data_dir(tmp_path):
    """A DATA_DIR for the processes a test starts (lock, socket, logs)."""
    path = tmp_path / "data"
    path.mkdir()
    return path
